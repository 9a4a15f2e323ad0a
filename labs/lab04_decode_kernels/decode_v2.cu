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
  // TODO(lab4.2): v1 for HEADS_PER_CTA query heads at once.
  //  q_head0 = blockIdx.y * HEADS_PER_CTA, kv_head = q_head0 / group. Hold q[HEADS_PER_CTA][EPL]
  //  in registers; load each token's K and V slice ONCE and update every head's (m, l, acc).
  //  The merge handles HEADS_PER_CTA heads (shared arrays [NUM_WARPS][HEADS_PER_CTA][...]).
}
