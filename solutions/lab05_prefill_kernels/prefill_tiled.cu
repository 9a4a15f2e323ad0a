// Lab 5.4 — the tiled paged prefill kernel (FlashAttention-2 style, on CUDA cores).
//
// One CTA per (query tile, query head): BLOCK_M = 64 query rows of one sequence and one head.
// The work list (from plan_query_tiles, heaviest first) says which sequence and which first row
// each tile has; blockIdx.x = work_idx * num_q_heads + head.
//
// Per KV tile of BLOCK_N = 64 keys:
//   load  K, V rows into shared memory, each row found through the block table (a tile spans
//         block_size-token pages that lie anywhere in the cache) and zero past the context;
//   S  =  Q K^T * scale (+ ALiBi), masked: 128 threads, each a 8 x 4 patch of the 64 x 64 tile;
//   online softmax per row: new max m', rescale factor alpha = exp(m - m'), P = exp(S - m');
//   O  =  alpha * O + P V, each thread a 8 x (head_size / 16) patch of the output tile.
// Tiles wholly above the causal diagonal are never visited: the loop stops at the last key the
// tile's last row may see. Each key is read from global memory once per CTA, not once per query.
#include "prefill_common.cuh"

namespace pagedlab {

constexpr int TILED_BLOCK_M = 64;
constexpr int TILED_BLOCK_N = 64;
constexpr int TILED_THREADS = 128;

// Copies `rows` rows of D elements into shared memory (row stride STRIDE), 16 bytes per load.
// row_ptr(r) returns the row's address in global memory, or nullptr for a row to zero-fill.
template <typename T, int D, int STRIDE, typename RowPtr>
__device__ __forceinline__ void load_tile(T* __restrict__ dst, int rows, RowPtr row_ptr) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int CHUNKS = D / VEC;
  for (int c = threadIdx.x; c < rows * CHUNKS; c += TILED_THREADS) {
    const int r = c / CHUNKS;
    const int col = (c % CHUNKS) * VEC;
    const T* src = row_ptr(r);
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (src != nullptr) v = *reinterpret_cast<const uint4*>(src + col);
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) dst[r * STRIDE + col + i] = e[i];
  }
}

