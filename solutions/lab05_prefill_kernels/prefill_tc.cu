// Lab 5.5 — the tensor-core paged prefill kernel (mma.sync m16n8k16, fp16/bf16 in, fp32 acc).
//
// One CTA per (row tile, KV head). A row is one (query token, query head) pair: the
// group = num_q_heads / num_kv_heads query heads that share a KV head are stacked as rows,
// token-major (row = token * group + head_in_group), so one K/V tile in shared memory serves the
// whole GQA group. BLOCK_M = 16 * MT * WARPS rows, each warp owns MT m16 tiles; BLOCK_N = 64 keys.
//
//   prologue  cp.async Q tile and K/V tile 0 into shared memory; Q -> registers (ldmatrix)
//             when MT = 1 (with MT = 2 Q fragments are re-read from shared memory each tile)
//   loop      on tile j, K/V tile j+1 loading into the other stage (double buffer):
//             S = Q K^T                    mma, K fragments by ldmatrix; tile j+1's cp.async
//                                          copies spread over its k-steps
//             mask (diagonal / last tile only), ALiBi, online softmax in registers
//             O = alpha O + P V            mma, P straight from the S accumulators, V by ldmatrix.trans
//             wait for tile j+1, barrier
//   epilogue  O / l -> out
//
// Shared-memory rows are padded by 16 bytes (D + 8 elements): the 8 rows one ldmatrix phase
// reads then start 16 bytes apart modulo 128, i.e. in 8 different groups of 4 banks.
#include "pagedlab_ptx.cuh"  // mma_16816, ldmatrix_x4(_trans), cp_async_*, smem_addr
#include "prefill_common.cuh"  // MmaType<T>::pack, fast_exp2, find_seq, kv_offset

