// Shared pieces of the Lab 4 decode kernels: the element type, conversions, 16-byte vectors,
// warp reductions and the one address formula of the paged KV cache.
//
// Every kernel is compiled once per configuration with -D options chosen by the Python loader
// (the defaults below are what `pagedlab compile` checks):
//   SCALAR_T       __half or __nv_bfloat16 (query, caches and output share it)
//   HEAD_SIZE      64, 128 or 256
//   BLOCK_SIZE     8, 16 or 32 tokens per KV block
//   HEADS_PER_CTA  query heads one CTA serves (GQA kernels only)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef SCALAR_T
#define SCALAR_T __half
#endif
#ifndef HEAD_SIZE
#define HEAD_SIZE 128
#endif
#ifndef BLOCK_SIZE
#define BLOCK_SIZE 16
#endif

typedef SCALAR_T scalar_t;

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu

// NOTE: scores are kept in the log2 domain (q is pre-multiplied by scale * log2(e)), so every
// exponential is one exp2f — the hardware's native MUFU.EX2 — instead of expf's extra multiply.
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ void from_float(__half* dst, float x) { *dst = __float2half_rn(x); }
__device__ __forceinline__ void from_float(__nv_bfloat16* dst, float x) {
  *dst = __float2bfloat16_rn(x);
}

// One 32-bit word holding two elements -> two floats.
__device__ __forceinline__ float2 word_to_float2(unsigned int w, const __half*) {
  __half2 h = *reinterpret_cast<__half2*>(&w);
  return __half22float2(h);
}
__device__ __forceinline__ float2 word_to_float2(unsigned int w, const __nv_bfloat16*) {
  __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&w);
  return __bfloat1622float2(h);
}

// N consecutive elements (N = 2, 4 or 8: a 4-, 8- or 16-byte vector) -> N floats.
// NOTE: the pointer must be aligned to N * 2 bytes; row starts are (head_size * 2)-byte aligned
// and every lane reads at a multiple of N elements, so the loaders never split a vector.
template <int N>
__device__ __forceinline__ void load_vec(const scalar_t* __restrict__ src, float (&dst)[N]) {
  static_assert(N == 2 || N == 4 || N == 8, "vector of 2, 4 or 8 elements");
  unsigned int w[N / 2];
  if constexpr (N == 8) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(src));
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
  } else if constexpr (N == 4) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(src));
    w[0] = v.x; w[1] = v.y;
  } else {
    w[0] = __ldg(reinterpret_cast<const unsigned int*>(src));
  }
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const float2 f = word_to_float2(w[i], src);
    dst[2 * i] = f.x;
    dst[2 * i + 1] = f.y;
  }
}

// A 16-byte vector (8 elements) already in registers -> 8 floats.
__device__ __forceinline__ void unpack8(const uint4& v, float (&dst)[8]) {
  const scalar_t* tag = nullptr;
  float2 f;
  f = word_to_float2(v.x, tag); dst[0] = f.x; dst[1] = f.y;
  f = word_to_float2(v.y, tag); dst[2] = f.x; dst[3] = f.y;
  f = word_to_float2(v.z, tag); dst[4] = f.x; dst[5] = f.y;
  f = word_to_float2(v.w, tag); dst[6] = f.x; dst[7] = f.y;
}

// Sum / max over aligned groups of WIDTH lanes (WIDTH a power of two <= 32): every lane of a
// group gets the group's result. Butterfly (xor) shuffles need no shared memory and no barrier.
template <int WIDTH>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
  return v;
}
template <int WIDTH>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
  return v;
}

// exp2(x - m) that is 0, never NaN, when both are -inf (an empty partial state).
__device__ __forceinline__ float rescale(float x, float m) {
  return x == neg_inf() ? 0.f : exp2f(x - m);
}

// Element offset of (physical block, kv head, row in block, column) in a cache laid out
// [num_blocks, num_kv_heads, block_size, head_size].
// NOTE: 64-bit on purpose. A 4 GiB fp16 cache has 2^31 elements: a 32-bit product
// block * num_kv_heads * BLOCK_SIZE * HEAD_SIZE wraps there and reads another sequence's keys.
__device__ __forceinline__ long long kv_offset(int block, int num_kv_heads, int kv_head, int row,
                                               int col) {
  return (long long)block * num_kv_heads * (BLOCK_SIZE * HEAD_SIZE) +
         (long long)(kv_head * BLOCK_SIZE + row) * HEAD_SIZE + col;
}
