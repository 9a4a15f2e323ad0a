// Lab 5.6 — the Hopper paged prefill kernel (wgmma.mma_async, sm_90a; fp16/bf16 in, fp32 acc).
//
// The same work as prefill_tc.cu (one CTA per (row tile, KV head), rows = (token, query head)
// pairs stacked token-major so one K/V tile serves the whole GQA group), on Hopper's warpgroup
// tensor cores:
//
//   WGS = 3 warpgroups per CTA, 64 rows each (BM = 192). Each warpgroup issues its own wgmma:
//   S = Q K^T with Q and K straight from shared memory (descriptors, no ldmatrix), then
//   O += P V with P from registers (the S accumulators, converted in place) and V from shared
//   memory read "transposed" (MN-major). K/V tiles of BN = 64 keys arrive by cp.async through
//   the block table, STAGES = 4 deep, every thread copying its share.
//
//   Per warpgroup the work is software-pipelined: S of tile t and P V of tile t - 1 are issued
//   together, and the softmax of tile t (CUDA cores) runs while the tensor cores do P V.
//
//   Stages change hands through mbarriers, not __syncthreads: full[s] completes when every
//   thread's copies into stage s have landed, empty[s] when every warp has finished reading it.
//   So the warpgroups drift apart by up to a tile and one's softmax overlaps another's wgmma.
//
// Shared memory holds every tile in the 128-byte swizzle layout wgmma reads (sw_off below).
// Measured on an H100, 2026-11-25 (P3, TFLOP/s): 2 warpgroups 315; 3 warpgroups (every K/V byte
// then feeds 192 rows, not 128) 383; mbarriers instead of a barrier per tile 397-408, 401
// in the committed benchmark (0.86x FlashInfer's fa3 backend). Strict
// turn-taking between the warpgroups (FlashAttention-3's "ping-pong", named barriers) was
// slower with three: 274.
#include "pagedlab_ptx.cuh"    // cp_async_*, smem_addr
#include "pagedlab_wgmma.cuh"  // wgmma_*, wgmma_desc, fence_proxy_async, mbar_*
#include "prefill_common.cuh"   // MmaType<T>::pack, fast_exp2

