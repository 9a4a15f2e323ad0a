// pagedlab_emu.h — the emulated CUDA device: runs the workbook's own .cu kernels on the CPU.
//
// reference/emulate.py preprocesses a kernel file with this header forced in front
// (g++ -E -include pagedlab_emu.h -DPAGEDLAB_EMULATE), rewrites its __shared__ declarations into
// per-block storage, appends a launch trampoline per extern "C" kernel, and compiles the result
// with g++ into a shared library that Python calls through ctypes.
//
// DESIGN (and why)
// ----------------
// Prior art studied: ROCm's HIP-CPU (header-only; blocks of a grid run in parallel, the threads
// of a block run as user-space fibers so that a barrier is a cheap switch), hipCPU (OpenMP: one
// OS thread per GPU thread, a barrier is an OpenMP barrier), numba's CUDA simulator (one Python
// thread per GPU thread, threading barriers) and Triton's interpreter (a whole block as numpy
// arrays, which only works for a block-level language). The workbook's kernels are thread-level
// CUDA C++ with barriers *and* warp collectives (shuffles, mma.sync, ldmatrix), so we follow
// HIP-CPU's choice:
//   * every CUDA thread of a block is a fiber: its own stack, switched in user space by a
//     6-register swap on x86-64 (glibc ucontext elsewhere, which is slower: it makes a
//     sigprocmask system call per switch). A __syncthreads costs a few nanoseconds per thread,
//     not an OS-thread wake-up; thousands of threads never need thousands of OS threads.
//   * warps run in order, each as far as it can (to a barrier or its end) before the next
//     starts: a missing __syncthreads between a write and a read of shared memory by different
//     warps then gives a wrong answer deterministically instead of a lucky pass.
//   * blocks run one after another on the calling OS thread, each starting from poisoned shared
//     memory (every byte 0xFF: NaN as a float or half, -1 as an int), so a read of shared memory
//     no thread wrote in this block shows up as NaN instead of a lucky leftover.
//   * warp-lockstep semantics for collectives: a warp's lanes each run to the collective
//     (__shfl_*_sync, votes, __syncwarp, mma.sync, ldmatrix) and park there; the last lane of the
//     mask to arrive performs the exchange for all of them, then they all go on. A lane of the
//     mask that cannot arrive (it exited, or waits at a __syncthreads) is a deadlock, reported.
//   * a scheduler, not the fibers, decides when a __syncthreads releases: when every thread of
//     the block waits at the *same* barrier. Threads that exited, or wait at another barrier
//     (a __syncthreads inside a divergent branch), stop the launch with an error naming them;
//     an emulated kernel never hangs on a barrier.
//   * kernel argument arrays are copied into memory fenced by inaccessible pages (the array ends
//     exactly where a guard page starts), so an out-of-bounds read or write traps; the trap
//     handler names the kernel, the array, the element index and the (block, thread). Arrays
//     passed as `const T*` are mapped read-only: a write to an input is reported too.
//   * mma.sync / ldmatrix / cp.async follow the PTX ISA's fragment layouts exactly (fp32
//     accumulation); cp.async copies are queued per thread and land at the cp.async.wait_group
//     that covers them, so a read before the wait sees poison, as it may on the GPU.
//   * arrays of 256 MiB or more are fenced the same way but paged in lazily: the trap handler
//     copies a page in at its first touch, so a 4 GiB cache costs the pages a kernel reads.
//   * racecheck (emulate.racecheck()): the kernel is rebuilt with g++ -fsanitize=thread, whose
//     per-access hooks the engine answers with a shared-memory race detector that orders
//     accesses by barrier epochs and warp collectives, not by the scheduler's one order
//     (pagedlab_emu_runtime.h, "racecheck state").
//   * Hopper (pagedlab_wgmma.cuh, Lab 5.6): a wgmma is a warpgroup collective (the last of its
//     128 threads computes D for all, descriptors decoded in the PTX ISA's canonical layouts and
//     swizzles); mbarriers keep their phase, pending arrivals and transaction bytes beside the
//     kernel's 8 bytes, and mbar_wait parks its fiber until the phase completes; a TMA box is
//     queued and lands (swizzled, zero past the tensor) when its barrier is waited on or nothing
//     else can run; named barriers park until their count arrives; setmaxnreg is a no-op.
// What emulation does not prove: timing, memory-model subtleties (fences, volatile, races in
// global memory), bank conflicts; for Hopper, a missing wgmma_wait / wgmma_fence /
// fence.proxy.async (a wgmma is complete when issued).
#pragma once

#ifndef PAGEDLAB_EMULATE
#define PAGEDLAB_EMULATE 1
#endif

