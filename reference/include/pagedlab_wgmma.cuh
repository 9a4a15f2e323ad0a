// Inline-PTX wrappers for Hopper's warpgroup tensor-core instructions (sm_90a): wgmma.mma_async
// and its fences, the shared-memory matrix descriptor, and the mbarrier calls that hand pipeline
// stages between threads. Trusted code, like pagedlab_ptx.cuh:
// Lab 5's Hopper stage (prefill_wgmma.cu) uses these, students do not write them. Files that use
// them are compiled for sm_90a by reference/cuda.py and refused on other GPUs; on the emulated
// device the PAGEDLAB_EMULATE branch below is compiled with g++ instead.
//
// A warpgroup is 4 consecutive warps (128 threads, the first warp index divisible by 4). One
// wgmma computes D (64 x N, fp32, in registers) += A (64 x 16) * B (16 x N), A and B from shared
// memory through descriptors, or A from registers. It is asynchronous: issue, commit_group, and
// wait_group before the accumulators are read or written by anything else.
//
// Accumulator layout (m64nNk16, fp32): warp w of the warpgroup owns rows 16w..16w+15; lane
// (g, t) = (lane / 4, lane % 4) holds, for every n-tile j of 8 columns, d[4j + 0, 1] = row g,
// columns 8j + 2t, + 1, and d[4j + 2, 3] = row g + 8, the same columns: the mma.sync m16n8
// accumulator layout repeated along N. The A-from-registers fragment (m64k16, 16-bit) is the
// mma.sync m16n8k16 A fragment per warp: so an fp32 accumulator converts to the next wgmma's A
// operand with no data movement (the FlashAttention trick for P = softmax(S)).
//
// Shared-memory operands are described by a 64-bit descriptor (wgmma_desc): start address, a
// leading and a stride byte offset, and the swizzle mode the tile was written in. Lab 5 uses the
// 128-byte swizzle (mode 1): tiles in 64-column (128-byte) blocks, row r's 16-byte chunk j stored
// at chunk j ^ (r % 8), each tile 1024-byte aligned; prefill_wgmma.cu says which offset is which.
// NOTE: the unswizzled layout (mode 0) also computes the right answer but ran 1.3-1.4x slower on
// an H100 (2026-11-25): its tensor-core reads of shared memory conflict.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace pagedlab {

template <int N> struct WgmmaShape {};

// The 64-bit shared-memory matrix descriptor: start address, leading and stride byte offsets
// (each stored >> 4, 14 bits), the swizzle mode in bits 62-63 (0 none, 1 128-byte, 2 64-byte,
// 3 32-byte), base offset 0 (tiles start on the swizzle pattern's 1024-byte period).
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned smem_addr, unsigned lead_bytes,
                                                         unsigned stride_bytes, unsigned swizzle = 0) {
  return (unsigned long long)((smem_addr & 0x3FFFF) >> 4) |
         ((unsigned long long)((lead_bytes >> 4) & 0x3FFF) << 16) |
         ((unsigned long long)((stride_bytes >> 4) & 0x3FFF) << 32) |
         ((unsigned long long)(swizzle & 3) << 62);
}

// The tensor map a TMA load reads (128 bytes, passed by value as a __grid_constant__
// parameter): made on the host by cuTensorMapEncodeTiled, or by reference/tma.py's
// emulated_map for the emulated device.
struct alignas(64) TmaDesc {
  unsigned long long words[16];
};