namespace pagedlab {

// Tile row r's 16-byte chunk ch in the 128-byte-swizzle layout (tile of R rows): the head
// dimension cut into 64-element (128-byte) column blocks of R rows each; in each, row r's chunk
// j sits at chunk j ^ (r % 8) of its 128 bytes.
template <int R>
__device__ __forceinline__ unsigned sw_off(int r, int ch) {
  return (ch / 8) * (R * 128) + r * 128 + (((ch % 8) ^ (r % 8)) * 16);
}

template <typename T, int D, int BN, int STAGES, int WGS>
__device__ void prefill_wgmma(T* __restrict__ out,                // [num_tokens, num_q_heads, D]
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
  static_assert(STAGES >= 3, "a stage is refilled with the tile STAGES - 2 ahead, at least one");
  constexpr int BM = 64 * WGS, THREADS = 128 * WGS;
  constexpr int CH = D / 8;            // 16-byte chunks per row
  constexpr int NT = BN / 8;           // 8-key n-tiles of S
  constexpr int DT = D / 8;            // 8-dim n-tiles of O
  constexpr unsigned TILE_BYTES = BN * D * 2;  // one K or V tile
  constexpr float LOG2E = 1.4426950408889634f;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  // NOTE: the swizzle is a function of address bits 4-9: tiles start 1024-byte aligned.
  const unsigned q_s = (smem_addr(smem_raw) + 1023u) & ~1023u;  // [BM rows]
  const unsigned kv_s = q_s + BM * D * 2;     // [STAGES][K, V][BN rows]
  // full[s]: every thread's copies into stage s have landed; empty[s]: every warp is done
  // reading it (its P V waited for).
  const unsigned full_bar = kv_s + STAGES * 2 * TILE_BYTES, empty_bar = full_bar + 8 * STAGES;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, THREADS);
      mbar_init(empty_bar + 8 * s, THREADS / 32);
    }
  }
  __syncthreads();

  const int tid = threadIdx.x, wg = tid / 128, warp_in_wg = (tid / 32) % 4, lane = tid % 32;
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

  const int last_token = (min(row0 + BM, num_rows) - 1) / group;
  const int first_token = row0 / group;
  const int kv_end = causal ? history + last_token + 1 : kv_len;
  const int num_kv_tiles = (kv_end + BN - 1) / BN;
  const int num_full_tiles = causal ? min(history + first_token + 1, kv_len) / BN : kv_len / BN;

  // ---- Q tile -> shared memory (rows past the sequence are zero); 16 threads read one row ----
  for (int c = tid; c < BM * CH; c += THREADS) {
    const int r = c / CH, ch = c % CH;
    const unsigned dst = q_s + sw_off<BM>(r, ch);
    const int row = row0 + r;
    const T* src = query;
    int bytes = 0;
    if (row < num_rows) {
      const int token = q_start + row / group;
      const int head = kv_head * group + row % group;
      src = query + ((long long)token * num_q_heads + head) * D + ch * 8;
      bytes = 16;
    }
    cp_async_16(dst, src, bytes);
  }

  auto load_kv_tile = [&](int tile, int stage) {
    const unsigned k_dst = kv_s + stage * 2 * TILE_BYTES;
    const unsigned v_dst = k_dst + TILE_BYTES;
    for (int c = tid; c < BN * CH; c += THREADS) {
      const int r = c / CH, ch = c % CH;
      const unsigned o_ = sw_off<BN>(r, ch);
      const int pos = tile * BN + r;
      long long off = 0;
      int bytes = 0;
      if (pos < kv_len) {  // rows past the context are zero-filled, and masked
        const long long block = block_table[pos >> block_shift];
        off = ((block * num_kv_heads + kv_head) * block_size + (pos & (block_size - 1))) * D + ch * 8;
        bytes = 16;
      }
      cp_async_16(k_dst + o_, key_cache + off, bytes);
      cp_async_16(v_dst + o_, value_cache + off, bytes);
    }
  };

  // Prologue: tiles 0 .. STAGES - 3 in flight (Q rides with tile 0's barrier: the arrival
  // covers every copy the thread issued before). A stage is refilled with the tile STAGES - 2
  // ahead, once every warp has released it: its V is read by the P V issued one tile later.
#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < num_kv_tiles) {
      load_kv_tile(s, s);
      mbar_arrive_cp_async(full_bar + 8 * s);
    }
  }

  const int row_base = row0 + wg * 64 + warp_in_wg * 16 + lane / 4;
  auto row_of = [&](int i) { return row_base + 8 * i; };
  auto q_pos_of = [&](int i) { return history + row_of(i) / group; };
  const bool has_alibi = alibi_slopes != nullptr;
  const float scale_log2 = scale * LOG2E;
  const float exp_scale = has_alibi ? 1.0f : scale_log2;

  float o[DT * 4];