// NOTE: this header is what every kernel file is compiled against, once per kernel
// configuration: it declares the engine and keeps only what a kernel calls inline. The engine
// itself (pagedlab_emu_runtime.h: scheduler, traps, error messages) is compiled once into an
// object every kernel library links, so a configuration compiles in well under a second.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
// NOTE: every standard header the emulator uses is included here, before the CUDA keyword macros
// below: newer libstdc++ (GCC 13+) spells __attribute__((__noinline__)) in its headers, which
// the __noinline__ macro would break if such a header came after it.
#include <algorithm>
#include <csetjmp>
#include <csignal>
#include <string>
#include <vector>

#define PL_EXPORT extern "C" __attribute__((visibility("default")))
#define PL_HIDDEN __attribute__((visibility("hidden")))

// ----------------------------------------------------------------------------- CUDA keywords

#define __global__ __pl_global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__ static
#define __restrict__ __restrict
#define __grid_constant__
// NOTE: __shared__ is deliberately left undefined here: emulate.py rewrites every __shared__
// declaration of the preprocessed source into storage in the block's shared-memory arena.

struct uint3 { unsigned x, y, z; };
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3() = default;
  dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// Vector types (alignment as on the GPU: a uint4 / float4 is one 16-byte access).
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// ----------------------------------------------------------------------------- 16-bit floats
// Own bit-level conversions (round to nearest even, as __float2half_rn / __float2bfloat16_rn).

namespace pagedlab_emu {
inline unsigned f2u(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float u2f(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }

inline unsigned short float_to_half_bits(float f) {
  const unsigned u = f2u(f);
  const unsigned sign = (u >> 16) & 0x8000u;
  const unsigned exp = (u >> 23) & 0xffu;
  unsigned mant = u & 0x7fffffu;
  if (exp == 0xffu) return sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u);  // inf / NaN
  int e = int(exp) - 127 + 15;
  if (e >= 31) return sign | 0x7c00u;  // overflow -> inf
  if (e <= 0) {                        // subnormal half (or zero)
    if (e < -10) return sign;
    mant |= 0x800000u;
    const int shift = 14 - e;
    unsigned h = mant >> shift;
    const unsigned rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return sign | h;
  }
  unsigned h = (unsigned(e) << 10) | (mant >> 13);
  const unsigned rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: fine
  return sign | h;
}
inline float half_bits_to_float(unsigned short h) {
  const unsigned sign = (unsigned(h) & 0x8000u) << 16;
  const unsigned exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return u2f(sign);
    return (sign ? -1.f : 1.f) * std::ldexp(float(mant), -24);
  }
  if (exp == 31) return u2f(sign | 0x7f800000u | (mant << 13));
  return u2f(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}
inline unsigned short float_to_bf16_bits(float f) {
  const unsigned u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;  // quiet NaN
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
inline float bf16_bits_to_float(unsigned short b) { return u2f(unsigned(b) << 16); }
}  // namespace pagedlab_emu

struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(pagedlab_emu::float_to_half_bits(f)) {}
  operator float() const { return pagedlab_emu::half_bits_to_float(__x); }
};
struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(pagedlab_emu::float_to_bf16_bits(f)) {}
  operator float() const { return pagedlab_emu::bf16_bits_to_float(__x); }
};
struct alignas(4) __half2 { __half x, y; };
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
typedef __half half;
typedef __half2 half2;
typedef __nv_bfloat16 nv_bfloat16;

inline float __half2float(__half h) { return pagedlab_emu::half_bits_to_float(h.__x); }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return pagedlab_emu::bf16_bits_to_float(b.__x); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return {__half(a), __half(a)}; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__nv_bfloat16(a), __nv_bfloat16(b)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h) {
  return {__bfloat162float(h.x), __bfloat162float(h.y)};
}
inline __half __hadd(__half a, __half b) { return __half(float(a) + float(b)); }
inline __half __hmul(__half a, __half b) { return __half(float(a) * float(b)); }
inline __half __hmax(__half a, __half b) { return float(a) > float(b) ? a : b; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 h; h.__x = u; return h; }

