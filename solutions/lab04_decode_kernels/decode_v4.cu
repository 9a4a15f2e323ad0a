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

  // s_buf holds the CTA's queries while the warps stream K/V, then (after a barrier) the warps'
  // partial accumulators for the merge: the two uses never overlap in time, so they share space.
  __shared__ __align__(16) float s_buf[NUM_WARPS * HEADS_PER_CTA * HEAD_SIZE];
  __shared__ int s_blocks[MAX_PARTITION_BLOCKS];
  __shared__ float s_m[NUM_WARPS][HEADS_PER_CTA], s_l[NUM_WARPS][HEADS_PER_CTA];

  // The CTA's HEADS_PER_CTA query rows are contiguous: stage them scaled into the log2 domain.
  const scalar_t* q_src = query + ((long long)seq * num_q_heads + q_head0) * HEAD_SIZE;
  for (int i = threadIdx.x; i < HEADS_PER_CTA * HEAD_SIZE; i += NUM_THREADS)
    s_buf[i] = to_float(q_src[i]) * (scale * LOG2E);
  const int* table = block_tables + (long long)seq * max_blocks_per_seq + start / BLOCK_SIZE;
  const int num_part_blocks = (end - start + BLOCK_SIZE - 1) / BLOCK_SIZE;
  for (int i = threadIdx.x; i < num_part_blocks; i += NUM_THREADS) s_blocks[i] = table[i];
  __syncthreads();

  const int col = lane % LPR;  // which 16-byte vector of a row this lane reads
  const int rg = lane / LPR;   // which of the RPI rows of a warp-wide load
  float q[HEADS_PER_CTA][VEC];
#pragma unroll
  for (int h = 0; h < HEADS_PER_CTA; ++h) {
    const float4 a = *reinterpret_cast<const float4*>(&s_buf[h * HEAD_SIZE + col * VEC]);
    const float4 b = *reinterpret_cast<const float4*>(&s_buf[h * HEAD_SIZE + col * VEC + 4]);
    q[h][0] = a.x; q[h][1] = a.y; q[h][2] = a.z; q[h][3] = a.w;
    q[h][4] = b.x; q[h][5] = b.y; q[h][6] = b.z; q[h][7] = b.w;
  }

  const long long block_stride = (long long)num_kv_heads * BLOCK_SIZE * HEAD_SIZE;
  const long long head_col = (long long)kv_head * BLOCK_SIZE * HEAD_SIZE + col * VEC;
  const scalar_t* k_base = key_cache + head_col;
  const scalar_t* v_base = value_cache + head_col;

  float m[HEADS_PER_CTA], l[HEADS_PER_CTA], acc[HEADS_PER_CTA][VEC];
#pragma unroll
  for (int h = 0; h < HEADS_PER_CTA; ++h) {
    m[h] = neg_inf();
    l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[h][e] = 0.f;
  }

  for (int t0 = start + warp * TILE_ROWS; t0 < end; t0 += NUM_WARPS * TILE_ROWS) {
    // 1. Issue every load of the tile first: 2 * VECS_PER_LANE independent 16-byte loads.
    uint4 k_raw[VECS_PER_LANE], v_raw[VECS_PER_LANE];
    bool valid[VECS_PER_LANE];
#pragma unroll
    for (int i = 0; i < VECS_PER_LANE; ++i) {
      const int t = t0 + i * RPI + rg;
      valid[i] = t < end;  // rows past the context (poisoned in the tests) are never read
      if (valid[i]) {
        const int blk = s_blocks[(t - start) / BLOCK_SIZE];
        const long long off = (long long)blk * block_stride + (t % BLOCK_SIZE) * HEAD_SIZE;
        k_raw[i] = __ldg(reinterpret_cast<const uint4*>(k_base + off));
        v_raw[i] = __ldg(reinterpret_cast<const uint4*>(v_base + off));
      } else {
        k_raw[i] = make_uint4(0u, 0u, 0u, 0u);
        v_raw[i] = make_uint4(0u, 0u, 0u, 0u);
      }
    }

    // 2. Scores: LPR lanes each hold 8 products of a row; reduce over those lanes.
    float s[VECS_PER_LANE][HEADS_PER_CTA];
#pragma unroll
    for (int i = 0; i < VECS_PER_LANE; ++i) {
      float k[VEC];
      unpack8(k_raw[i], k);
#pragma unroll
      for (int h = 0; h < HEADS_PER_CTA; ++h) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < VEC; ++e) dot += q[h][e] * k[e];
        dot = group_sum<LPR>(dot);
        s[i][h] = valid[i] ? dot : neg_inf();
      }
    }

    // 3. Online softmax, once per tile: the tile's max over all of the warp's rows.
#pragma unroll
    for (int h = 0; h < HEADS_PER_CTA; ++h) {
      float tile_max = s[0][h];
#pragma unroll
      for (int i = 1; i < VECS_PER_LANE; ++i) tile_max = fmaxf(tile_max, s[i][h]);
#pragma unroll
      for (int offset = LPR; offset < WARP_SIZE; offset <<= 1)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(FULL_MASK, tile_max, offset));
      // Row t0 is always valid, so m_new is finite and alpha is 0 on the first tile.
      const float m_new = fmaxf(m[h], tile_max);
      const float alpha = exp2f(m[h] - m_new);
      m[h] = m_new;
      l[h] *= alpha;
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[h][e] *= alpha;
#pragma unroll
      for (int i = 0; i < VECS_PER_LANE; ++i) s[i][h] = exp2f(s[i][h] - m_new);  // -inf -> 0
    }

    // 4. acc += p * v. A lane's V vectors are the rows whose p it already holds.
#pragma unroll
    for (int i = 0; i < VECS_PER_LANE; ++i) {
      float v[VEC];
      unpack8(v_raw[i], v);
#pragma unroll
      for (int h = 0; h < HEADS_PER_CTA; ++h) {
        l[h] += s[i][h];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[h][e] += s[i][h] * v[e];
      }
    }
  }

  // Sum l and acc over the warp's RPI row groups (lanes with the same column).
#pragma unroll
  for (int offset = LPR; offset < WARP_SIZE; offset <<= 1) {
#pragma unroll
    for (int h = 0; h < HEADS_PER_CTA; ++h) {
      l[h] += __shfl_xor_sync(FULL_MASK, l[h], offset);
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[h][e] += __shfl_xor_sync(FULL_MASK, acc[h][e], offset);
    }
  }

  __syncthreads();  // every warp has read its queries: s_buf may now be overwritten
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < HEADS_PER_CTA; ++h) {
      s_m[warp][h] = m[h];
      s_l[warp][h] = l[h];
    }
  }
  if (rg == 0) {
#pragma unroll
    for (int h = 0; h < HEADS_PER_CTA; ++h) {
      float* dst = &s_buf[(warp * HEADS_PER_CTA + h) * HEAD_SIZE + col * VEC];
      *reinterpret_cast<float4*>(dst) = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
    }
  }
  __syncthreads();

  merge_warps_and_store<NUM_WARPS, HEADS_PER_CTA, NUM_THREADS>(
      &s_m[0][0], &s_l[0][0], s_buf, out, lse, part_m, part_l, part_acc,
      (long long)seq * num_q_heads + q_head0, num_partitions, part);
}