#pragma unroll
  for (int k = 0; k < DT * 4; ++k) o[k] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  unsigned p[BN / 16][4];  // P of the previous tile: the A operand of its P V product

  const unsigned q_wg = q_s + wg * 64 * 128;  // this warpgroup's 64 rows
  auto k_addr = [&](unsigned base, int kd) { return base + (kd / 4) * (unsigned)(BN * 128) + (kd % 4) * 32; };
  auto q_addr = [&](int kd) { return q_wg + (kd / 4) * (unsigned)(BM * 128) + (kd % 4) * 32; };
  // Descriptors (PTX ISA, "matrix descriptor"; 128-byte swizzle). Q and K are K-major: a k16
  // step is 32 bytes inside a 128-byte row, 4 steps per 64-column block; 8-row groups are 1024
  // bytes apart (stride); the leading offset is unused. V is MN-major (N = head dim): 8-key
  // groups 1024 bytes apart along K (stride), 64-dim column blocks BN * 128 bytes apart along
  // N (leading). NOTE: swapping V's two offsets reads outside the tile (an illegal address).
  constexpr unsigned SWZ = 1;  // 128-byte swizzle
  constexpr unsigned K_LEAD = 16, K_STRIDE = 1024;
  constexpr unsigned V_LEAD = BN * 128, V_STRIDE = 1024;
  auto issue_pv = [&](int tile) {  // O += P V of `tile` (asynchronous: commit, wait later)
    const unsigned v_s = kv_s + (tile % STAGES) * 2 * TILE_BYTES + TILE_BYTES;
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const unsigned v_addr = v_s + kk * 2048;  // keys 16 kk ..: two 8-row groups on
      wgmma_rs_tb(WgmmaShape<D>(), o, p[kk], wgmma_desc(v_addr, V_LEAD, V_STRIDE, SWZ), 1, T());
    }
    wgmma_commit();
  };

  // Software pipeline, per warpgroup: while the softmax of tile t runs on the CUDA cores, the
  // tensor cores work on P V of tile t - 1 (issued just before, with S of tile t).
  for (int tile = 0; tile < num_kv_tiles; ++tile) {
    {
      const int next = tile + STAGES - 2;
      if (next < num_kv_tiles) {
        const int st = next % STAGES;
        // The stage last held tile - 2 (released in iteration tile - 1); its k-th reuse waits
        // for the k-th completion of empty[st], phase parity k & 1.
        if (tile >= 2) mbar_wait(empty_bar + 8 * st, ((tile - 2) / STAGES) & 1);
        load_kv_tile(next, st);
        mbar_arrive_cp_async(full_bar + 8 * st);
      }
    }
    mbar_wait(full_bar + 8 * (tile % STAGES), (tile / STAGES) & 1);  // tile `tile` (and Q) landed
    fence_proxy_async();  // other threads' cp.async writes, now seen, also for the tensor cores
    const unsigned k_s = kv_s + (tile % STAGES) * 2 * TILE_BYTES;

    // S = Q K^T: 64 rows x BN keys per warpgroup, D / 16 wgmma; then P V of the previous tile.
    float s[NT * 4];
#pragma unroll
    for (int k = 0; k < DT * 4; ++k) reg_fence(o[k]);
    wgmma_fence();
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
      wgmma_ss(WgmmaShape<BN>(), s, wgmma_desc(q_addr(kd), K_LEAD, K_STRIDE, SWZ),
               wgmma_desc(k_addr(k_s, kd), K_LEAD, K_STRIDE, SWZ), kd > 0, T());
    }
    wgmma_commit();
    if (tile > 0) {
      issue_pv(tile - 1);
      wgmma_wait<1>();  // S is done; P V may still run
    } else {
      wgmma_wait<0>();
    }
#pragma unroll
    for (int k = 0; k < NT * 4; ++k) reg_fence(s[k]);

    const int kv0 = tile * BN;
    if (has_alibi) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float slope = alibi_slopes[kv_head * group + row_of(i) % group] * LOG2E;
        const int q_pos = q_pos_of(i);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 2 * i; e < 2 * i + 2; ++e) {
            const int key = kv0 + nt * 8 + (lane % 4) * 2 + (e & 1);
            s[4 * nt + e] = s[4 * nt + e] * scale_log2 + slope * (float)(key - q_pos);
          }
      }
    }
    if (tile >= num_full_tiles) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int q_pos = q_pos_of(i);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 2 * i; e < 2 * i + 2; ++e) {
            const int key = kv0 + nt * 8 + (lane % 4) * 2 + (e & 1);
            if (key >= kv_len || (causal && key > q_pos)) s[4 * nt + e] = -INFINITY;
          }
      }
    }

    // Online softmax per row; a row's BN columns live in the 4 lanes of a quad.
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * i], s[4 * nt + 2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[i], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no visible key yet: exp2 stays 0
      alpha[i] = fast_exp2((m_run[i] - m_use) * exp_scale);
      m_run[i] = m_new;
      const float neg_m = -m_use * exp_scale;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        s[4 * nt + 2 * i] = fast_exp2(fmaf(s[4 * nt + 2 * i], exp_scale, neg_m));
        s[4 * nt + 2 * i + 1] = fast_exp2(fmaf(s[4 * nt + 2 * i + 1], exp_scale, neg_m));
        sum += s[4 * nt + 2 * i] + s[4 * nt + 2 * i + 1];
      }
      l_run[i] = l_run[i] * alpha[i] + sum;
    }
    wgmma_wait<0>();  // P V of the previous tile is in O, and its P registers are free
    if (tile > 0 && lane == 0) mbar_arrive(empty_bar + 8 * ((tile - 1) % STAGES));  // released
