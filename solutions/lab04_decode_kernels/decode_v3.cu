// v3 — split-K, a.k.a. flash-decoding (Task 4.3): v2 over one *partition* of the context.
//
// With 4 long sequences and 8 KV heads, v2 launches 32 CTAs on a GPU with 132 SMs: most of the
// chip idles while 32 CTAs crawl through 32k tokens each. Cutting every context into partitions
// of `partition_size` tokens gives num_seqs * (num_q_heads / HEADS_PER_CTA) * num_partitions
// CTAs. Each writes its partial state (m, l, acc — unnormalised, log2 domain) to a workspace,
// and decode_reduce.cu merges the partials of each (sequence, head):
//     M = max_p m_p,   out = sum_p 2^(m_p - M) acc_p / sum_p 2^(m_p - M) l_p
// With one partition the CTA writes the final output itself and no reduce runs.
#include "decode_common.cuh"

#ifndef HEADS_PER_CTA
#define HEADS_PER_CTA 4
#endif
#define NUM_WARPS 4
#define NUM_THREADS (NUM_WARPS * WARP_SIZE)
#define EPL (HEAD_SIZE / WARP_SIZE)

// grid (num_seqs, num_q_heads / HEADS_PER_CTA, num_partitions), block (NUM_THREADS)
extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_decode_v3(
    scalar_t* __restrict__ out,                // [num_seqs, num_q_heads, head_size]
    float* __restrict__ lse,                   // [num_seqs, num_q_heads] or null; natural log
    float* __restrict__ part_m,                // [num_seqs, num_q_heads, num_partitions]
    float* __restrict__ part_l,                // [num_seqs, num_q_heads, num_partitions]
    float* __restrict__ part_acc,              // [num_seqs, num_q_heads, num_partitions, head_size]
    const scalar_t* __restrict__ query,        // [num_seqs, num_q_heads, head_size]
    const scalar_t* __restrict__ key_cache,    // [num_blocks, num_kv_heads, block_size, head_size]
    const scalar_t* __restrict__ value_cache,  // [num_blocks, num_kv_heads, block_size, head_size]
    const int* __restrict__ block_tables,      // [num_seqs, max_blocks_per_seq]
    const int* __restrict__ context_lens,      // [num_seqs]
    const int max_blocks_per_seq, const int num_kv_heads, const int group, const float scale,
    const int partition_size) {
  const int seq = blockIdx.x;
  const int q_head0 = blockIdx.y * HEADS_PER_CTA;
  const int num_q_heads = gridDim.y * HEADS_PER_CTA;
  const int kv_head = q_head0 / group;
  const int part = blockIdx.z;
  const int num_partitions = gridDim.z;
  const int warp = threadIdx.x / WARP_SIZE;
  const int lane = threadIdx.x % WARP_SIZE;
  const int len = context_lens[seq];
  const int start = part * partition_size;
  // An empty partition writes nothing: the reduce kernel reads only partitions below
  // ceil(len / partition_size). (With a single partition this CTA owns the output: go on.)
  if (num_partitions > 1 && start >= len) return;
  const int end = min(start + partition_size, len);
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

  for (int t = start + warp; t < end; t += NUM_WARPS) {
    const long long row = kv_offset(table[t / BLOCK_SIZE], num_kv_heads, kv_head,
                                    t % BLOCK_SIZE, lane * EPL);
    float k[EPL], v[EPL];
    load_vec<EPL>(key_cache + row, k);
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
    const long long sh = (long long)seq * num_q_heads + q_head0 + h;  // (sequence, head) index
    if (num_partitions == 1) {
      from_float(out + sh * HEAD_SIZE + d, l_all > 0.f ? o / l_all : 0.f);
      if (lse != nullptr && d == 0) lse[sh] = l_all > 0.f ? (m_all + log2f(l_all)) * LN2 : neg_inf();
    } else {
      part_acc[(sh * num_partitions + part) * HEAD_SIZE + d] = o;
      if (d == 0) {
        part_m[sh * num_partitions + part] = m_all;
        part_l[sh * num_partitions + part] = l_all;
      }
    }
  }
}
