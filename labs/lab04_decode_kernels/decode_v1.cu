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
  // TODO(lab4.1): one pass with the online softmax.
  //  1. seq = blockIdx.x, head = blockIdx.y, kv_head = head / (gridDim.y / num_kv_heads).
  //  2. Each lane loads its EPL = HEAD_SIZE / 32 elements of q (load_vec<EPL>), times
  //     scale * LOG2E (scores live in the log2 domain: use exp2f).
  //  3. Warp w walks tokens w, w + NUM_WARPS, ... < context_lens[seq]: find the row with the block
  //     table and kv_offset(), load K and V slices, s = group_sum<WARP_SIZE>(q . k), then fold
  //     the token into the warp's (m, l, acc[EPL]) with the online-softmax update.
  //  4. Merge the NUM_WARPS states through shared memory (one __syncthreads()), rescaling each
  //     by 2^(m_w - M); write out = acc / l, or exactly 0 when the sequence is empty.
}
