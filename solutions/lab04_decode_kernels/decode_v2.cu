// v2 — GQA-aware (Task 4.2): one CTA per (sequence, group of query heads sharing a KV head).
//
// v1 gives every query head its own CTA, so with 32 query heads over 8 KV heads each K/V row is
// fetched by 4 CTAs: 4x the bytes a decode step really needs. Here one CTA serves HEADS_PER_CTA
// query heads of one KV head: it loads each K/V row once and scores it against all of them
// (queries in registers). The loop is v1's; each head keeps its own (m, l, acc).
//
// HEADS_PER_CTA divides the group size (num_q_heads / num_kv_heads); the loader picks the
// largest divisor <= 8, so a group of 32 uses 4 CTAs of 8 heads, each still sharing its loads.
#include "decode_common.cuh"

#ifndef HEADS_PER_CTA
#define HEADS_PER_CTA 4
#endif
#define NUM_WARPS 4
#define NUM_THREADS (NUM_WARPS * WARP_SIZE)
#define EPL (HEAD_SIZE / WARP_SIZE)

// grid (num_seqs, num_q_heads / HEADS_PER_CTA), block (NUM_THREADS)
extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_decode_v2(
    scalar_t* __restrict__ out,                // [num_seqs, num_q_heads, head_size]
    const scalar_t* __restrict__ query,        // [num_seqs, num_q_heads, head_size]
    const scalar_t* __restrict__ key_cache,    // [num_blocks, num_kv_heads, block_size, head_size]
    const scalar_t* __restrict__ value_cache,  // [num_blocks, num_kv_heads, block_size, head_size]
    const int* __restrict__ block_tables,      // [num_seqs, max_blocks_per_seq]
    const int* __restrict__ context_lens,      // [num_seqs]
    const int max_blocks_per_seq, const int num_kv_heads, const int group, const float scale) {
  const int seq = blockIdx.x;
  const int q_head0 = blockIdx.y * HEADS_PER_CTA;  // first of this CTA's query heads
  const int num_q_heads = gridDim.y * HEADS_PER_CTA;
  const int kv_head = q_head0 / group;  // GQA: query head h reads KV head h / group
  const int warp = threadIdx.x / WARP_SIZE;
  const int lane = threadIdx.x % WARP_SIZE;
  const int len = context_lens[seq];
  const int* table = block_tables + (long long)seq * max_blocks_per_seq;

  float q[HEADS_PER_CTA][EPL];
#pragma unroll
  for (int h = 0; h < HEADS_PER_CTA; ++h) {
    load_vec<EPL>(query + ((long long)seq * num_q_heads + q_head0 + h) * HEAD_SIZE + lane * EPL,
                  q[h]);
#pragma unroll
    for (int e = 0; e < EPL; ++e) q[h][e] *= scale * LOG2E;
  }

  float m[HEADS_PER_CTA], l[HEADS_PER_CTA], acc[HEADS_PER_CTA][EPL];
#pragma unroll
  for (int h = 0; h < HEADS_PER_CTA; ++h) {
    m[h] = neg_inf();
    l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[h][e] = 0.f;
  }

  for (int t = warp; t < len; t += NUM_WARPS) {
    const long long row = kv_offset(table[t / BLOCK_SIZE], num_kv_heads, kv_head,
                                    t % BLOCK_SIZE, lane * EPL);
    float k[EPL], v[EPL];
    load_vec<EPL>(key_cache + row, k);  // once for all HEADS_PER_CTA heads
    load_vec<EPL>(value_cache + row, v);
#pragma unroll
    for (int h = 0; h < HEADS_PER_CTA; ++h) {
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < EPL; ++e) s += q[h][e] * k[e];
      s = group_sum<WARP_SIZE>(s);
      const float m_new = fmaxf(m[h], s);
      const float alpha = exp2f(m[h] - m_new);
      const float p = exp2f(s - m_new);
      l[h] = l[h] * alpha + p;
#pragma unroll
      for (int e = 0; e < EPL; ++e) acc[h][e] = acc[h][e] * alpha + p * v[e];
      m[h] = m_new;
    }
  }

  __shared__ float s_m[NUM_WARPS][HEADS_PER_CTA], s_l[NUM_WARPS][HEADS_PER_CTA];
  __shared__ float s_acc[NUM_WARPS][HEADS_PER_CTA][HEAD_SIZE];
#pragma unroll
  for (int h = 0; h < HEADS_PER_CTA; ++h) {
    if (lane == 0) {
      s_m[warp][h] = m[h];
      s_l[warp][h] = l[h];
    }
#pragma unroll
    for (int e = 0; e < EPL; ++e) s_acc[warp][h][lane * EPL + e] = acc[h][e];
  }
  __syncthreads();

  for (int i = threadIdx.x; i < HEADS_PER_CTA * HEAD_SIZE; i += NUM_THREADS) {
    const int h = i / HEAD_SIZE, d = i % HEAD_SIZE;
    float m_all = neg_inf();
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) m_all = fmaxf(m_all, s_m[w][h]);
    float l_all = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) {
      const float f = rescale(s_m[w][h], m_all);
      l_all += s_l[w][h] * f;
      o += s_acc[w][h][d] * f;
    }
    from_float(out + ((long long)seq * num_q_heads + q_head0 + h) * HEAD_SIZE + d,
               l_all > 0.f ? o / l_all : 0.f);
  }
}
