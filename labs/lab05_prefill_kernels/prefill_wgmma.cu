// Lab 5.6 — the Hopper paged prefill kernel (your task: TODO(lab5.6) below) (wgmma.mma_async, sm_90a; fp16/bf16 in, fp32 acc).
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
  // TODO(lab5.6): the Hopper kernel. One CTA per (row tile, KV head) as in prefill_tc.cu
  // (item = blockIdx.x / num_kv_heads, rows = (token, query head) pairs of the GQA group);
  // BM = 64 * WGS rows, warpgroup wg = threadIdx.x / 128 owns rows 64 wg .. 64 wg + 63.
  // Shared memory (wgmma_shared_bytes): round the base up to 1024 bytes; then Q [BM rows], then
  // STAGES x (K, V) [BN rows], every tile in the 128-byte swizzle layout (sw_off<rows>); then
  // two mbarriers per stage: full[s] (count THREADS) and empty[s] (count THREADS / 32), set up
  // by one thread before a __syncthreads().
  //   prologue: cp.async Q (rows past the sequence: zeros) and KV tiles 0 .. STAGES - 3 (through
  //             the block table; positions past kv_len: zeros); after each tile's copies,
  //             mbar_arrive_cp_async(full[its stage]).
  //   loop t:   refill: tile t + STAGES - 2 goes into the stage tile t - 2 used — for t >= 2 wait
  //             first until every warp released that stage (mbar_wait on empty, parity of that
  //             stage's use count); copy; mbar_arrive_cp_async(full).
  //             mbar_wait(full[t % STAGES], (t / STAGES) & 1); fence_proxy_async();
  //             S = Q K^T: wgmma_fence(); D / 16 x wgmma_ss(WgmmaShape<BN>, ...), descriptors
  //             with swizzle mode 1 (K-major: k16 step = +32 bytes inside a 128-byte row, next
  //             64-column block at + rows * 128; stride 1024); wgmma_commit();
  //             if t > 0: O += P V of tile t - 1 (BN / 16 x wgmma_rs_tb, V MN-major: leading
  //             offset BN * 128, stride 1024; commit), then wgmma_wait<1>(); else wgmma_wait<0>();
  //             mask / ALiBi / online softmax on S exactly as in prefill_tc.cu (the accumulator
  //             layout is mma.sync's, repeated along N); wgmma_wait<0>(); then lane 0 of each
  //             warp releases tile t - 1's stage (mbar_arrive on empty); rescale O; pack P.
  //   after:    O += P V of the last tile; O / l -> out (rows past the sequence: not written).
  // reg_fence every accumulator register around each wait (the compiler does not know wgmma
  // is asynchronous).
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
