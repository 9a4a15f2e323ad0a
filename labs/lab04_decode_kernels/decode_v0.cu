// v0 — Task 4.0, the bug hunt. This is the seed's decode kernel, rewritten small: it compiles,
// it runs, and it is wrong. It has FIVE bugs, each one a classic (see the handout). Find them
// with the tests of test_lab04_bug_hunt.py and racecheck, fix them here, then delete the
// `raise NotImplementedError("TODO(lab4.0) ...")` line of paged_attention_v0 in starter.py.
//
// One CTA per (sequence, query head), two passes: every thread scores whole tokens (its own
// q . k_t) into a shared-memory array as long as the context, the CTA reduces max and sum, then
// each thread sums p_t * v_t for its output elements.
#include "decode_common.cuh"

#define NUM_THREADS 128
#define NUM_WARPS (NUM_THREADS / WARP_SIZE)

// Max over the CTA. `red` holds NUM_WARPS floats; the trailing barrier lets the caller reuse it.
__device__ float block_max(float v, float* red) {
  v = group_max<WARP_SIZE>(v);
  if (threadIdx.x % WARP_SIZE == 0) red[threadIdx.x / WARP_SIZE] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < NUM_WARPS; ++w) r = fmaxf(r, red[w]);
  __syncthreads();
  return r;
}

__device__ float block_sum(float v, float* red) {
  v = group_sum<WARP_SIZE>(v);
  if (threadIdx.x == 0) red[0] = 0.f;
  if (threadIdx.x % WARP_SIZE == 0) red[0] += v;
  __syncthreads();
  float r = red[0];
  __syncthreads();
  return r;
}

// grid (num_seqs, num_q_heads), block (NUM_THREADS),
// dynamic shared memory (HEAD_SIZE + NUM_WARPS + max_blocks_per_seq * BLOCK_SIZE) floats
extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_decode_v0(
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
  const int num_q_per_kv = blockDim.y / num_kv_heads;
  const int kv_head = head / num_q_per_kv;
  const int len = context_lens[seq];
  if (len == 0) return;  // nothing to attend to
  const int* table = block_tables + (long long)seq * gridDim.y;

  extern __shared__ float q_s[];      // [HEAD_SIZE]
  extern __shared__ float red[];      // [NUM_WARPS]
  extern __shared__ float scores[];   // [max_blocks_per_seq * BLOCK_SIZE]

  for (int e = threadIdx.x; e < HEAD_SIZE; e += NUM_THREADS)
    q_s[e] = to_float(query[((long long)seq * num_q_heads + head) * HEAD_SIZE + e]) * scale;
  __syncthreads();

  // Pass 1: a thread per token computes the token's whole score.
  float m = neg_inf();
  for (int t = threadIdx.x; t < len; t += NUM_THREADS) {
    const scalar_t* k = key_cache + kv_offset(table[t / BLOCK_SIZE], num_kv_heads, kv_head,
                                              t % BLOCK_SIZE, 0);
    float s = 0.f;
    for (int e = 0; e < HEAD_SIZE; ++e) s += q_s[e] * to_float(k[e]);
    scores[t] = s;
    m = fmaxf(m, s);
  }
  m = block_max(m, red);

  float l = 0.f;
  for (int t = threadIdx.x; t < len; t += NUM_THREADS) {
    const float p = expf(scores[t] - m);
    scores[t] = p;
    l += p;
  }
  l = block_sum(l, red);

  // Pass 2: a thread per output element.
  for (int d = threadIdx.x; d < HEAD_SIZE; d += NUM_THREADS) {
    float acc = 0.f;
    for (int t = 0; t < len; ++t) {
      acc += scores[t] * to_float(value_cache[kv_offset(table[t / BLOCK_SIZE], num_kv_heads,
                                                        kv_head, t % BLOCK_SIZE, d)]);
    }
    from_float(out + ((long long)seq * num_q_heads + head) * HEAD_SIZE + d, acc / l);
  }
}
