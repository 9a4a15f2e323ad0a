// The split-K merge (Task 4.3), shared by v3 and v4: partial states -> final output.
//
// Partition p of a (sequence, head) left m_p (its max score, log2 domain), l_p = sum 2^(s - m_p)
// and acc_p = sum 2^(s - m_p) v over its tokens. On the common scale M = max_p m_p:
//     out = sum_p 2^(m_p - M) acc_p / sum_p 2^(m_p - M) l_p,     lse = (M + log2 L) * ln 2
// Forgetting the factors 2^(m_p - M) adds partials that live on different scales.
#include "decode_common.cuh"

#define EPL (HEAD_SIZE / WARP_SIZE)

// grid (num_seqs, num_q_heads), block (WARP_SIZE): one warp, EPL output elements per lane
extern "C" __global__ void __launch_bounds__(WARP_SIZE) paged_decode_reduce(
    scalar_t* __restrict__ out,            // [num_seqs, num_q_heads, head_size]
    float* __restrict__ lse,               // [num_seqs, num_q_heads] or null; natural log
    const float* __restrict__ part_m,      // [num_seqs, num_q_heads, num_partitions]
    const float* __restrict__ part_l,      // [num_seqs, num_q_heads, num_partitions]
    const float* __restrict__ part_acc,    // [num_seqs, num_q_heads, num_partitions, head_size]
    const int* __restrict__ context_lens,  // [num_seqs]
    const int num_partitions, const int partition_size) {
  const int seq = blockIdx.x;
  const int num_q_heads = gridDim.y;
  const long long sh = (long long)seq * num_q_heads + blockIdx.y;
  const int lane = threadIdx.x;
  const int len = context_lens[seq];
  // Only partitions that hold tokens wrote a state (an empty sequence has none: output 0).
  const int n = min((len + partition_size - 1) / partition_size, num_partitions);
  const float* m = part_m + sh * num_partitions;
  const float* l = part_l + sh * num_partitions;

  float m_all = neg_inf();
  for (int p = 0; p < n; ++p) m_all = fmaxf(m_all, m[p]);
  float l_all = 0.f, o[EPL];
#pragma unroll
  for (int e = 0; e < EPL; ++e) o[e] = 0.f;
  for (int p = 0; p < n; ++p) {
    const float f = exp2f(m[p] - m_all);  // every stored partition has a finite m_p
    l_all += f * l[p];
    const float* acc = part_acc + (sh * num_partitions + p) * HEAD_SIZE + lane * EPL;
#pragma unroll
    for (int e = 0; e < EPL; ++e) o[e] += f * acc[e];
  }
#pragma unroll
  for (int e = 0; e < EPL; ++e)
    from_float(out + sh * HEAD_SIZE + lane * EPL + e, l_all > 0.f ? o[e] / l_all : 0.f);
  if (lse != nullptr && lane == 0) lse[sh] = l_all > 0.f ? (m_all + log2f(l_all)) * LN2 : neg_inf();
}
