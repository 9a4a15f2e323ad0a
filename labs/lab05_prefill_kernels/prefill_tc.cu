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
  // TODO(lab5.5): one CTA per (row tile, KV head): item = blockIdx.x / num_kv_heads,
  // kv_head = blockIdx.x % num_kv_heads; BM = 16 * MT * WARPS rows, row r of the sequence being
  // token r / group and query head kv_head * group + r % group. Warp w owns MT m16 row tiles.
  // Shared memory (tc_shared_bytes): Q [BM][D + 8], then 2 stages x (K, V) [BN][D + 8] — rows
  // padded by 16 bytes (tile_off) so that ldmatrix is free of bank conflicts.
  //   prologue: cp.async the Q tile (rows past the sequence: src_bytes 0 -> zeros) and KV tile 0
  //             (rows through the block table; rows past kv_len -> zeros); commit; wait; barrier.
  //   loop j:   cp.async KV tile j + 1 into the other stage; commit (correct first; then fast:
  //             8 threads per row, 2 chunks each at D = 128, and the copies issued between
  //             S's k-steps, committed after the last of them — a wait covers committed
  //             groups only; the handout's "The cause: instructions");
  //             S = Q K^T: per 16-dim step, ldmatrix_x4 of Q (A) and, per 16 keys, one
  //             ldmatrix_x4 of K giving the B fragments of two n-tiles; mma_16816 (fp32 acc);
  //             ALiBi and scale (base 2: exp(x) = exp2(x * log2 e)), and the mask — only on
  //             tiles that reach past the first row's diagonal or the context;
  //             online softmax for the thread's rows (lane / 4 and + 8 of each m-tile): quad
  //             max with __shfl_xor_sync 1 and 2, alpha, P = exp2(S - m), rescale O;
  //             P to A fragments (the S accumulator layout *is* the A layout: pack pairs);
  //             O += P V: ldmatrix_x4_trans of V gives the B fragments of two 8-dim n-tiles;
  //             cp_async_wait_all(); __syncthreads();
  //   epilogue: quad-sum l, O / l, store the valid rows (pack pairs into 4-byte stores).
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