// ----------------------------------------------------------------------------- math intrinsics

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __expf(float x) { return expf(x); }
inline float __exp2f(float x) { return exp2f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline float exp10f(float x) { return powf(10.f, x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
// Byte i of the result is byte s[i] (a nibble of `sel`) of the 8-byte value {y, x}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned sel) {
  const unsigned long long v = (unsigned long long)y << 32 | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned((v >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
inline int __mul24(int a, int b) { return a * b; }
inline int __umulhi(unsigned a, unsigned b) { return int(((unsigned long long)a * b) >> 32); }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }

// CUDA's min/max are overloaded for every arithmetic type, mixed ones included.
template <class A, class B>
inline typename std::common_type<A, B>::type min(A a, B b) {
  typedef typename std::common_type<A, B>::type C;
  return C(a) < C(b) ? C(a) : C(b);
}
template <class A, class B>
inline typename std::common_type<A, B>::type max(A a, B b) {
  typedef typename std::common_type<A, B>::type C;
  return C(a) < C(b) ? C(b) : C(a);
}

#define warpSize 32
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline long long clock64() { return 0; }
inline unsigned clock() { return 0; }

// Atomics. Blocks run one at a time on one OS thread and fibers switch only at collectives, so
// these are atomic already; the __atomic builtins keep them so if blocks ever run in parallel.
template <class T> inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float atomicAdd(float* p, float v) { const float old = *p; *p = old + v; return old; }
inline double atomicAdd(double* p, double v) { const double old = *p; *p = old + v; return old; }
template <class T> inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicExch(T* p, T v) { const T old = *p; *p = v; return old; }
template <class T> inline T atomicMax(T* p, T v) { const T old = *p; if (v > old) *p = v; return old; }
template <class T> inline T atomicMin(T* p, T v) { const T old = *p; if (v < old) *p = v; return old; }
template <class T> inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicCAS(T* p, T cmp, T v) {
  const T old = *p;
  if (old == cmp) *p = v;
  return old;
}

// ----------------------------------------------------------------------------- engine interface

namespace pagedlab_emu {

// Description of one kernel parameter (filled by the trampolines, read by emulate.py).
struct ParamInfo {
  int is_pointer, is_const, elem_size, size, is_float, is_signed;
};
// One argument array as the launcher hands it over (a host buffer to fence and copy).
struct BufferArg {
  unsigned long long host;
  unsigned long long nbytes;
  int elem_size;
  int is_const;
  const char* name;
};
// One kernel argument: kind 0 = scalar (bits in value), 1 = pointer at byte `value` of buffer
// `buf`, 2 = raw pointer value (null), 3 = a struct by value whose bytes are at address `value`.
struct KernelArg {
  unsigned long long value;
  int kind;
  int buf;
};
typedef void (*Trampoline)(void**);
struct KernelEntry {
  const char* name;
  Trampoline call;
  int (*describe)(ParamInfo*, int);
};

// The running thread and launch (defined by the engine).
PL_HIDDEN const uint3& thread_idx();
PL_HIDDEN const uint3& block_idx();
PL_HIDDEN const dim3& block_dim();
PL_HIDDEN const dim3& grid_dim();
PL_HIDDEN int lane_id();
// Barriers and warp collectives (the engine parks the calling fiber).
PL_HIDDEN void syncthreads(const char* file, int line);
PL_HIDDEN void syncwarp(int line, unsigned mask);
PL_HIDDEN unsigned long long shfl_bits(unsigned mask, unsigned long long bits, int src,
                                       const char* what, int line);
PL_HIDDEN unsigned ballot_sync(int line, unsigned mask, int pred, const char* what);
PL_HIDDEN void mma_sync(bool bf16, float* c, const unsigned* a, unsigned b0, unsigned b1, int line);
PL_HIDDEN void ldmatrix(bool trans, unsigned* r, unsigned addr, int line);
// Shared memory and cp.async.
PL_HIDDEN unsigned char* dynamic_shared();
PL_HIDDEN void* static_shared(int id, size_t size, size_t align, const char* name = "");
PL_HIDDEN unsigned shared_offset(const void* p, const char* what);
PL_HIDDEN void cp_async(unsigned dst, const void* src, int bytes, int src_bytes);
PL_HIDDEN void cp_async_commit();
PL_HIDDEN void cp_async_wait(int n);
// Hopper (sm_90a, Lab 5.6): mbarriers, named barriers, TMA box copies, wgmma.
PL_HIDDEN void mbar_init(unsigned addr, unsigned count, int line);
PL_HIDDEN void mbar_arrive(unsigned addr);
PL_HIDDEN void mbar_arrive_expect_tx(unsigned addr, unsigned bytes);
PL_HIDDEN void mbar_arrive_cp_async(unsigned addr);
PL_HIDDEN void mbar_wait(unsigned addr, unsigned parity, int line);
PL_HIDDEN void named_bar_sync(int id, int count, int line);
PL_HIDDEN void tma_load(unsigned dst, const unsigned long long* words, int rank, const int* coords,
                        unsigned mbar, int line);
PL_HIDDEN void wgmma(int n, bool bf16, float* d, const unsigned* a, unsigned long long a_desc,
                     unsigned long long b_desc, int scale_d, bool b_mn_major, int line);

template <class T>
inline T shfl(unsigned mask, T var, int src, const char* what, int line) {
  static_assert(sizeof(T) <= 8, "__shfl_*_sync of a value wider than 8 bytes");
  unsigned long long bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = shfl_bits(mask, bits, src, what, line);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}
template <class T>
inline T shfl_sync(int line, unsigned mask, T var, int src_lane, int width = 32) {
  const int lane = lane_id();
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return shfl(mask, var, src, "__shfl_sync", line);
}
template <class T>
inline T shfl_xor_sync(int line, unsigned mask, T var, int lane_mask, int width = 32) {
  const int lane = lane_id();
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return shfl(mask, var, src, "__shfl_xor_sync", line);
}
template <class T>
inline T shfl_up_sync(int line, unsigned mask, T var, unsigned delta, int width = 32) {
  const int lane = lane_id();
  int src = lane - int(delta);
  if (src < (lane & ~(width - 1))) src = lane;
  return shfl(mask, var, src, "__shfl_up_sync", line);
}
template <class T>
inline T shfl_down_sync(int line, unsigned mask, T var, unsigned delta, int width = 32) {
  const int lane = lane_id();
  int src = lane + int(delta);
  if (src >= (lane & ~(width - 1)) + width) src = lane;
  return shfl(mask, var, src, "__shfl_down_sync", line);
}
// __syncwarp() and __syncwarp(mask) through one macro (no empty-__VA_ARGS__ tricks).
struct SyncwarpAt {
  int line;
  void operator()(unsigned mask = 0xffffffffu) const { syncwarp(line, mask); }
};
template <bool BF16>
inline void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1, int line) {
  mma_sync(BF16, c, a, b0, b1, line);
}
template <bool TRANS>
inline void ldmatrix_x4(unsigned* r, unsigned addr, int line) {
  ldmatrix(TRANS, r, addr, line);
}

// The trampoline of one kernel: unpacks void** arguments into its typed parameters, and
// describes those parameters to Python.
template <class F, F f> struct Kernel;
template <class... P, void (*f)(P...)>
struct Kernel<void (*)(P...), f> {
  template <size_t... I>
  static void call_impl(void** a, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_cv<P>::type*>(a[I])...);
  }
  static void call(void** a) { call_impl(a, std::index_sequence_for<P...>{}); }
  template <class T>
  static ParamInfo info() {
    typedef typename std::remove_cv<T>::type U;
    ParamInfo p{};
    p.is_pointer = std::is_pointer<U>::value;
    p.size = sizeof(U);
    if constexpr (std::is_pointer<U>::value) {
      typedef typename std::remove_pointer<U>::type E;
      p.is_const = std::is_const<E>::value;
      typedef typename std::remove_cv<E>::type V;
      if constexpr (std::is_void<V>::value) p.elem_size = 1;
      else p.elem_size = sizeof(V);
    } else {
      p.is_float = std::is_floating_point<U>::value;
      p.is_signed = std::is_signed<U>::value;
    }
    return p;
  }
  static int describe(ParamInfo* out, int cap) {
    const ParamInfo all[] = {info<P>()..., ParamInfo{}};
    const int n = sizeof...(P);
    for (int i = 0; i < n && i < cap; ++i) out[i] = all[i];
    return n;
  }
};

}  // namespace pagedlab_emu

#define threadIdx (::pagedlab_emu::thread_idx())
#define blockIdx (::pagedlab_emu::block_idx())
#define blockDim (::pagedlab_emu::block_dim())
#define gridDim (::pagedlab_emu::grid_dim())

// The CUDA spellings, with the line number the diagnostics quote.
#define __syncthreads() ::pagedlab_emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::pagedlab_emu::SyncwarpAt{__LINE__}(__VA_ARGS__)
#define __shfl_sync(...) ::pagedlab_emu::shfl_sync(__LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) ::pagedlab_emu::shfl_xor_sync(__LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::pagedlab_emu::shfl_up_sync(__LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::pagedlab_emu::shfl_down_sync(__LINE__, __VA_ARGS__)
#define __ballot_sync(mask, pred) ::pagedlab_emu::ballot_sync(__LINE__, mask, pred, "__ballot_sync")
#define __any_sync(mask, pred) (::pagedlab_emu::ballot_sync(__LINE__, mask, pred, "__any_sync") != 0u)
#define __all_sync(mask, pred) \
  (::pagedlab_emu::ballot_sync(__LINE__, mask, !(pred), "__all_sync") == 0u)
#define __activemask() (0xffffffffu)
#define __cvta_generic_to_shared(p) \
  ((unsigned long long)::pagedlab_emu::shared_offset((p), "__cvta_generic_to_shared"))

