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
  // TODO(lab5.4): one CTA per (query tile, query head): item = blockIdx.x / num_q_heads,
  // head = blockIdx.x % num_q_heads, (seq, row0) = work[2 * item], work[2 * item + 1].
  // Shared memory (dynamic, see tiled_shared_bytes): Q, K, V tiles as T with rows padded to
  // STRIDE = D + 4 / sizeof(T) elements, then S/P [BM][BN + 1] floats, then alpha[BM], l[BM].
  //   * load the Q tile once (load_tile; rows past q_len -> nullptr, i.e. zeros);
  //   * for each KV tile up to the tile's last row's diagonal (history + last row):
  //       load K and V rows through the block table (rows past kv_len -> zeros);
  //       __syncthreads();
  //       S = Q K^T * scale + slope * (key - q_pos), -inf where key > q_pos (causal) or
  //       key >= kv_len; thread (ty = tid / 16, tx = tid % 16) owns rows ty + 8i, cols tx + 16j;
  //       __syncthreads();
  //       online softmax, two threads per row: m' = max(m, rowmax), alpha = exp(m - m'),
  //       P = exp(S - m') written over S, l = l * alpha + rowsum; alpha to shared memory;
  //       __syncthreads();
  //       O = alpha * O + P V (thread owns rows ty + 8i, dims tx + 16k);
  //       __syncthreads();   // before the next tile overwrites K, V, P
  //   * O / l to out, only for rows < q_len.
  // NOTE: a row that has seen no key yet has m = -inf: subtract 0 instead, or exp gives NaN.
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
