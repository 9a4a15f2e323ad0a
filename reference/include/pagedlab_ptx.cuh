// Inline-PTX wrappers shared by the tensor-core kernels of Labs 4 and 5 (decode_v6.cu,
// prefill_tc.cu): mma.sync, ldmatrix and cp.async, each one instruction. Trusted code: the labs
// ask you to use these, not to write them. The CUDA loader puts this folder on the include path.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"): lane (g, t) = (lane / 4,
// lane % 4) holds rows g and g + 8, columns 2t, 2t + 1 (and + 8) of A; rows 2t, 2t + 1 (and + 8),
// column g of B; rows g and g + 8, columns 2t, 2t + 1 of C/D.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifdef PAGEDLAB_EMULATE
// The emulated device (reference/include/emulate/pagedlab_emu.h, selected by emulate.py): the
// same wrappers in C++, with the fragment layouts above and fp32 accumulation. The GPU path
// below is untouched.
__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1,
                                          __half) {
  ::pagedlab_emu::mma_16816<false>(c, a, b0, b1, __LINE__);
}
__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1,
                                          __nv_bfloat16) {
  ::pagedlab_emu::mma_16816<true>(c, a, b0, b1, __LINE__);
}
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return ::pagedlab_emu::shared_offset(p, "smem_addr");
}
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned addr) {
  ::pagedlab_emu::ldmatrix_x4<false>(r, addr, __LINE__);
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, unsigned addr) {
  ::pagedlab_emu::ldmatrix_x4<true>(r, addr, __LINE__);
}
// Queued, and performed by the cp_async_wait that covers its group (zero-fill included).
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
  ::pagedlab_emu::cp_async(dst, src, 16, src_bytes);
}
__device__ __forceinline__ void cp_async_commit() { ::pagedlab_emu::cp_async_commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { ::pagedlab_emu::cp_async_wait(N); }
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }
#else

// D (16x8, f32) += A (16x16, row) * B (16x8, col); the last argument only picks the input type.
__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1,
                                          __half) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(float* c, const unsigned* a, unsigned b0, unsigned b1,
                                          __nv_bfloat16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The 32-bit shared-memory address ldmatrix and cp.async take. NOTE: the builtin, not inline
// cvta PTX, so the compiler can fold the conversion into address arithmetic (v6: 156 registers
// with it, 166 with the asm).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// Four 8x8 matrices of 16-bit elements: lanes 8j..8j+7 give the row addresses of matrix j, and
// lane (g, t) gets row g, elements 2t and 2t + 1 of each (.trans: of its transpose).
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// 16-byte global -> shared copy that bypasses registers; src_bytes = 0 writes 16 zero bytes
// and reads nothing.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }
#endif  // PAGEDLAB_EMULATE
