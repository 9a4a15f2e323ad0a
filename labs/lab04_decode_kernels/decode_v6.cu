// v6 — a pipeline (Task 4.6): v5's tensor-core math, fed by cp.async through shared memory.
//
// v5 moved the arithmetic to tensor cores but still loaded each tile into registers and used it
// at once: a warp had one tile in flight and sat idle for the whole memory latency, and the
// registers that tile needed capped how many warps an SM could hold. Decode is a stream: the
// only thing that matters is how many bytes are on their way from HBM at any moment.
//
// Here every warp owns NUM_STAGES slots of shared memory, each holding a 16-token tile of K and
// of V. cp.async copies global -> shared without passing through registers, so a warp keeps
// NUM_STAGES - 1 tiles in flight while it computes on the oldest one (a ring buffer: load tile
// i + NUM_STAGES - 1 into the slot tile i - 1 just left). ldmatrix then hands each lane exactly
// the fragment mma.sync wants:
//     S[16 heads x 16 tokens] = Q[16 x D] . K^T      B fragments: ldmatrix of K rows
//     O[16 heads x D]        += P[16 x 16] . V       B fragments: ldmatrix.trans of V rows
// Rows are the CTA's query heads (a GQA group shares every K/V byte), padded with zero rows up
// to 16. Each warp only ever reads what it copied itself, so the ring needs __syncwarp, never a
// CTA-wide barrier; warps meet once, at the end, to merge their partial softmax states.
//
// Rows of a tile are 2 * HEAD_SIZE bytes apart, a multiple of 128: the eight rows one ldmatrix
// reads would all hit the same banks. Chunk c (16 bytes) of row r is therefore stored at chunk
// c ^ (r % 8) — an XOR swizzle that spreads those eight rows over all 32 banks.
#include "decode_common.cuh"
#include "pagedlab_ptx.cuh"  // mma_16816, ldmatrix_x4(_trans), cp_async_*, smem_addr

#ifndef HEADS_PER_CTA
#define HEADS_PER_CTA 8
#endif
#ifndef NUM_WARPS
#define NUM_WARPS 4
#endif
#ifndef NUM_STAGES
#define NUM_STAGES 3
#endif
#ifndef MAX_PARTITION_SIZE
#define MAX_PARTITION_SIZE 1024
#endif
#define NUM_THREADS (NUM_WARPS * WARP_SIZE)
#define TILE_TOKENS 16                         // the k of the P.V product
#define ROW_CHUNKS (HEAD_SIZE / 8)              // 16-byte chunks per K/V row
#define TILE_ELEMS (TILE_TOKENS * HEAD_SIZE)    // one K (or V) tile
#define COPIES_PER_LANE (TILE_TOKENS * ROW_CHUNKS / WARP_SIZE)
#define NUM_DSTEPS (HEAD_SIZE / 16)             // k16 steps of Q.K^T, n16 pairs of P.V
#define MAX_PARTITION_BLOCKS ((MAX_PARTITION_SIZE + BLOCK_SIZE - 1) / BLOCK_SIZE)
#define ROW_HALVES (HEADS_PER_CTA > 8 ? 2 : 1)  // fragment rows g and g + 8 in use

static_assert(HEAD_SIZE == 64 || HEAD_SIZE == 128, "v6 has code for head sizes 64 and 128");
static_assert(HEADS_PER_CTA <= 16, "one m16 tile of query heads per CTA");
static_assert(NUM_STAGES >= 2, "a ring of at least two slots");

// ----------------------------------------------------------------------------- the pipeline

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled tile.
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * HEAD_SIZE + ((chunk ^ (row & 7)) << 3);
}

// Starts copying the K and V rows of tokens t0 .. t0 + 15 into one slot (this lane's share:
// COPIES_PER_LANE chunks of each). Rows at or past `end` are zero-filled, never read: in the
// tests they are NaN, and 0 * NaN would poison the output through P.V.
__device__ __forceinline__ void load_tile(scalar_t* slot, const scalar_t* __restrict__ key_cache,
                                          const scalar_t* __restrict__ value_cache,
                                          const int* s_blocks, long long block_stride,
                                          long long head_base, int start, int t0, int end,
                                          int lane) {
#pragma unroll
  for (int i = 0; i < COPIES_PER_LANE; ++i) {
    const int c = i * WARP_SIZE + lane;
    const int row = c / ROW_CHUNKS, chunk = c % ROW_CHUNKS;
    const int tok = t0 + row;
    const bool ok = tok < end;
    const long long off = ok ? (long long)s_blocks[(tok - start) / BLOCK_SIZE] * block_stride +
                                   head_base + (tok % BLOCK_SIZE) * HEAD_SIZE + chunk * 8
                             : 0;
    const int dst = swizzled(row, chunk);
    cp_async_16(smem_addr(slot + dst), key_cache + off, ok ? 16 : 0);
    cp_async_16(smem_addr(slot + TILE_ELEMS + dst), value_cache + off, ok ? 16 : 0);
  }
}

// grid (num_seqs, num_q_heads / HEADS_PER_CTA, num_partitions), block (NUM_THREADS),
// dynamic shared memory NUM_WARPS * NUM_STAGES * 2 * TILE_ELEMS * sizeof(scalar_t) bytes.
extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_decode_v6(
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
  // TODO(lab4.6): v5's math, fed through a per-warp ring of NUM_STAGES shared-memory slots.
  //  Grid, partition and early exit as in v5; stage the partition's block ids in s_blocks.
  //  The ring is the dynamic shared memory: declare it `extern __shared__ __align__(128)`
  //  (NOTE: with only 16-byte alignment it lands wherever your static arrays end, and for
  //  half the groups that cost 13-25 % of the speed: see the handout's "Which kernel for which
  //  group").
  //  Warp w takes 16-token tiles w, w + NUM_WARPS, ... of the partition. Prologue: load_tile the
  //  first NUM_STAGES - 1 tiles (commit a group per slot, even an empty one). Per tile i:
  //  cp_async_wait<NUM_STAGES - 2>(), __syncwarp(), refill the slot of tile i - 1 with tile
  //  i + NUM_STAGES - 1 (commit), then: S = Q K^T with one ldmatrix_x4 per k16 step (matrices:
  //  tokens 0-7 / 8-15 x chunks 2kk, 2kk+1 of the swizzled K tile), online softmax per head row
  //  (g, and g + 8 when HEADS_PER_CTA > 8), P packed as the A fragment, O += P V with one
  //  ldmatrix_x4_trans per pair of n8 output tiles. Finally cp_async_wait<0>(), __syncthreads(),
  //  reuse the ring as s_acc and merge the warps as v4 and v5 do.
}
