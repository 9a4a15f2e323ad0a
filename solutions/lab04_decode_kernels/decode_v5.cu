// v5 — tensor cores (Task 4.5): v4's split-K walk, with both products on mma.sync.
//
// v4 streams K/V at the copy ceiling for MHA, but with a GQA group of 4 or 8 every K/V element
// feeds 4-8 fp32 multiply-adds, shuffle reductions and conversions: the CUDA cores, not memory,
// set the pace. Here a warp takes 16 tokens at a time and lets the tensor cores do the products
// (mma.sync.m16n8k16, fp16/bf16 in, fp32 accumulate):
//     S[heads x 16 tokens] = Q[heads x D] . K^T        (rows: the CTA's query heads, padded to 16)
//     O[heads x D]        += P[heads x 16 tokens] . V   (P = 2^(S - m), rounded to fp16/bf16)
// No lane needs a fragment shuffle or a shared-memory transpose, thanks to two free choices:
//   * the dot product's k order is arbitrary: a lane that loads 8 consecutive columns of a K row
//     (one 16-byte vector) pairs them with the same 8 columns of Q, in two k16 steps;
//   * the output's column order is ours to pick: lane (g, t) loads V columns 64h + 8g .. +8 of
//     four token rows and uses element e of them as n8-chunk (h, e), column g — the packing of
//     two tokens into one register is one byte permute.
// The score fragment of S has exactly the layout P needs as the A operand of the second product
// (rows = heads by lane / 4, columns = tokens by lane % 4), so P never leaves registers.
#include "decode_common.cuh"

#ifndef HEADS_PER_CTA
#define HEADS_PER_CTA 4
#endif
#ifndef NUM_WARPS
#define NUM_WARPS 4
#endif
#define NUM_THREADS (NUM_WARPS * WARP_SIZE)
#define TILE_TOKENS 16             // tokens per warp iteration: the k of the P.V product
#define K_CHUNKS (HEAD_SIZE / 32)  // a lane's 16-byte vectors per K row
#define V_HALVES (HEAD_SIZE / 64)  // a lane's 16-byte vectors per V row
#define O_CHUNKS (HEAD_SIZE / 8)   // n8 chunks of the output row
#ifndef MAX_PARTITION_SIZE
#define MAX_PARTITION_SIZE 1024
#endif
#define MAX_PARTITION_BLOCKS (MAX_PARTITION_SIZE / BLOCK_SIZE)

static_assert(HEAD_SIZE == 64 || HEAD_SIZE == 128, "v5 has code for head sizes 64 and 128");
static_assert(HEADS_PER_CTA <= 8, "the A operand's rows 8..15 are kept zero");

// d += A . B for one m16n8k16 tile; rows 8..15 of A (fragment registers a1, a3) are zero.
__device__ __forceinline__ void mma_16816(float (&d)[4], unsigned a0, unsigned a2, unsigned b0,
                                          unsigned b1, const __half*) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(float (&d)[4], unsigned a0, unsigned a2, unsigned b0,
                                          unsigned b1, const __nv_bfloat16*) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// grid (num_seqs, num_q_heads / HEADS_PER_CTA, num_partitions), block (NUM_THREADS)
extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_decode_v5(
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

  __shared__ __align__(16) float s_acc[NUM_WARPS * HEADS_PER_CTA * HEAD_SIZE];
  __shared__ int s_blocks[MAX_PARTITION_BLOCKS];
  __shared__ float s_m[NUM_WARPS][HEADS_PER_CTA], s_l[NUM_WARPS][HEADS_PER_CTA];

  const int* table = block_tables + (long long)seq * max_blocks_per_seq + start / BLOCK_SIZE;
  const int num_part_blocks = (end - start + BLOCK_SIZE - 1) / BLOCK_SIZE;
  for (int i = threadIdx.x; i < num_part_blocks; i += NUM_THREADS) s_blocks[i] = table[i];
  __syncthreads();

  const int g = lane / 4;  // fragment row group: a head of S and O, a token of K, a V column
  const int t = lane % 4;  // thread in group: a token pair of S and P, a K column range
  const scalar_t* tag = nullptr;

  // Q as the A operand, loaded once: head g's columns p0..p0+3 for k16 step kk, where
  // p0 = 32 (kk / 2) + 8 t + 4 (kk % 2) — the same columns this lane loads from K.
  unsigned qa[HEAD_SIZE / 16][2];
  const unsigned* q_words =
      reinterpret_cast<const unsigned*>(query + ((long long)seq * num_q_heads + q_head0) * HEAD_SIZE);
#pragma unroll
  for (int kk = 0; kk < HEAD_SIZE / 16; ++kk) {
    const int p0 = 32 * (kk / 2) + 8 * t + 4 * (kk % 2);
    qa[kk][0] = g < HEADS_PER_CTA ? q_words[(g * HEAD_SIZE + p0) / 2] : 0u;
    qa[kk][1] = g < HEADS_PER_CTA ? q_words[(g * HEAD_SIZE + p0) / 2 + 1] : 0u;
  }

  const float qk_scale = scale * LOG2E;
  const long long block_stride = (long long)num_kv_heads * BLOCK_SIZE * HEAD_SIZE;
  const long long head_base = (long long)kv_head * BLOCK_SIZE * HEAD_SIZE;
  const scalar_t* k_base = key_cache + head_base + 8 * t;
  const scalar_t* v_base = value_cache + head_base + 8 * g;

  float o[O_CHUNKS][4];
#pragma unroll
  for (int c = 0; c < O_CHUNKS; ++c) o[c][0] = o[c][1] = o[c][2] = o[c][3] = 0.f;
  float m = neg_inf(), l = 0.f;  // head g's running max and (this lane's part of the) sum

  for (int t0 = start + warp * TILE_TOKENS; t0 < end; t0 += NUM_WARPS * TILE_TOKENS) {
    // 1. Every load of the tile first. K: tokens t0 + 8j + g; V: tokens t0 + {2t, 2t+1, 2t+8, 2t+9}.
    uint4 kr[2][K_CHUNKS], vr[4][V_HALVES];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int tok = t0 + 8 * j + g;
      const bool ok = tok < end;  // rows past the context (NaN in the tests) are never read
      const long long off = ok ? (long long)s_blocks[(tok - start) / BLOCK_SIZE] * block_stride +
                                     (tok % BLOCK_SIZE) * HEAD_SIZE : 0;
#pragma unroll
      for (int c = 0; c < K_CHUNKS; ++c)
        kr[j][c] = ok ? __ldg(reinterpret_cast<const uint4*>(k_base + off + 32 * c))
                      : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int tok = t0 + 2 * t + (r & 1) + 8 * (r >> 1);
      const bool ok = tok < end;
      const long long off = ok ? (long long)s_blocks[(tok - start) / BLOCK_SIZE] * block_stride +
                                     (tok % BLOCK_SIZE) * HEAD_SIZE : 0;
#pragma unroll
      for (int h = 0; h < V_HALVES; ++h)
        vr[r][h] = ok ? __ldg(reinterpret_cast<const uint4*>(v_base + off + 64 * h))
                      : make_uint4(0u, 0u, 0u, 0u);
    }

    // 2. S = Q K^T for tokens 0..7 (j = 0) and 8..15 (j = 1) of the tile.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int kk = 0; kk < HEAD_SIZE / 16; ++kk) {
        const uint4& v = kr[j][kk / 2];
        mma_16816(s[j], qa[kk][0], qa[kk][1], kk % 2 ? v.z : v.x, kk % 2 ? v.w : v.y, tag);
      }
    }

    // 3. Online softmax for head g over its 16 scores (4 here, 12 in the lanes of the same g).
    float x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int tok = t0 + 8 * (i / 2) + 2 * t + (i % 2);
      x[i] = tok < end ? s[i / 2][i % 2] * qk_scale : neg_inf();
    }
    float tile_max = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(FULL_MASK, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(FULL_MASK, tile_max, 2));
    const float m_new = fmaxf(m, tile_max);  // token t0 is valid: finite
    const float alpha = exp2f(m - m_new);
    m = m_new;
    float p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = exp2f(x[i] - m_new);
    l = l * alpha + (p[0] + p[1]) + (p[2] + p[3]);
#pragma unroll
    for (int c = 0; c < O_CHUNKS; ++c) {
      o[c][0] *= alpha;
      o[c][1] *= alpha;
    }
    // S's fragment is P's A fragment: (row g, tokens 2t, 2t+1) and (row g, tokens 2t+8, 2t+9).
    const unsigned pa0 = pack2(p[0], p[1], tag);
    const unsigned pa2 = pack2(p[2], p[3], tag);

    // 4. O += P V. Chunk c = (h, e) = (c / 8, c % 8), column g <-> output column 64h + 8g + e;
    //    its B fragment pairs element e of V rows (2t, 2t+1) and of rows (2t+8, 2t+9).
#pragma unroll
    for (int c = 0; c < O_CHUNKS; ++c) {
      const int h = c / 8, e = c % 8;
      const unsigned sel = e % 2 ? 0x7632u : 0x5410u;
      const unsigned b0 = __byte_perm(word(vr[0][h], e / 2), word(vr[1][h], e / 2), sel);
      const unsigned b1 = __byte_perm(word(vr[2][h], e / 2), word(vr[3][h], e / 2), sel);
      mma_16816(o[c], pa0, pa2, b0, b1, tag);
    }
  }

  // Merge the warps as v4 does. Lane (g, t) holds head g's columns 64h + 16t + e (+ 8).
  l += __shfl_xor_sync(FULL_MASK, l, 1);
  l += __shfl_xor_sync(FULL_MASK, l, 2);
  if (g < HEADS_PER_CTA) {
    if (t == 0) {
      s_m[warp][g] = m;
      s_l[warp][g] = l;
    }
    float* dst = &s_acc[(warp * HEADS_PER_CTA + g) * HEAD_SIZE];
#pragma unroll
    for (int c = 0; c < O_CHUNKS; ++c) {
      const int d = 64 * (c / 8) + 16 * t + c % 8;
      dst[d] = o[c][0];
      dst[d + 8] = o[c][1];
    }
  }
  __syncthreads();

  merge_warps_and_store<NUM_WARPS, HEADS_PER_CTA, NUM_THREADS>(
      &s_m[0][0], &s_l[0][0], s_acc, out, lse, part_m, part_l, part_acc,
      (long long)seq * num_q_heads + q_head0, num_partitions, part);
}