#ifdef PAGEDLAB_EMULATE
// The emulated device (reference/include/emulate/pagedlab_emu.h): the same calls in C++. A
// wgmma computes when the last of its warpgroup's 128 threads issues it, so the fences, commit
// and wait are no-ops there; a TMA box lands when a thread waits on its mbarrier; setmaxnreg
// does nothing (the emulator has no register file). The GPU path below is untouched.
__device__ __forceinline__ void wgmma_fence() {}
__device__ __forceinline__ void wgmma_commit() {}
template <int N>
__device__ __forceinline__ void wgmma_wait() {}
__device__ __forceinline__ void reg_fence(float&) {}
__device__ __forceinline__ void fence_proxy_async() {}
// NOTE: __builtin_LINE() as a default argument is the caller's line (g++): errors name the
// line of the kernel that called the wrapper, not this header's.
__device__ __forceinline__ void mbar_init(unsigned addr, unsigned count, int line = __builtin_LINE()) {
  ::pagedlab_emu::mbar_init(addr, count, line);
}
__device__ __forceinline__ void fence_mbarrier_init() {}
__device__ __forceinline__ void mbar_arrive_cp_async(unsigned addr) {
  ::pagedlab_emu::mbar_arrive_cp_async(addr);
}
__device__ __forceinline__ void mbar_arrive(unsigned addr) { ::pagedlab_emu::mbar_arrive(addr); }
__device__ __forceinline__ void mbar_wait(unsigned addr, unsigned parity, int line = __builtin_LINE()) {
  ::pagedlab_emu::mbar_wait(addr, parity, line);
}
__device__ __forceinline__ void named_bar_sync(int id, int count, int line = __builtin_LINE()) {
  ::pagedlab_emu::named_bar_sync(id, count, line);
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg: a multiple of 8 in 24..256");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned addr, unsigned bytes) {
  ::pagedlab_emu::mbar_arrive_expect_tx(addr, bytes);
}
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaDesc& desc, int x, int y, unsigned mbar,
                                            int line = __builtin_LINE()) {
  const int c[2] = {x, y};
  ::pagedlab_emu::tma_load(dst, desc.words, 2, c, mbar, line);
}
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaDesc& desc, int x, int y, int z,
                                            int w, unsigned mbar, int line = __builtin_LINE()) {
  const int c[4] = {x, y, z, w};
  ::pagedlab_emu::tma_load(dst, desc.words, 4, c, mbar, line);
}
template <int N>
__device__ __forceinline__ void wgmma_ss(WgmmaShape<N>, float* d, unsigned long long a_desc,
                                         unsigned long long b_desc, int scale_d, __half) {
  static_assert(N == 64 || N == 128, "the wrappers have wgmma m64n64k16 and m64n128k16");
  ::pagedlab_emu::wgmma(N, false, d, nullptr, a_desc, b_desc, scale_d, false, __LINE__);
}
template <int N>
__device__ __forceinline__ void wgmma_ss(WgmmaShape<N>, float* d, unsigned long long a_desc,
                                         unsigned long long b_desc, int scale_d, __nv_bfloat16) {
  static_assert(N == 64 || N == 128, "the wrappers have wgmma m64n64k16 and m64n128k16");
  ::pagedlab_emu::wgmma(N, true, d, nullptr, a_desc, b_desc, scale_d, false, __LINE__);
}
template <int N>
__device__ __forceinline__ void wgmma_rs_tb(WgmmaShape<N>, float* d, const unsigned* a,
                                            unsigned long long b_desc, int scale_d, __half) {
  static_assert(N == 64 || N == 128, "the wrappers have wgmma m64n64k16 and m64n128k16");
  ::pagedlab_emu::wgmma(N, false, d, a, 0, b_desc, scale_d, true, __LINE__);
}
template <int N>
__device__ __forceinline__ void wgmma_rs_tb(WgmmaShape<N>, float* d, const unsigned* a,
                                            unsigned long long b_desc, int scale_d, __nv_bfloat16) {
  static_assert(N == 64 || N == 128, "the wrappers have wgmma m64n64k16 and m64n128k16");
  ::pagedlab_emu::wgmma(N, true, d, a, 0, b_desc, scale_d, true, __LINE__);
}
#else

// Orders this thread's earlier register accesses before the warpgroup's next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed wgmma groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// NOTE: the compiler does not know wgmma is asynchronous; this empty asm pins a register so that
// no access to it moves across the issue or the wait.
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// Shared memory written by ordinary stores or cp.async, read next by the tensor cores' async
// proxy: fence between the two. A thread that stored the data itself fences before the barrier
// that publishes it; data that cp.async wrote and an mbarrier reported landed (the writer never
// sees that moment) is fenced by each reader, after its wait.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// mbarrier: a shared-memory barrier object (8 bytes) that completes a *phase* when the count it
// was initialised with has arrived, then starts the next phase; waiters name the phase parity
// they wait for (0, 1, 0, ...), so one barrier serves a ring of stages for ever.
// Initialise it from one thread, then fence_mbarrier_init() (same thread) and __syncthreads()
// before anyone uses it.
__device__ __forceinline__ void mbar_init(unsigned addr, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
// NOTE: the copy engine (TMA's complete_tx) updates a barrier from outside the threads' view of
// memory (the async proxy); this fence makes the initialised barriers visible to it too, which
// __syncthreads() alone does not promise.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrives (one of the count) once every cp.async this thread issued before has landed.
__device__ __forceinline__ void mbar_arrive_cp_async(unsigned addr) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned addr) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(addr) : "memory");
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned addr, unsigned parity) {
  unsigned ok = 0;
  while (!ok) {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(ok) : "r"(addr), "r"(parity) : "memory");
  }
}