#pragma unroll
    for (int k = 0; k < DT * 4; ++k) reg_fence(o[k]);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[4 * dt + 0] *= alpha[0];
      o[4 * dt + 1] *= alpha[0];
      o[4 * dt + 2] *= alpha[1];
      o[4 * dt + 3] *= alpha[1];
    }
    // P: the S accumulators are already the A fragments of the next wgmma, 16 keys each.
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      p[kk][0] = MmaType<T>::pack(s[8 * kk + 0], s[8 * kk + 1]);
      p[kk][1] = MmaType<T>::pack(s[8 * kk + 2], s[8 * kk + 3]);
      p[kk][2] = MmaType<T>::pack(s[8 * kk + 4], s[8 * kk + 5]);
      p[kk][3] = MmaType<T>::pack(s[8 * kk + 6], s[8 * kk + 7]);
    }
  }
  if (num_kv_tiles > 0) {  // the last tile's P V
#pragma unroll
    for (int k = 0; k < DT * 4; ++k) reg_fence(o[k]);
    wgmma_fence();
    issue_pv(num_kv_tiles - 1);
    wgmma_wait<0>();
#pragma unroll
    for (int k = 0; k < DT * 4; ++k) reg_fence(o[k]);
  }
  cp_async_wait<0>();  // no copy may land in shared memory after the CTA has exited

  // ---- O / l -> out ----
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = l_run[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = row_of(i);
    if (row >= num_rows) continue;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int token = q_start + row / group;
    const int head = kv_head * group + row % group;
    T* dst = out + ((long long)token * num_q_heads + head) * D + (lane % 4) * 2;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      *reinterpret_cast<unsigned*>(dst + dt * 8) =
          MmaType<T>::pack(o[4 * dt + 2 * i] * inv, o[4 * dt + 2 * i + 1] * inv);
    }
  }
}

}  // namespace pagedlab

#define PAGEDLAB_WGMMA(NAME, T, D, BN, STAGES, WGS)                                                 \
  extern "C" __global__ void __launch_bounds__(128 * WGS, 1)                                        \
  NAME(T* out, const T* query, const T* key_cache, const T* value_cache, const int* block_tables,  \
       const int* cu_seqlens_q, const int* context_lens, const float* alibi_slopes,                \
       const int* work, float scale, int num_q_heads, int num_kv_heads, int block_size,            \
       int max_blocks_per_seq, int causal) {                                                       \
    pagedlab::prefill_wgmma<T, D, BN, STAGES, WGS>(out, query, key_cache, value_cache,             \
                                                   block_tables, cu_seqlens_q, context_lens,       \
                                                   alibi_slopes, work, scale, num_q_heads,         \
                                                   num_kv_heads, block_size, max_blocks_per_seq,   \
                                                   causal);                                        \
  }

// Kernel names: prefill_wgmma_<dtype>_d<head_size>; BN = 64 keys, 4 stages, 3 warpgroups.
PAGEDLAB_WGMMA(prefill_wgmma_f16_d64, __half, 64, 64, 4, 3)
PAGEDLAB_WGMMA(prefill_wgmma_f16_d128, __half, 128, 64, 4, 3)
PAGEDLAB_WGMMA(prefill_wgmma_bf16_d64, __nv_bfloat16, 64, 64, 4, 3)
PAGEDLAB_WGMMA(prefill_wgmma_bf16_d128, __nv_bfloat16, 128, 64, 4, 3)
