// v1 — one pass with the online softmax (Task 4.1).
//
// One CTA per (sequence, query head), NUM_WARPS warps. Warp w takes tokens w, w + NUM_WARPS, ...
// A token's K row is split over the 32 lanes (EPL = HEAD_SIZE / 32 contiguous elements each, so
// one warp-wide load reads the row once, coalesced); a butterfly of shuffles sums the 32 partial
// dot products. Each warp keeps its own running (max m, sum l, acc[]) and folds every token in:
//     m' = max(m, s);  l = l * 2^(m - m') + 2^(s - m');  acc = acc * 2^(m - m') + 2^(s - m') v
// At the end the warps' states are merged through shared memory with the same rule. The scores
// never touch memory, the context length is unbounded, and K and V are each read once.
#include "decode_common.cuh"

#define NUM_WARPS 4
#define NUM_THREADS (NUM_WARPS * WARP_SIZE)
#define EPL (HEAD_SIZE / WARP_SIZE)  // elements per lane: 2, 4 or 8

// grid (num_seqs, num_q_heads), block (NUM_THREADS)
extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_decode_v1(
    scalar_t* __restrict__ out,                // [num_seqs, num_q_heads, head_size]
    const scalar_t* __restrict__ query,        // [num_seqs, num_q_heads, head_size]
    const scalar_t* __restrict__ key_cache,    // [num_blocks, num_kv_heads, block_size, head_size]
    const scalar_t* __restrict__ value_cache,  // [num_blocks, num_kv_heads, block_size, head_size]
    const int* __restrict__ block_tables,      // [num_seqs, max_blocks_per_seq]
    const int* __restrict__ context_lens,      // [num_seqs]
    const int max_blocks_per_seq, const int num_kv_heads, const float scale) {
  const int seq = blockIdx.x;
  const int head = blockIdx.y;
  const int num_q_heads = gridDim.y;
  const int kv_head = head / (num_q_heads / num_kv_heads);
  const int warp = threadIdx.x / WARP_SIZE;
  const int lane = threadIdx.x % WARP_SIZE;
  const int len = context_lens[seq];
  const int* table = block_tables + (long long)seq * max_blocks_per_seq;

  float q[EPL];
  load_vec<EPL>(query + ((long long)seq * num_q_heads + head) * HEAD_SIZE + lane * EPL, q);
#pragma unroll
  for (int e = 0; e < EPL; ++e) q[e] *= scale * LOG2E;

  float m = neg_inf(), l = 0.f, acc[EPL];
#pragma unroll
  for (int e = 0; e < EPL; ++e) acc[e] = 0.f;

  for (int t = warp; t < len; t += NUM_WARPS) {
    const long long row = kv_offset(table[t / BLOCK_SIZE], num_kv_heads, kv_head,
                                    t % BLOCK_SIZE, lane * EPL);
    float k[EPL], v[EPL];
    load_vec<EPL>(key_cache + row, k);
    load_vec<EPL>(value_cache + row, v);
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) s += q[e] * k[e];
    s = group_sum<WARP_SIZE>(s);  // every lane now holds the token's full score
    const float m_new = fmaxf(m, s);
    const float alpha = exp2f(m - m_new);  // m = -inf on the first token: alpha = 0
    const float p = exp2f(s - m_new);
    l = l * alpha + p;
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[e] = acc[e] * alpha + p * v[e];
    m = m_new;
  }

  // Merge the warps' (m, l, acc) states.
  __shared__ float s_m[NUM_WARPS], s_l[NUM_WARPS];
  __shared__ float s_acc[NUM_WARPS][HEAD_SIZE];
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < EPL; ++e) s_acc[warp][lane * EPL + e] = acc[e];
  __syncthreads();

  float m_all = neg_inf();
#pragma unroll
  for (int w = 0; w < NUM_WARPS; ++w) m_all = fmaxf(m_all, s_m[w]);
  float l_all = 0.f;
#pragma unroll
  for (int w = 0; w < NUM_WARPS; ++w) l_all += s_l[w] * rescale(s_m[w], m_all);
  for (int d = threadIdx.x; d < HEAD_SIZE; d += NUM_THREADS) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) o += s_acc[w][d] * rescale(s_m[w], m_all);
    // l_all == 0 only when the sequence is empty: the contract says output exactly 0.
    from_float(out + ((long long)seq * num_q_heads + head) * HEAD_SIZE + d,
               l_all > 0.f ? o / l_all : 0.f);
  }
}
