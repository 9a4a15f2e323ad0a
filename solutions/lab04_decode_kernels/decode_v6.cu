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
  if (num_partitions > 1 && start >= len) return;  // empty partition: the reduce skips it
  const int end = min(start + partition_size, len);

  // [NUM_WARPS][NUM_STAGES][K tile, V tile]; reused for the warps' partial outputs at the end.
  // NOTE: 128-byte aligned, not just 16. The dynamic array starts right after the static ones
  // below, whose size depends on BLOCK_SIZE, NUM_WARPS and HEADS_PER_CTA; with __align__(16) it
  // started 32, 64 or 96 bytes past a 128-byte line for most groups. Same instructions, same
  // DRAM bytes, but at 64 or 96 bytes off 13-25 % slower (H200, 2026-11-29: one batch, groups
  // 2, 3, 6, 7: 77-83 us, aligned 66-68 us). Why the hardware cares is not established.
  extern __shared__ __align__(128) unsigned char smem[];
  scalar_t* ring = reinterpret_cast<scalar_t*>(smem) + warp * (NUM_STAGES * 2 * TILE_ELEMS);
  __shared__ int s_blocks[MAX_PARTITION_BLOCKS];
  __shared__ float s_m[NUM_WARPS][HEADS_PER_CTA], s_l[NUM_WARPS][HEADS_PER_CTA];

  const int* table = block_tables + (long long)seq * max_blocks_per_seq + start / BLOCK_SIZE;
  const int num_part_blocks = (end - start + BLOCK_SIZE - 1) / BLOCK_SIZE;
  for (int i = threadIdx.x; i < num_part_blocks; i += NUM_THREADS) s_blocks[i] = table[i];
  __syncthreads();

  const long long block_stride = (long long)num_kv_heads * BLOCK_SIZE * HEAD_SIZE;
  const long long head_base = (long long)kv_head * BLOCK_SIZE * HEAD_SIZE;
  // Warp w takes tiles w, w + NUM_WARPS, ...: tile i of this warp starts at token tile_start(i).
  const int num_tiles = max(0, (end - start + TILE_TOKENS - 1) / TILE_TOKENS - warp);
  const int my_tiles = (num_tiles + NUM_WARPS - 1) / NUM_WARPS;
  auto tile_start = [&](int i) { return start + (warp + i * NUM_WARPS) * TILE_TOKENS; };

  // Prologue: NUM_STAGES - 1 tiles in flight before any math. A group is committed even when
  // there is no tile, so "wait until at most NUM_STAGES - 2 groups are pending" always means
  // "tile i has landed".
#pragma unroll
  for (int i = 0; i < NUM_STAGES - 1; ++i) {
    if (i < my_tiles)
      load_tile(ring + i * 2 * TILE_ELEMS, key_cache, value_cache, s_blocks, block_stride,
                head_base, start, tile_start(i), end, lane);
    cp_async_commit();
  }

  const int g = lane / 4;  // fragment row group: heads g and g + 8
  const int t = lane % 4;  // thread in group: tokens 2t, 2t + 1 (+ 8), output columns 2t, 2t + 1
  const scalar_t* tag = nullptr;

  // Q as the A operand, loaded once: a[0], a[2] hold head g, a[1], a[3] head g + 8 (zero rows
  // past the CTA's heads), columns 16 kk + 2t (+ 8).
  unsigned qa[NUM_DSTEPS][4];
  const unsigned* q_words = reinterpret_cast<const unsigned*>(
      query + ((long long)seq * num_q_heads + q_head0) * HEAD_SIZE);
#pragma unroll
  for (int kk = 0; kk < NUM_DSTEPS; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int head = g + 8 * (r & 1);
      const int col = 16 * kk + 2 * t + 8 * (r >> 1);
      qa[kk][r] = head < HEADS_PER_CTA ? q_words[(head * HEAD_SIZE + col) / 2] : 0u;
    }
  }

  const float qk_scale = scale * LOG2E;
  float o[2 * NUM_DSTEPS][4];  // n8 tile c: heads g (0, 1) and g + 8 (2, 3), columns 8c + 2t (+1)
