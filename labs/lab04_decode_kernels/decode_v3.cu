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
  // TODO(lab4.3): v2 over tokens [part * partition_size, min(... + partition_size, len)),
  //  part = blockIdx.z, num_partitions = gridDim.z. An empty partition returns early — unless
  //  it is the only one (then it owns the output). With one partition write out (and lse when
  //  it is not null: (m + log2 l) * LN2, or -inf); otherwise write this partition's m, l and the
  //  unnormalised acc into part_m / part_l / part_acc for decode_reduce.cu.
}
