// Lab 5 — helpers shared by the prefill kernels (complete; not a task).
//
// Every kernel reads the same inputs, all contiguous:
//   query        [num_tokens, num_q_heads, head_size]          sequences packed back to back
//   key_cache    [num_blocks, num_kv_heads, block_size, head_size]
//   value_cache  [num_blocks, num_kv_heads, block_size, head_size]
//   block_tables [num_seqs, max_blocks_per_seq] int32           padded with -1
//   cu_seqlens_q [num_seqs + 1] int32                           query offsets, cu_seqlens_q[0] == 0
//   context_lens [num_seqs] int32                               history + new tokens
//   alibi_slopes [num_q_heads] float32, or nullptr
// and writes out [num_tokens, num_q_heads, head_size].
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

// NOTE: NVRTC compiles without the C library headers; INFINITY may be missing there.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace pagedlab {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Two floats rounded to the kernel's 16-bit type and packed into one 32-bit register: an
// mma.sync / wgmma A-fragment pair, or two adjacent output elements.
template <typename T> struct MmaType;
template <> struct MmaType<__half> {
  __device__ static unsigned pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
  }
};
template <> struct MmaType<__nv_bfloat16> {
  __device__ static unsigned pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
  }
};

// 2^x on the special-function unit; 2^-inf = 0, which the masking relies on.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Returns the sequence that packed query token `token` belongs to: the last s < num_seqs with
// cu_seqlens_q[s] <= token. NOTE: "last" matters when a sequence has no new tokens
// (cu_seqlens_q[s] == cu_seqlens_q[s + 1]): that empty sequence starts where the next one does.
__device__ __forceinline__ int find_seq(const int* __restrict__ cu_seqlens_q, int num_seqs, int token) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (cu_seqlens_q[mid] <= token) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Element offset of token `pos`'s vector for one KV head, found through the block table.
// 64-bit: num_blocks * num_kv_heads * block_size * head_size passes 2^31 in real caches.
__device__ __forceinline__ long long kv_offset(const int* __restrict__ block_table, int pos,
                                               int kv_head, int num_kv_heads, int block_size,
                                               int head_size) {
  const long long block = block_table[pos / block_size];
  return ((block * num_kv_heads + kv_head) * block_size + pos % block_size) * (long long)head_size;
}

}  // namespace pagedlab
