// Shared pieces of the Lab 4 decode kernels: the element type, conversions, 16-byte vectors,
// warp reductions, the one address formula of the paged KV cache, and the warp merge that ends
// every split-K kernel from v4 on (you wrote it yourself in v1..v3).
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

// Two floats -> one register of two 16-bit elements (lo in the low half): the A operand of a
// tensor-core product built from fp32 values (v5, v6).
__device__ __forceinline__ unsigned pack2(float lo, float hi, const __half*) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
}
__device__ __forceinline__ unsigned pack2(float lo, float hi, const __nv_bfloat16*) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
}

// The last step of the split-K kernels v4..v6: merge the partial softmax states of a CTA's
// NUM_WARPS_ warps and write them out. Warp w left, for each of the CTA's HEADS query heads h,
// its max in s_m[w * HEADS + h], its sum in s_l[...] and its accumulator row in
// s_acc[(w * HEADS + h) * HEAD_SIZE ...] (all in shared memory, behind a __syncthreads()).
// Unsplit (num_partitions == 1) the output and the log-sum-exp are final; split, the
// partition's (m, l, acc) go to decode_reduce.cu. Each thread finishes 4 consecutive elements.
// NOTE: it reads s_acc as float4, so s_acc must start on a 16-byte boundary: declare it
// `__shared__ __align__(16)` (a float array is only 4-byte aligned on the GPU, which faults
// with "misaligned address"; the emulator aligns every shared array to 16 bytes and cannot
// show this).
// `sh0` is the flat (sequence, head) index of the CTA's first head: seq * num_q_heads + head0.
template <int NUM_WARPS_, int HEADS, int THREADS>
__device__ __forceinline__ void merge_warps_and_store(
    const float* s_m, const float* s_l, const float* s_acc,
    scalar_t* __restrict__ out,       // [num_seqs, num_q_heads, head_size]
    float* __restrict__ lse,          // [num_seqs, num_q_heads] or null; natural log
    float* __restrict__ part_m,       // [num_seqs, num_q_heads, num_partitions]
    float* __restrict__ part_l,       // [num_seqs, num_q_heads, num_partitions]
    float* __restrict__ part_acc,     // [num_seqs, num_q_heads, num_partitions, head_size]
    long long sh0, int num_partitions, int part) {
  for (int i = threadIdx.x; i < HEADS * HEAD_SIZE / 4; i += THREADS) {
    const int h = (4 * i) / HEAD_SIZE;
    const int d = (4 * i) % HEAD_SIZE;
    float m_all = neg_inf();
#pragma unroll
    for (int w = 0; w < NUM_WARPS_; ++w) m_all = fmaxf(m_all, s_m[w * HEADS + h]);
    float l_all = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < NUM_WARPS_; ++w) {
      const float f = rescale(s_m[w * HEADS + h], m_all);  // a warp that saw no token: f = 0
      l_all += f * s_l[w * HEADS + h];
      const float4 a = *reinterpret_cast<const float4*>(&s_acc[(w * HEADS + h) * HEAD_SIZE + d]);
      o[0] += f * a.x; o[1] += f * a.y; o[2] += f * a.z; o[3] += f * a.w;
    }
    const long long sh = sh0 + h;
    if (num_partitions == 1) {
      const float inv = l_all > 0.f ? 1.f / l_all : 0.f;  // empty sequence: exactly 0
#pragma unroll
      for (int e = 0; e < 4; ++e) from_float(out + sh * HEAD_SIZE + d + e, o[e] * inv);
      if (lse != nullptr && d == 0) lse[sh] = l_all > 0.f ? (m_all + log2f(l_all)) * LN2 : neg_inf();
    } else {
      *reinterpret_cast<float4*>(&part_acc[(sh * num_partitions + part) * HEAD_SIZE + d]) =
          make_float4(o[0], o[1], o[2], o[3]);
      if (d == 0) {
        part_m[sh * num_partitions + part] = m_all;
        part_l[sh * num_partitions + part] = l_all;
      }
    }
  }
}