namespace pagedlab {

constexpr int TC_BLOCK_N = 64;

// Byte offset of (row, 16-byte chunk) in a tile of 16-bit elements with padded rows.
template <int D>
__device__ __forceinline__ unsigned tile_off(int row, int chunk) {
  return (row * (D + 8) + chunk * 8) * 2;
}

template <typename T, int D, int WARPS, int MT>
__device__ void prefill_tc(T* __restrict__ out,                // [num_tokens, num_q_heads, D]
                           const T* __restrict__ query,        // [num_tokens, num_q_heads, D]
                           const T* __restrict__ key_cache,    // [num_blocks, num_kv_heads, block_size, D]
                           const T* __restrict__ value_cache,  // [num_blocks, num_kv_heads, block_size, D]
                           const int* __restrict__ block_tables,  // [num_seqs, max_blocks_per_seq]
                           const int* __restrict__ cu_seqlens_q,  // [num_seqs + 1]
                           const int* __restrict__ context_lens,  // [num_seqs]
                           const float* __restrict__ alibi_slopes,  // [num_q_heads] or nullptr
                           const int* __restrict__ work,          // [num_work, 2] (seq_idx, row_start)
                           float scale, int num_q_heads, int num_kv_heads, int block_size,
                           int max_blocks_per_seq, int causal) {
  // MT m16 row tiles per warp: with MT = 2 every K/V fragment read from shared memory feeds two
  // mma instead of one, halving shared-memory traffic per FLOP (Q fragments are then re-read
  // from shared memory each tile instead of living in registers).
  constexpr int WARP_ROWS = 16 * MT, BM = WARP_ROWS * WARPS, BN = TC_BLOCK_N, THREADS = 32 * WARPS;
  constexpr bool Q_IN_REGS = MT == 1;
  constexpr int CHUNKS = D / 8;       // 16-byte chunks per row
  constexpr int KD = D / 16;          // k-steps of S = Q K^T
  constexpr int NT = BN / 8;          // n-tiles of S (8 keys each)
  constexpr int DT = D / 8;           // n-tiles of O (8 dims each)
  constexpr float LOG2E = 1.4426950408889634f;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  // Shared memory as 32-bit addresses (what cp.async and ldmatrix take), in bytes:
  const unsigned q_s = smem_addr(smem_raw);                 // [BM][D + 8]
  const unsigned kv_s = q_s + BM * (D + 8) * 2;             // [2 stages][K, V][BN][D + 8]
  constexpr unsigned TILE_BYTES = BN * (D + 8) * 2;         // one K or V tile

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int item = blockIdx.x / num_kv_heads;
  const int kv_head = blockIdx.x % num_kv_heads;
  const int seq = work[2 * item];
  const int row0 = work[2 * item + 1];
  const int group = num_q_heads / num_kv_heads;
  const int q_start = cu_seqlens_q[seq];
  const int q_len = cu_seqlens_q[seq + 1] - q_start;
  const int kv_len = context_lens[seq];
  const int history = kv_len - q_len;
  const int num_rows = q_len * group;
  const int* block_table = block_tables + (long long)seq * max_blocks_per_seq;
  const int block_shift = __ffs(block_size) - 1;  // block_size is a power of two (validated)

  // Keys this tile's rows may see: up to the last row's causal limit (or the whole context).
  const int last_token = (min(row0 + BM, num_rows) - 1) / group;
  const int first_token = row0 / group;
  const int kv_end = causal ? history + last_token + 1 : kv_len;
  const int num_kv_tiles = (kv_end + BN - 1) / BN;
  // Tiles below this one need no mask: every key in them is visible to every row.
  const int num_full_tiles = causal ? min(history + first_token + 1, kv_len) / BN : kv_len / BN;

  // ---- Q tile -> shared memory (rows past the sequence are zero) ----
  for (int c = tid; c < BM * CHUNKS; c += THREADS) {
    const int r = c / CHUNKS, ch = c % CHUNKS;
    const int row = row0 + r;
    const T* src = query;
    int bytes = 0;
    if (row < num_rows) {
      const int token = q_start + row / group;
      const int head = kv_head * group + row % group;
      src = query + ((long long)token * num_q_heads + head) * D + ch * 8;
      bytes = 16;
    }
    cp_async_16(q_s + tile_off<D>(r, ch), src, bytes);
  }

  // ---- K/V tile -> shared memory stage, every row found through the block table ----
  // TPR threads share a row, each copying CPT 16-byte chunks of it (columns my_c, my_c + TPR, ...),
  // so one block-table read and one 64-bit offset serve 2 * CPT copies (K and V), and the
  // shared-memory address of every copy is a constant offset from my_dst.
  constexpr int TPR = 8, CPT = CHUNKS / TPR, RSTEP = THREADS / TPR, PASSES = BN / RSTEP;
  static_assert(CHUNKS % TPR == 0 && BN % RSTEP == 0 && KD % PASSES == 0, "load passes");
  constexpr int KD_PER_PASS = KD / PASSES;  // k-steps of S = Q K^T between two passes
  const int my_r = tid / TPR, my_c = tid % TPR;
  // Elements per physical block, 64-bit: num_kv_heads * block_size * D can pass 2^31.
  const long long block_stride = (long long)num_kv_heads * block_size * D;
  const T* k_row = key_cache + ((long long)kv_head * block_size * D + my_c * 8);
  const T* v_row = value_cache + ((long long)kv_head * block_size * D + my_c * 8);
  const unsigned my_dst = tile_off<D>(my_r, my_c);
  // The physical block of this thread's row in pass p of a tile (rows past the context: the
  // last key's block, a real one).
  auto block_of = [&](int tile, int p) {
    return block_table[min(tile * BN + my_r + p * RSTEP, kv_len - 1) >> block_shift];
  };
  auto load_pass = [&](int tile, int stage, int p, int block) {
    const int pos = tile * BN + my_r + p * RSTEP;
    const int bytes = pos < kv_len ? 16 : 0;  // rows past the context are zero-filled, never read
    const int key = min(pos, kv_len - 1);
    const long long off = (long long)block * block_stride + (key & (block_size - 1)) * D;
    const unsigned dst = kv_s + stage * 2 * TILE_BYTES + my_dst + p * RSTEP * (D + 8) * 2;
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
      cp_async_16(dst + c * TPR * 16, k_row + off + c * TPR * 8, bytes);
      cp_async_16(dst + TILE_BYTES + c * TPR * 16, v_row + off + c * TPR * 8, bytes);
    }
  };