template <typename T, int D>
__device__ void prefill_tiled(T* __restrict__ out,                // [num_tokens, num_q_heads, D]
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
  constexpr int BM = TILED_BLOCK_M, BN = TILED_BLOCK_N;
  // NOTE: one padding word per row keeps the 16 rows a warp reads at one column in 16 banks.
  constexpr int STRIDE = D + 4 / sizeof(T);
  constexpr int S_STRIDE = BN + 1;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* q_s = reinterpret_cast<T*>(smem_raw);     // [BM][STRIDE]
  T* k_s = q_s + BM * STRIDE;                  // [BN][STRIDE]
  T* v_s = k_s + BN * STRIDE;                  // [BN][STRIDE]
  float* s_s = reinterpret_cast<float*>(v_s + BN * STRIDE);  // [BM][S_STRIDE]: S, then P
  float* alpha_s = s_s + BM * S_STRIDE;        // [BM] per-row rescale factor of this tile
  float* l_s = alpha_s + BM;                   // [BM] final softmax denominators

  const int tid = threadIdx.x;
  const int ty = tid / 16, tx = tid % 16;  // phases 1 and 3: rows ty + 8 i, columns tx + 16 j
  const int item = blockIdx.x / num_q_heads;
  const int head = blockIdx.x % num_q_heads;
  const int seq = work[2 * item];
  const int row0 = work[2 * item + 1];
  const int q_start = cu_seqlens_q[seq];
  const int q_len = cu_seqlens_q[seq + 1] - q_start;
  const int kv_len = context_lens[seq];
  const int history = kv_len - q_len;
  const int kv_head = head / (num_q_heads / num_kv_heads);
  const float slope = alibi_slopes ? alibi_slopes[head] : 0.0f;
  const int* block_table = block_tables + (long long)seq * max_blocks_per_seq;

  const int last_row = min(row0 + BM, q_len) - 1;
  const int kv_end = causal ? history + last_row + 1 : kv_len;  // keys past kv_end: no row sees them
  const int num_kv_tiles = (kv_end + BN - 1) / BN;

  load_tile<T, D, STRIDE>(q_s, BM, [&](int r) -> const T* {
    return row0 + r < q_len ? query + ((long long)(q_start + row0 + r) * num_q_heads + head) * D
                            : nullptr;
  });

  float o[8][D / 16];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int k = 0; k < D / 16; ++k) o[i][k] = 0.0f;
  float m_run = -INFINITY, l_run = 0.0f;  // phase 2 state of row tid / 2

  for (int tile = 0; tile < num_kv_tiles; ++tile) {
    const int kv0 = tile * BN;
    auto kv_row = [&](const T* cache, int r) -> const T* {
      const int pos = kv0 + r;
      return pos < kv_len ? cache + kv_offset(block_table, pos, kv_head, num_kv_heads, block_size, D)
                          : nullptr;
    };
    load_tile<T, D, STRIDE>(k_s, BN, [&](int r) { return kv_row(key_cache, r); });
    load_tile<T, D, STRIDE>(v_s, BN, [&](int r) { return kv_row(value_cache, r); });
    __syncthreads();  // the K/V tile (and, the first time, Q) is in shared memory: read it

    // Phase 1: S = Q K^T for this thread's 8 x 4 patch, scaled, biased and masked.
    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; ++d) {
      float qv[8], kv[4];
#pragma unroll
      for (int i = 0; i < 8; ++i) qv[i] = to_float(q_s[(ty + 8 * i) * STRIDE + d]);
#pragma unroll
      for (int j = 0; j < 4; ++j) kv[j] = to_float(k_s[(tx + 16 * j) * STRIDE + d]);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += qv[i] * kv[j];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = ty + 8 * i;
      const int q_pos = history + row0 + r;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = tx + 16 * j;
        const int key = kv0 + c;
        const bool visible = key < kv_len && (!causal || key <= q_pos);
        s_s[r * S_STRIDE + c] = visible ? acc[i][j] * scale + slope * (float)(key - q_pos) : -INFINITY;
      }
    }
    __syncthreads();  // S is complete

    // Phase 2: online softmax, two threads per row (32 columns each, combined by a shuffle).
    {
      const int r = tid >> 1;
      float* s_row = s_s + r * S_STRIDE + (tid & 1) * 32;
      float mx = -INFINITY;
#pragma unroll 8
      for (int c = 0; c < 32; ++c) mx = fmaxf(mx, s_row[c]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m_new = fmaxf(m_run, mx);
      // NOTE: a row that has seen only masked keys keeps m = -inf; subtracting 0 instead keeps
      // exp() at 0 rather than NaN (-inf - -inf).
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = expf(m_run - m_use);
      float sum = 0.0f;
#pragma unroll 8
      for (int c = 0; c < 32; ++c) {
        const float p = expf(s_row[c] - m_use);
        s_row[c] = p;
        sum += p;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      l_run = l_run * alpha + sum;
      m_run = m_new;
      if ((tid & 1) == 0) alpha_s[r] = alpha;
    }
    __syncthreads();  // P and alpha are complete

    // Phase 3: O = alpha * O + P V.
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float a = alpha_s[ty + 8 * i];
#pragma unroll
      for (int k = 0; k < D / 16; ++k) o[i][k] *= a;
    }
#pragma unroll 2
    for (int kk = 0; kk < BN; ++kk) {
      float p[8], v[D / 16];
#pragma unroll
      for (int i = 0; i < 8; ++i) p[i] = s_s[(ty + 8 * i) * S_STRIDE + kk];
#pragma unroll
      for (int k = 0; k < D / 16; ++k) v[k] = to_float(v_s[kk * STRIDE + tx + 16 * k]);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int k = 0; k < D / 16; ++k) o[i][k] += p[i] * v[k];
    }
    __syncthreads();  // everyone is done with K, V and P before the next tile overwrites them
  }

  if ((tid & 1) == 0) l_s[tid >> 1] = l_run;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = ty + 8 * i;
    if (row0 + r >= q_len) continue;  // rows past the sequence belong to the next one
    const float l = l_s[r];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    T* dst = out + ((long long)(q_start + row0 + r) * num_q_heads + head) * D;
#pragma unroll
    for (int k = 0; k < D / 16; ++k) dst[tx + 16 * k] = from_float<T>(o[i][k] * inv);
  }
}

}  // namespace pagedlab

#define PAGEDLAB_TILED(NAME, T, D)                                                                \
  extern "C" __global__ void __launch_bounds__(pagedlab::TILED_THREADS)                            \
  NAME(T* out, const T* query, const T* key_cache, const T* value_cache, const int* block_tables, \
       const int* cu_seqlens_q, const int* context_lens, const float* alibi_slopes,               \
       const int* work, float scale, int num_q_heads, int num_kv_heads, int block_size,           \
       int max_blocks_per_seq, int causal) {                                                      \
    pagedlab::prefill_tiled<T, D>(out, query, key_cache, value_cache, block_tables, cu_seqlens_q, \
                                  context_lens, alibi_slopes, work, scale, num_q_heads,           \
                                  num_kv_heads, block_size, max_blocks_per_seq, causal);          \
  }

PAGEDLAB_TILED(prefill_tiled_f32_d64, float, 64)
PAGEDLAB_TILED(prefill_tiled_f32_d128, float, 128)
PAGEDLAB_TILED(prefill_tiled_f16_d64, __half, 64)
PAGEDLAB_TILED(prefill_tiled_f16_d128, __half, 128)
PAGEDLAB_TILED(prefill_tiled_bf16_d64, __nv_bfloat16, 64)
PAGEDLAB_TILED(prefill_tiled_bf16_d128, __nv_bfloat16, 128)
