// v4 — the fast one (Task 4.4): split-K GQA decode with 16-byte loads, many rows in flight.
//
// Grid and partials are v3's. What changes is how a warp walks its partition:
//   * 16-byte vectors. A K/V row of HEAD_SIZE elements is LPR = HEAD_SIZE / 8 lanes wide, so one
//     warp-wide load covers RPI = 32 / LPR whole rows (2 rows of 256 bytes for head size 128):
//     every byte of every 32-byte sector is used, in the fewest load instructions.
//   * Tiles. Each lane issues VECS_PER_LANE K loads *and* VECS_PER_LANE V loads before it uses
//     any: a warp has TILE_ROWS rows (8 KiB at head size 128, 4 vectors) in flight instead of
//     one. Decode is a pure stream of bytes; what hides the ~1 us memory latency is bytes in
//     flight, not arithmetic.
//   * One softmax rescale per tile instead of one per token, and a dot product reduced over
//     LPR lanes (4 shuffles for head size 128) instead of 32.
//   * The partition's block ids are staged in shared memory once, so a row's address is one
//     shared load and a 64-bit multiply-add, never a dependent global load of the block table.
#include "decode_common.cuh"

#ifndef HEADS_PER_CTA
#define HEADS_PER_CTA 4
#endif
#ifndef NUM_WARPS
#define NUM_WARPS 4
#endif
#define NUM_THREADS (NUM_WARPS * WARP_SIZE)
#define VEC 8                      // elements per 16-byte vector
#define LPR (HEAD_SIZE / VEC)      // lanes per K/V row: 8, 16 or 32
#define RPI (WARP_SIZE / LPR)      // rows per warp-wide load: 4, 2 or 1
#ifndef VECS_PER_LANE
#define VECS_PER_LANE (HEADS_PER_CTA <= 2 ? 8 : 4)
#endif
#define TILE_ROWS (VECS_PER_LANE * RPI)
// Partitions are at most this long (the Python plan guarantees it), so their block ids fit.
#ifndef MAX_PARTITION_SIZE
#define MAX_PARTITION_SIZE 1024
#endif
#define MAX_PARTITION_BLOCKS (MAX_PARTITION_SIZE / BLOCK_SIZE)

// grid (num_seqs, num_q_heads / HEADS_PER_CTA, num_partitions), block (NUM_THREADS)
extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_decode_v4(
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
  // TODO(lab4.4): v3, fast. Suggested structure (see the handout):
  //  1. Stage the CTA's queries (scaled, fp32) into s_buf and the partition's block ids into
  //     s_blocks; __syncthreads(); copy your lane's 8-element query slices into registers.
  //  2. Lane = (rg, col): col = lane % LPR picks a 16-byte vector of a row, rg = lane / LPR a row.
  //     Per tile of TILE_ROWS rows: first issue ALL VECS_PER_LANE K and V loads (uint4, 64-bit
  //     offsets), then scores (dot of 8, group_sum<LPR>), one online-softmax rescale per tile
  //     (max over the tile's rows: local, then shuffles over the row groups), then acc += p * v.
  //  3. Sum l and acc over the row groups, __syncthreads() before s_buf is reused, leave each
  //     warp's (m, l, acc) in s_m, s_l, s_buf, __syncthreads(), then merge_warps_and_store
  //     (decode_common.cuh: v3's merge, 4 elements per thread, read as float4: declare s_buf
  //     `__shared__ __align__(16)`) writes the output or the partial state.
}