  if (num_kv_tiles > 0) {
#pragma unroll
    for (int p = 0; p < PASSES; ++p) load_pass(0, 0, p, block_of(0, p));
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  // Q fragments of m-tile mt, k-step kd (A operand, by ldmatrix from the swizzled Q tile).
  auto load_q_frag = [&](unsigned* a, int mt, int kd) {
    const int r = warp * WARP_ROWS + mt * 16 + (lane & 15);
    ldmatrix_x4(a, q_s + tile_off<D>(r, kd * 2 + lane / 16));
  };
  unsigned q_frag[Q_IN_REGS ? KD : 1][4];  // MT == 1: Q stays in registers for the whole loop
  if constexpr (Q_IN_REGS) {
#pragma unroll
    for (int kd = 0; kd < KD; ++kd) load_q_frag(q_frag[kd], 0, kd);
  }

  // This thread's rows: in m-tile mt, row_base + 16 mt (i = 0) and + 8 (i = 1). Their positions
  // and slopes are recomputed where needed (diagonal tiles, ALiBi): registers are the budget.
  const int row_base = row0 + warp * WARP_ROWS + lane / 4;
  auto row_of = [&](int mt, int i) { return row_base + mt * 16 + 8 * i; };
  auto q_pos_of = [&](int mt, int i) { return history + row_of(mt, i) / group; };
  const bool has_alibi = alibi_slopes != nullptr;
  const float scale_log2 = scale * LOG2E;  // softmax in base 2: exp(x) = exp2(x * log2 e)
  // Scores stay unscaled without ALiBi; the scale then rides in the exp2's FFMA for free.
  const float exp_scale = has_alibi ? 1.0f : scale_log2;

  float o[MT][DT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
  float m_run[MT][2], l_run[MT][2];  // running max (score units); this thread's partial row sums
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m_run[mt][0] = m_run[mt][1] = -INFINITY, l_run[mt][0] = l_run[mt][1] = 0.0f;

  for (int tile = 0; tile < num_kv_tiles; ++tile) {
    const int stage = tile & 1;
    // Tile + 1's copies are spread over the k-steps of S = Q K^T, one pass every KD_PER_PASS
    // steps, its block numbers read first: issued in one burst at the top of the loop they
    // stalled the warp on those reads and throttled the ldmatrix that follow (H200, ncu).
    const bool more = tile + 1 < num_kv_tiles;
    int next_block[PASSES];
#pragma unroll
    for (int p = 0; p < PASSES; ++p) next_block[p] = more ? block_of(tile + 1, p) : 0;
    const unsigned k_s = kv_s + stage * 2 * TILE_BYTES;
    const unsigned v_s = k_s + TILE_BYTES;

    // S = Q K^T (WARP_ROWS rows x 64 keys per warp).
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
    for (int kd = 0; kd < KD; ++kd) {
      unsigned a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (Q_IN_REGS) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[kd][e];
        } else {
          load_q_frag(a[mt], mt, kd);
        }
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        unsigned b[4];
        const int key = np * 16 + (lane / 16) * 8 + (lane & 7);
        ldmatrix_x4(b, k_s + tile_off<D>(key, kd * 2 + ((lane / 8) & 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816(s[mt][2 * np], a[mt], b[0], b[1], T());
          mma_16816(s[mt][2 * np + 1], a[mt], b[2], b[3], T());
        }
      }
      if (more && kd % KD_PER_PASS == KD_PER_PASS - 1)
        load_pass(tile + 1, stage ^ 1, kd / KD_PER_PASS, next_block[kd / KD_PER_PASS]);
    }
    cp_async_commit();

    // ALiBi (then in base-2 units), and the mask: only tiles past the first row's diagonal.
    const int kv0 = tile * BN;
    if (has_alibi) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float slope = alibi_slopes[kv_head * group + row_of(mt, i) % group] * LOG2E;
          const int q_pos = q_pos_of(mt, i);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 2 * i; e < 2 * i + 2; ++e) {
              const int key = kv0 + nt * 8 + (lane % 4) * 2 + (e & 1);
              s[mt][nt][e] = s[mt][nt][e] * scale_log2 + slope * (float)(key - q_pos);
            }
        }
    }
    if (tile >= num_full_tiles) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int q_pos = q_pos_of(mt, i);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 2 * i; e < 2 * i + 2; ++e) {
              const int key = kv0 + nt * 8 + (lane % 4) * 2 + (e & 1);
              if (key >= kv_len || (causal && key > q_pos)) s[mt][nt][e] = -INFINITY;
            }
        }
    }

    // Online softmax per row; a row's 64 columns live in the 4 lanes of a quad.
    float alpha[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * i], s[mt][nt][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[mt][i], mx);
        // NOTE: a row with no visible key yet keeps m = -inf; subtracting 0 keeps exp2 at 0, not NaN.
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        alpha[mt][i] = fast_exp2((m_run[mt][i] - m_use) * exp_scale);
        m_run[mt][i] = m_new;
        const float neg_m = -m_use * exp_scale;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          s[mt][nt][2 * i] = fast_exp2(fmaf(s[mt][nt][2 * i], exp_scale, neg_m));
          s[mt][nt][2 * i + 1] = fast_exp2(fmaf(s[mt][nt][2 * i + 1], exp_scale, neg_m));
          sum += s[mt][nt][2 * i] + s[mt][nt][2 * i + 1];
        }
        l_run[mt][i] = l_run[mt][i] * alpha[mt][i] + sum;
      }
    // Rescale O only when some row's max moved (after the first tiles it rarely does).
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) moved |= alpha[mt][0] != 1.0f || alpha[mt][1] != 1.0f;
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          o[mt][dt][0] *= alpha[mt][0];
          o[mt][dt][1] *= alpha[mt][0];
          o[mt][dt][2] *= alpha[mt][1];
          o[mt][dt][3] *= alpha[mt][1];
        }
    }
    // The S accumulator layout is the A-operand layout: P needs no shuffle, only a conversion.
    unsigned p_frag[MT][NT / 2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int kk = 0; kk < NT / 2; ++kk) {
        p_frag[mt][kk][0] = MmaType<T>::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        p_frag[mt][kk][1] = MmaType<T>::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        p_frag[mt][kk][2] = MmaType<T>::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        p_frag[mt][kk][3] = MmaType<T>::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }

    // O += P V (WARP_ROWS rows x D per warp); V fragments by ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        unsigned b[4];
        const int key = kk * 16 + ((lane / 8) & 1) * 8 + (lane & 7);
        ldmatrix_x4_trans(b, v_s + tile_off<D>(key, dp * 2 + lane / 16));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816(o[mt][2 * dp], p_frag[mt][kk], b[0], b[1], T());
          mma_16816(o[mt][2 * dp + 1], p_frag[mt][kk], b[2], b[3], T());
        }
      }
    }

    cp_async_wait_all();  // this thread's part of tile + 1 has landed ...
    __syncthreads();      // ... everyone's has, and nobody reads this stage any more
  }

  // ---- O / l -> out ----
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float l = l_run[mt][i];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = row_of(mt, i);
      if (row >= num_rows) continue;  // rows past the sequence belong to the next one
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int token = q_start + row / group;
      const int head = kv_head * group + row % group;
      T* dst = out + ((long long)token * num_q_heads + head) * D + (lane % 4) * 2;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        *reinterpret_cast<unsigned*>(dst + dt * 8) =
            MmaType<T>::pack(o[mt][dt][2 * i] * inv, o[mt][dt][2 * i + 1] * inv);
      }
    }
}

}  // namespace pagedlab

