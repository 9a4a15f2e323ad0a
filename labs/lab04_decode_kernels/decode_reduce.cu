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
  // TODO(lab4.3): merge the partitions of (seq = blockIdx.x, head = blockIdx.y).
  //  Only the first n = ceil(context_len / partition_size) partitions hold a state. With
  //  M = max m_p: out = sum 2^(m_p - M) acc_p / sum 2^(m_p - M) l_p (0 when n == 0);
  //  lse (if not null) = (M + log2 L) * LN2, or -inf. Lane i owns elements i*EPL .. i*EPL+EPL-1.
}
