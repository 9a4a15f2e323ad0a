// The baseline every benchmark shows: the seed's per-(token, head) kernel, kept as it was meant.
//
// One CTA per (sequence, query head); one thread per output element d. Every thread computes the
// *whole* dot product q . k_t itself (head_size multiply-adds, all threads of the CTA reading the
// same K row), in three passes over the context: the max, the sum of exponentials, then the
// weighted sum of V. K is read twice more than needed and every score is computed
// head_size * 3 times. It is correct, and it is what "no thought given to the GPU" costs.
#include "decode_common.cuh"

// grid (num_seqs, num_q_heads), block (HEAD_SIZE)
extern "C" __global__ void paged_decode_naive(
    scalar_t* __restrict__ out,                // [num_seqs, num_q_heads, head_size]
    const scalar_t* __restrict__ query,        // [num_seqs, num_q_heads, head_size]
    const scalar_t* __restrict__ key_cache,    // [num_blocks, num_kv_heads, block_size, head_size]
    const scalar_t* __restrict__ value_cache,  // [num_blocks, num_kv_heads, block_size, head_size]
    const int* __restrict__ block_tables,      // [num_seqs, max_blocks_per_seq]
    const int* __restrict__ context_lens,      // [num_seqs]
    const int max_blocks_per_seq, const int num_kv_heads, const float scale) {
  const int seq = blockIdx.x;
  const int head = blockIdx.y;
  const int num_q_heads = gridDim.y;  // the grid's y extent *is* the query-head count here
  const int kv_head = head / (num_q_heads / num_kv_heads);
  const int d = threadIdx.x;
  const int len = context_lens[seq];
  const int* table = block_tables + (long long)seq * max_blocks_per_seq;
  const scalar_t* q = query + ((long long)seq * num_q_heads + head) * HEAD_SIZE;

  // Pass 1: the max score.
  float m = neg_inf();
  for (int t = 0; t < len; ++t) {
    const scalar_t* k = key_cache + kv_offset(table[t / BLOCK_SIZE], num_kv_heads, kv_head,
                                              t % BLOCK_SIZE, 0);
    float s = 0.f;
    for (int e = 0; e < HEAD_SIZE; ++e) s += to_float(q[e]) * to_float(k[e]);
    m = fmaxf(m, s * scale);
  }
  // Pass 2: the softmax denominator (every score computed again).
  float l = 0.f;
  for (int t = 0; t < len; ++t) {
    const scalar_t* k = key_cache + kv_offset(table[t / BLOCK_SIZE], num_kv_heads, kv_head,
                                              t % BLOCK_SIZE, 0);
    float s = 0.f;
    for (int e = 0; e < HEAD_SIZE; ++e) s += to_float(q[e]) * to_float(k[e]);
    l += expf(s * scale - m);
  }
  // Pass 3: the weighted sum of V for this thread's element (and every score a third time).
  float acc = 0.f;
  for (int t = 0; t < len; ++t) {
    const long long row = kv_offset(table[t / BLOCK_SIZE], num_kv_heads, kv_head,
                                    t % BLOCK_SIZE, 0);
    float s = 0.f;
    for (int e = 0; e < HEAD_SIZE; ++e) s += to_float(q[e]) * to_float(key_cache[row + e]);
    acc += expf(s * scale - m) * to_float(value_cache[row + d]);
  }
  // A sequence with no keys outputs exactly 0 (the Lab 3 contract), not 0/0.
  from_float(out + ((long long)seq * num_q_heads + head) * HEAD_SIZE + d, len > 0 ? acc / l : 0.f);
}
