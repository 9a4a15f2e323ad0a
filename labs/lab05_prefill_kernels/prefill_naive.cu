// Lab 5.3 — the naive paged prefill kernel (the seed's design, done right).
//
// Grid (num_tokens, num_q_heads): one CTA per (query token, query head). Block: head_size
// threads, thread d owns output element d. Each CTA
//   1. finds its sequence by binary search over cu_seqlens_q,
//   2. derives its causal limit from the history (context_len - query_len),
//   3. makes three passes over the keys it may see: the max score, the softmax denominator,
//      then the weighted sum of values.
// Every warp computes each score on its own (lane i sums dims i, i+32, ...; a shuffle adds the
// lanes), so no __syncthreads() is needed inside the key loop: the four warps of a 128-wide
// head compute the same score, and thread d uses it for its own V element.
//
// What makes it slow (the lesson of Lab 5.4): every CTA reads every key it sees from global
// memory three times, and the CTAs of neighbouring tokens re-read the same keys again.
#include "prefill_common.cuh"

namespace pagedlab {

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <typename T>
__device__ void prefill_naive(T* __restrict__ out,                // [num_tokens, num_q_heads, head_size]
                              const T* __restrict__ query,        // [num_tokens, num_q_heads, head_size]
                              const T* __restrict__ key_cache,    // [num_blocks, num_kv_heads, block_size, head_size]
                              const T* __restrict__ value_cache,  // [num_blocks, num_kv_heads, block_size, head_size]
                              const int* __restrict__ block_tables,  // [num_seqs, max_blocks_per_seq]
                              const int* __restrict__ cu_seqlens_q,  // [num_seqs + 1]
                              const int* __restrict__ context_lens,  // [num_seqs]
                              const float* __restrict__ alibi_slopes,  // [num_q_heads] or nullptr
                              float scale, int num_seqs, int num_q_heads, int num_kv_heads,
                              int block_size, int max_blocks_per_seq, int causal) {
  // TODO(lab5.3): one CTA per (query token = blockIdx.x, query head = blockIdx.y), thread d
  // owns output element d (blockDim.x == head_size).
  //   1. seq = find_seq(...); q_start, q_len, kv_len; the query's position is
  //      q_pos = kv_len - q_len + (token - q_start); causal: it sees keys 0 .. q_pos, else all.
  //   2. kv_head = head / (num_q_heads / num_kv_heads); slope = alibi_slopes ? ... : 0.
  //   3. q * scale into q_smem (extern shared, head_size floats); __syncthreads().
  //   4. score(t) = q . k_t (k_t found through the block table: kv_offset) + slope * (t - q_pos);
  //      every warp can compute it alone (lane i takes dims i, i + 32, ...; warp_sum).
  //   5. three passes over t: max m; l = sum exp(score - m); acc = sum exp(score - m) * v_t[d].
  //   6. out = acc / l (0 when no key is visible), converted with from_float<T>.
}

}  // namespace pagedlab

#define PAGEDLAB_NAIVE(NAME, T)                                                                  \
  extern "C" __global__ void NAME(T* out, const T* query, const T* key_cache, const T* value_cache, \
                                  const int* block_tables, const int* cu_seqlens_q,              \
                                  const int* context_lens, const float* alibi_slopes, float scale, \
                                  int num_seqs, int num_q_heads, int num_kv_heads, int block_size, \
                                  int max_blocks_per_seq, int causal) {                          \
    pagedlab::prefill_naive<T>(out, query, key_cache, value_cache, block_tables, cu_seqlens_q,   \
                               context_lens, alibi_slopes, scale, num_seqs, num_q_heads,         \
                               num_kv_heads, block_size, max_blocks_per_seq, causal);            \
  }

PAGEDLAB_NAIVE(prefill_naive_f32, float)
PAGEDLAB_NAIVE(prefill_naive_f16, __half)
PAGEDLAB_NAIVE(prefill_naive_bf16, __nv_bfloat16)