#define PAGEDLAB_TC(NAME, T, D, WARPS, MT, MIN_BLOCKS)                                             \
  extern "C" __global__ void __launch_bounds__(32 * WARPS, MIN_BLOCKS)                              \
  NAME(T* out, const T* query, const T* key_cache, const T* value_cache, const int* block_tables,  \
       const int* cu_seqlens_q, const int* context_lens, const float* alibi_slopes,                \
       const int* work, float scale, int num_q_heads, int num_kv_heads, int block_size,            \
       int max_blocks_per_seq, int causal) {                                                       \
    pagedlab::prefill_tc<T, D, WARPS, MT>(out, query, key_cache, value_cache, block_tables,        \
                                          cu_seqlens_q, context_lens, alibi_slopes, work, scale,   \
                                          num_q_heads, num_kv_heads, block_size,                   \
                                          max_blocks_per_seq, causal);                             \
  }

// Kernel names: prefill_tc_<dtype>_d<head_size>_w<warps>_r<rows per warp>.
PAGEDLAB_TC(prefill_tc_f16_d64_w4_r32, __half, 64, 4, 2, 2)
PAGEDLAB_TC(prefill_tc_f16_d128_w4_r32, __half, 128, 4, 2, 2)
PAGEDLAB_TC(prefill_tc_bf16_d64_w4_r32, __nv_bfloat16, 64, 4, 2, 2)
PAGEDLAB_TC(prefill_tc_bf16_d128_w4_r32, __nv_bfloat16, 128, 4, 2, 2)
PAGEDLAB_TC(prefill_tc_f16_d64_w8_r16, __half, 64, 8, 1, 1)
PAGEDLAB_TC(prefill_tc_f16_d128_w8_r16, __half, 128, 8, 1, 1)
PAGEDLAB_TC(prefill_tc_bf16_d64_w8_r16, __nv_bfloat16, 64, 8, 1, 1)
PAGEDLAB_TC(prefill_tc_bf16_d128_w8_r16, __nv_bfloat16, 128, 8, 1, 1)