// A barrier for `count` threads only (a multiple of 32; whole warps), numbered `id` (1..15:
// __syncthreads() is barrier 0): one warpgroup can wait for itself while the others run on.
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Warp specialisation: a warpgroup that only issues copies needs few registers, one that holds
// accumulators needs many. setmaxnreg moves them at run time (every warp of the warpgroup runs
// it; N a multiple of 8 in 24..256): dec gives registers back to the CTA's pool, inc waits until
// the pool has enough. The kernel is launched with the per-thread count its launch bounds give,
// and the warpgroups' new counts must add up to no more than the CTA had.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// TMA (the tensor memory accelerator): one thread asks for a whole box of a tensor, the
// copy engine writes it into shared memory (in the swizzle layout the tensor map names) and
// counts its bytes on an mbarrier. The tensor map (128 bytes, made on the host by
// cuTensorMapEncodeTiled) is passed by value as a __grid_constant__ kernel parameter (TmaDesc).
// Arrives (one of the count) and tells the barrier to also wait for `bytes` more bytes.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned addr, unsigned bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n"
               ::"r"(addr), "r"(bytes) : "memory");
}
// The box at column x, row y of `desc`'s tensor -> shared memory at dst (1024-byte aligned
// for the 128-byte swizzle); completes its bytes on the mbarrier at mbar.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaDesc& desc, int x, int y, unsigned mbar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&desc)), "r"(x), "r"(y), "r"(mbar)
      : "memory");
}
// The same for a 4-D map (reference/tma.py, whole_rows=True): the box at column x, row y of
// an 8-row group, column block z, 8-row group w (so rows 8 w + y ..); one request brings
// box_rows whole rows, stored 8-row group by group, each group column block by column block.
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaDesc& desc, int x, int y, int z,
                                            int w, unsigned mbar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
      ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&desc)), "r"(x), "r"(y), "r"(z), "r"(w), "r"(mbar)
      : "memory");
}

// wgmma_ss: D[64 x N] (+)= A[64 x 16] * B[16 x N], A and B in shared memory, both K-major
// (A's rows and B's columns each contiguous along K). scale_d = 0 ignores D's old value.
// wgmma_rs_tb: the same with A in registers (4 x 32-bit per thread) and B "transposed"
// (MN-major: contiguous along N), the layout of V read as [key][dim].
__device__ __forceinline__ void wgmma_ss(WgmmaShape<64>, float* d, unsigned long long a_desc,
                                         unsigned long long b_desc, int scale_d, __half) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_rs_tb(WgmmaShape<64>, float* d, const unsigned* a,
                                            unsigned long long b_desc, int scale_d, __half) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_ss(WgmmaShape<64>, float* d, unsigned long long a_desc,
                                         unsigned long long b_desc, int scale_d, __nv_bfloat16) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_rs_tb(WgmmaShape<64>, float* d, const unsigned* a,
                                            unsigned long long b_desc, int scale_d, __nv_bfloat16) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_ss(WgmmaShape<128>, float* d, unsigned long long a_desc,
                                         unsigned long long b_desc, int scale_d, __half) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_rs_tb(WgmmaShape<128>, float* d, const unsigned* a,
                                            unsigned long long b_desc, int scale_d, __half) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_ss(WgmmaShape<128>, float* d, unsigned long long a_desc,
                                         unsigned long long b_desc, int scale_d, __nv_bfloat16) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_rs_tb(WgmmaShape<128>, float* d, const unsigned* a,
                                            unsigned long long b_desc, int scale_d, __nv_bfloat16) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d));
}

#endif  // PAGEDLAB_EMULATE

}  // namespace pagedlab