#pragma unroll
  for (int c = 0; c < 2 * NUM_DSTEPS; ++c) o[c][0] = o[c][1] = o[c][2] = o[c][3] = 0.f;
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};  // heads g and g + 8

  // ldmatrix row addresses, fixed per lane: lane 8j + i gives row i of matrix j.
  //   K (for S): matrices (tokens 0-7, chunk 2kk), (0-7, 2kk+1), (8-15, 2kk), (8-15, 2kk+1)
  //   V (for O): matrices (tokens 0-7, chunk 2dp), (8-15, 2dp), (0-7, 2dp+1), (8-15, 2dp+1)
  const int k_row = (lane & 7) + ((lane >> 4) << 3), k_sub = (lane >> 3) & 1;
  const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_sub = lane >> 4;

  for (int i = 0; i < my_tiles; ++i) {
    cp_async_wait<NUM_STAGES - 2>();
    __syncwarp();  // tile i is visible to every lane, and every lane is done with tile i - 1
    {
      const int next = i + NUM_STAGES - 1;  // refill the slot tile i - 1 used
      if (next < my_tiles)
        load_tile(ring + (next % NUM_STAGES) * 2 * TILE_ELEMS, key_cache, value_cache, s_blocks,
                  block_stride, head_base, start, tile_start(next), end, lane);
      cp_async_commit();
    }
    const scalar_t* sk = ring + (i % NUM_STAGES) * 2 * TILE_ELEMS;
    const scalar_t* sv = sk + TILE_ELEMS;
    const int t0 = tile_start(i);

    // 1. S = Q K^T: s[j] holds tokens 8j + 2t (+1) of heads g (0, 1) and g + 8 (2, 3).
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < NUM_DSTEPS; ++kk) {
      unsigned b[4];
      ldmatrix_x4(b, smem_addr(sk + swizzled(k_row, 2 * kk + k_sub)));
      mma_16816(s[0], qa[kk], b[0], b[1], scalar_t());
      mma_16816(s[1], qa[kk], b[2], b[3], scalar_t());
    }

    // 2. Online softmax, per head row; the four lanes of a row group share the row's max.
    unsigned pa[4];
#pragma unroll
    for (int h = 0; h < ROW_HALVES; ++h) {
      float x[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = t0 + 8 * (e / 2) + 2 * t + (e % 2);
        x[e] = tok < end ? s[e / 2][2 * h + e % 2] * qk_scale : neg_inf();
      }
      float tile_max = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(FULL_MASK, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(FULL_MASK, tile_max, 2));
      const float m_new = fmaxf(m[h], tile_max);  // token t0 is valid: finite
      const float alpha = exp2f(m[h] - m_new);
      m[h] = m_new;
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) p[e] = exp2f(x[e] - m_new);
      l[h] = l[h] * alpha + (p[0] + p[1]) + (p[2] + p[3]);
#pragma unroll
      for (int c = 0; c < 2 * NUM_DSTEPS; ++c) {
        o[c][2 * h] *= alpha;
        o[c][2 * h + 1] *= alpha;
      }
      // The score fragment is P's A fragment: row (g + 8h), tokens 2t, 2t+1 and 2t+8, 2t+9.
      pa[h] = pack2(p[0], p[1], tag);
      pa[h + 2] = pack2(p[2], p[3], tag);
    }
    if (ROW_HALVES == 1) pa[1] = pa[3] = 0u;

    // 3. O += P V, two n8 tiles of output columns per ldmatrix.trans.
#pragma unroll
    for (int dp = 0; dp < NUM_DSTEPS; ++dp) {
      unsigned b[4];
      ldmatrix_x4_trans(b, smem_addr(sv + swizzled(v_row, 2 * dp + v_sub)));
      mma_16816(o[2 * dp], pa, b[0], b[1], scalar_t());
      mma_16816(o[2 * dp + 1], pa, b[2], b[3], scalar_t());
    }
  }
  cp_async_wait<0>();

  // Merge the warps' states. Row sums first: each lane holds a quarter of its rows' sums.
#pragma unroll
  for (int h = 0; h < ROW_HALVES; ++h) {
    l[h] += __shfl_xor_sync(FULL_MASK, l[h], 1);
    l[h] += __shfl_xor_sync(FULL_MASK, l[h], 2);
  }
  __syncthreads();  // every warp is done with its ring: the shared memory becomes s_acc
  float* s_acc = reinterpret_cast<float*>(smem);  // [NUM_WARPS][HEADS_PER_CTA][HEAD_SIZE]
#pragma unroll
  for (int h = 0; h < ROW_HALVES; ++h) {
    const int head = g + 8 * h;
    if (head < HEADS_PER_CTA) {
      if (t == 0) {
        s_m[warp][head] = m[h];
        s_l[warp][head] = l[h];
      }
      float* dst = &s_acc[(warp * HEADS_PER_CTA + head) * HEAD_SIZE + 2 * t];
#pragma unroll
      for (int c = 0; c < 2 * NUM_DSTEPS; ++c)
        *reinterpret_cast<float2*>(dst + 8 * c) = make_float2(o[c][2 * h], o[c][2 * h + 1]);
    }
  }
  __syncthreads();

  merge_warps_and_store<NUM_WARPS, HEADS_PER_CTA, NUM_THREADS>(
      &s_m[0][0], &s_l[0][0], s_acc, out, lse, part_m, part_l, part_acc,
      (long long)seq * num_q_heads + q_head0, num_partitions, part);
}
