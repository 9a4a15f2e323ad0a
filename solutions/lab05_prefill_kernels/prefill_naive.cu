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
  extern __shared__ float q_smem[];  // [head_size]: this token's query, pre-multiplied by scale
  const int token = blockIdx.x;
  const int head = blockIdx.y;
  const int d = threadIdx.x;
  const int head_size = blockDim.x;
  const int lane = d & 31;

  const int seq = find_seq(cu_seqlens_q, num_seqs, token);
  const int q_start = cu_seqlens_q[seq];
  const int q_len = cu_seqlens_q[seq + 1] - q_start;
  const int kv_len = context_lens[seq];
  // The new tokens are the last q_len of the sequence's kv_len: query i sits at position
  // history + i and, under causal masking, sees keys 0 .. history + i.
  const int q_pos = kv_len - q_len + (token - q_start);
  const int last_key = causal ? q_pos : kv_len - 1;
  const int kv_head = head / (num_q_heads / num_kv_heads);
  const float slope = alibi_slopes ? alibi_slopes[head] : 0.0f;
  const int* block_table = block_tables + (long long)seq * max_blocks_per_seq;

  const long long row = ((long long)token * num_q_heads + head) * head_size;
  q_smem[d] = to_float(query[row + d]) * scale;
  __syncthreads();

  // score(t) = scale * q . k_t + slope * (t - q_pos), identical in every lane of every warp.
  auto score = [&](int t) {
    const T* k = key_cache + kv_offset(block_table, t, kv_head, num_kv_heads, block_size, head_size);
    float acc = 0.0f;
    for (int i = lane; i < head_size; i += 32) acc += q_smem[i] * to_float(k[i]);
    return warp_sum(acc) + slope * (float)(t - q_pos);
  };

  float m = -INFINITY;  // pass 1: the largest score
  for (int t = 0; t <= last_key; ++t) m = fmaxf(m, score(t));
  float l = 0.0f;  // pass 2: the softmax denominator
  for (int t = 0; t <= last_key; ++t) l += expf(score(t) - m);
  float acc = 0.0f;  // pass 3: the weighted sum of values, element d
  for (int t = 0; t <= last_key; ++t) {
    const T* v = value_cache + kv_offset(block_table, t, kv_head, num_kv_heads, block_size, head_size);
    acc += expf(score(t) - m) * to_float(v[d]);
  }
  // NOTE: no epsilon in the denominator (the seed added 1e-6): l >= 1 whenever a key is visible,
  // and a row that sees no key (possible only without causal masking and context 0) writes 0.
  out[row + d] = from_float<T>(last_key >= 0 ? acc / l : 0.0f);
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
