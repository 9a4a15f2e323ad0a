"""The emulated device (reference/emulate.py + reference/include/emulate/pagedlab_emu.h).

Proves, on a CPU: the CUDA execution model the labs' kernels use behaves as on the GPU (thread
and block indices, shared memory, barriers, warp shuffles and votes, the PTX wrappers with the
hardware's fragment layouts), every Lab 4 solution kernel matches the float64 oracle through
its own launcher, and planted bugs stop with the clear errors a GPU cannot give (out-of-bounds
array access, a barrier not every thread reaches, a missing barrier before shared-memory reuse).
No points: infrastructure. Needs g++ and torch; compiled kernels are cached in
~/.cache/pagedlab-emu (PAGEDLAB_EMU_CACHE), so a second run is fast.
"""

from __future__ import annotations

import shutil
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from reference import cuda as rcuda  # noqa: E402
from reference import emulate  # noqa: E402
from reference.errors import (KernelDeadlockError, KernelFaultError,  # noqa: E402
                              KernelOutOfBoundsError)
from reference.paths import REPO_ROOT, SOLUTIONS_DIR  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which(emulate.CXX) is None,
                                reason=f"the emulated device needs {emulate.CXX}")]


@pytest.fixture(autouse=True)
def _emulated():
    with emulate.emulation():
        yield


def kernel(tmp_path, source: str, name: str = "k", options=()):
    """Compiles a small test kernel file and returns kernel ``name``."""
    path = tmp_path / "k.cu"
    path.write_text(textwrap.dedent(source))
    return rcuda.get_kernel(path, name, options=tuple(options))


# ----------------------------------------------------------------------------- the model


def test_indices_and_dynamic_shared_memory(tmp_path):
    """threadIdx/blockIdx/blockDim/gridDim are CUDA's, and one `extern __shared__` array is
    shared by the threads of a block (a reversal through shared memory needs the barrier)."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(int* out) {
          extern __shared__ int buf[];
          const int t = threadIdx.x + blockDim.x * threadIdx.y;
          const int n = blockDim.x * blockDim.y;
          buf[t] = t + 1000 * (blockIdx.x + gridDim.x * blockIdx.y);
          __syncthreads();
          out[(blockIdx.x + gridDim.x * blockIdx.y) * n + t] = buf[n - 1 - t];
        }""")
    out = torch.zeros(2 * 3 * 64, dtype=torch.int32)
    rcuda.launch(k, (2, 3), (16, 4), (rcuda.ptr(out),), shared_mem=64 * 4)
    got = out.view(6, 64).numpy()
    expect = np.arange(63, -1, -1)[None, :] + 1000 * np.arange(6)[:, None]
    np.testing.assert_array_equal(got, expect)


def test_launches_record_the_stream_they_were_given(tmp_path):
    """A launch through reference.cuda.launch is given torch's current stream; a direct call of
    the kernel object (CuPy's RawKernel call) CuPy's default stream, as on the GPU. Both run."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(int* out) { out[threadIdx.x] = threadIdx.x + 1; }""")
    out = torch.zeros(32, dtype=torch.int32)
    with emulate.recorded_streams() as launches:
        rcuda.launch(k, (1,), (32,), (rcuda.ptr(out),))
        k((1,), (32,), (rcuda.ptr(out),))
    assert launches == [("k", emulate.TORCH_STREAM), ("k", emulate.DEFAULT_STREAM)]
    assert out.tolist() == list(range(1, 33))


def test_static_shared_is_per_block_and_poisoned(tmp_path):
    """A static `__shared__` array is one per block, and starts every block as 0xFF bytes (NaN
    as a float): a read of shared memory no thread wrote in this block is visible."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(float* out) {
          __shared__ float s[32], unused[4];
          if (blockIdx.x == 0) s[threadIdx.x] = threadIdx.x;  // block 1 never writes s
          __syncthreads();
          out[blockIdx.x * 32 + threadIdx.x] = s[31 - threadIdx.x] + 0.f * unused[0];
        }""")
    out = torch.zeros(64)
    rcuda.launch(k, (2,), (32,), (rcuda.ptr(out),))
    assert torch.isnan(out[:32]).all(), "unused[] was never written: NaN poison expected"
    k2 = kernel(tmp_path, """
        extern "C" __global__ void k(float* out) {
          __shared__ float s[32];
          if (blockIdx.x == 0) s[threadIdx.x] = threadIdx.x;
          __syncthreads();
          out[blockIdx.x * 32 + threadIdx.x] = s[31 - threadIdx.x];
        }""")
    rcuda.launch(k2, (2,), (32,), (rcuda.ptr(out),))
    np.testing.assert_array_equal(out[:32].numpy(), np.arange(31, -1, -1))
    assert torch.isnan(out[32:]).all(), "block 1 must not see block 0's shared memory"


def test_warp_shuffles_and_votes(tmp_path):
    """__shfl_xor/_sync/_up/_down and __ballot/__any/__all follow CUDA's lane rules."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(int* out) {
          const int lane = threadIdx.x % 32;
          int* o = out + threadIdx.x * 7;
          o[0] = __shfl_xor_sync(0xffffffffu, lane, 5);
          o[1] = __shfl_sync(0xffffffffu, lane * 10, 3);
          o[2] = __shfl_up_sync(0xffffffffu, lane, 2);
          o[3] = __shfl_down_sync(0xffffffffu, lane, 4, 8);
          o[4] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
          o[5] = __any_sync(0xffffffffu, lane == 17) + 2 * __all_sync(0xffffffffu, lane < 31);
          float s = lane;
          for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
          __syncwarp();
          o[6] = (int)s;
        }""")
    out = torch.zeros(64 * 7, dtype=torch.int32)
    rcuda.launch(k, (1,), (64,), (rcuda.ptr(out),))
    o = out.view(64, 7).numpy()
    lane = np.arange(64) % 32
    np.testing.assert_array_equal(o[:, 0], lane ^ 5)
    np.testing.assert_array_equal(o[:, 1], np.full(64, 30))
    np.testing.assert_array_equal(o[:, 2], np.where(lane >= 2, lane - 2, lane))
    np.testing.assert_array_equal(o[:, 3], np.where(lane % 8 + 4 < 8, lane + 4, lane))
    ballot = sum(1 << i for i in range(32) if i % 3 == 0)
    np.testing.assert_array_equal(o[:, 4].astype(np.uint32), np.full(64, ballot, np.uint32))
    np.testing.assert_array_equal(o[:, 5], np.full(64, 1))
    np.testing.assert_array_equal(o[:, 6], np.full(64, sum(range(32))))


def test_mma_ldmatrix_and_cp_async_follow_the_hardware_layouts(tmp_path):
    """pagedlab_ptx.cuh under emulation: cp.async (with zero-fill) lands at its wait, ldmatrix
    hands out the PTX ISA's fragments, and mma.sync m16n8k16 computes D = A B + C in fp32 —
    checked against numpy on random fp16 matrices."""
    k = kernel(tmp_path, """
        #include <cuda_fp16.h>
        #include "pagedlab_ptx.cuh"
        // A [16 x 16] row-major, B [16 x 8] given as Bt [8 x 16] (each row one column of B),
        // D [16 x 8] fp32. One warp.
        extern "C" __global__ void k(float* d, const __half* a, const __half* bt, const float* c) {
          __shared__ __align__(16) __half sa[16 * 16];
          __shared__ __align__(16) __half sb[8 * 16];
          const int lane = threadIdx.x;
          // 32 16-byte chunks of A, 16 of Bt (the last 8 bytes of Bt's row 7 zero-filled)
          cp_async_16(smem_addr(sa + lane * 8), a + lane * 8, 16);
          if (lane < 16) cp_async_16(smem_addr(sb + lane * 8), bt + lane * 8, lane == 15 ? 8 : 16);
          cp_async_commit();
          cp_async_wait<0>();
          __syncwarp();
          unsigned fa[4], fb[4];
          // A: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
          ldmatrix_x4(fa, smem_addr(sa + ((lane & 7) + ((lane >> 3) & 1) * 8) * 16 + (lane >> 4) * 8));
          // B (col-major = Bt rows): matrices (k 0-7), (k 8-15) for b0, b1; lanes 16.. repeat
          ldmatrix_x4(fb, smem_addr(sb + (lane & 7) * 16 + ((lane >> 3) & 1) * 8));
          const int g = lane / 4, t = lane % 4;
          float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
                          c[(g + 8) * 8 + 2 * t + 1]};
          mma_16816(acc, fa, fb[0], fb[1], __half());
          d[g * 8 + 2 * t] = acc[0]; d[g * 8 + 2 * t + 1] = acc[1];
          d[(g + 8) * 8 + 2 * t] = acc[2]; d[(g + 8) * 8 + 2 * t + 1] = acc[3];
        }""", options=(f"-I{rcuda.INCLUDE_DIR}",))
    rng = np.random.default_rng(0)
    a = torch.from_numpy(rng.standard_normal((16, 16)).astype(np.float16))
    bt = torch.from_numpy(rng.standard_normal((8, 16)).astype(np.float16))
    c = torch.from_numpy(rng.standard_normal((16, 8)).astype(np.float32))
    d = torch.zeros(16, 8)
    rcuda.launch(k, (1,), (32,), (rcuda.ptr(d), rcuda.ptr(a), rcuda.ptr(bt), rcuda.ptr(c)))
    b = bt.float().numpy().T.copy()
    b[12:, 7] = 0.0  # zero-filled by cp.async (src_bytes = 8)
    expect = a.float().numpy().astype(np.float64) @ b + c.numpy()
    np.testing.assert_allclose(d.numpy(), expect, rtol=1e-5, atol=1e-5)


def test_printf_reaches_stdout(tmp_path, capfd):
    """printf in a kernel prints (a student's first debugging tool works under emulation)."""
    k = kernel(tmp_path, """
        #include <cstdio>
        extern "C" __global__ void k(const int* x) {
          if (threadIdx.x == 1) printf("block %d thread %d sees %d\\n", blockIdx.x, threadIdx.x, x[1]);
        }""")
    x = torch.tensor([5, 42], dtype=torch.int32)
    rcuda.launch(k, (1,), (4,), (rcuda.ptr(x),))
    assert "block 0 thread 1 sees 42" in capfd.readouterr().out


def test_scalar_of_the_wrong_type_is_refused(tmp_path):
    """A float passed where the kernel takes an int (read as garbage bits on a GPU) is a
    TypeError naming the parameter."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(int* out, int n) { out[0] = n; }""")
    out = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"parameter 1 \(n\)"):
        rcuda.launch(k, (1,), (1,), (rcuda.ptr(out), np.float32(3)))
    rcuda.launch(k, (1,), (1,), (rcuda.ptr(out), np.int32(3)))
    assert int(out[0]) == 3


def test_python_scalars_are_refused_where_cupy_would_pass_8_bytes(tmp_path):
    """CuPy passes a Python float as a double and a Python int as a 64-bit integer: into a
    4-byte float or int parameter the GPU reads garbage, so the emulator refuses them too
    (naming the parameter and the NumPy type to pass); into an 8-byte parameter they fit."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(float* out, float s, int n, long long m) {
          out[0] = s * n + (float)m; }""")
    out = torch.zeros(1)
    for args, name, fix in (((0.5, np.int32(2)), r"parameter 1 \(s\)", "np.float32"),
                            ((np.float32(0.5), 2), r"parameter 2 \(n\)", "np.int32")):
        with pytest.raises(TypeError, match=name) as err:
            rcuda.launch(k, (1,), (1,), (rcuda.ptr(out), *args, np.int64(0)))
        assert fix in str(err.value)
    rcuda.launch(k, (1,), (1,), (rcuda.ptr(out), np.float32(0.5), np.int32(2), 3))
    assert float(out[0]) == 4.0


# ----------------------------------------------------------------------------- clear errors


def test_out_of_bounds_write_names_kernel_array_index_and_thread(tmp_path):
    """One element past the end of an argument array stops the launch with every coordinate a
    student needs; the caller's memory is left as it was."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(float* out, int n) {
          const int i = blockIdx.x * blockDim.x + threadIdx.x;
          if (i <= n) out[i] = 1.f;  // BUG: <= writes out[n]
        }""")
    out = torch.zeros(100)
    with pytest.raises(KernelOutOfBoundsError) as err:
        rcuda.launch(k, (4,), (32,), (rcuda.ptr(out), np.int32(100)))
    msg = str(err.value)
    for part in ("kernel k", "out-of-bounds write", "out at element index 100", "block (3, 0, 0)",
                 "thread (4, 0, 0)"):
        assert part in msg, f"{part!r} missing from: {msg}"
    assert (out == 0).all()


def test_write_to_a_const_input_is_reported(tmp_path):
    """A `const T*` parameter is mapped read-only: writing through a cast is caught."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(const float* x) { const_cast<float*>(x)[3] = 0.f; }""")
    x = torch.ones(8)
    with pytest.raises(KernelOutOfBoundsError, match=r"write to x\[3\].*const input"):
        rcuda.launch(k, (1,), (1,), (rcuda.ptr(x),))


def test_barrier_in_a_divergent_branch_is_a_deadlock_error(tmp_path):
    """`if (threadIdx.x < 64) __syncthreads();` names the barrier and the threads that never
    reach it, instead of hanging."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(float* out) {
          if (threadIdx.x < 64) {
            out[threadIdx.x] = 1.f;
            __syncthreads();
          }
        }""")
    out = torch.zeros(128)
    with pytest.raises(KernelDeadlockError) as err:
        rcuda.launch(k, (1,), (128,), (rcuda.ptr(out),))
    msg = str(err.value)
    assert "k.cu:5" in msg and "64..127" in msg and "0..63" in msg, msg


def test_different_barriers_are_a_deadlock_error(tmp_path):
    """Threads waiting at two different __syncthreads() are named with both lines."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(float* out) {
          if (threadIdx.x % 2) {
            __syncthreads();
          } else {
            __syncthreads();
          }
          out[threadIdx.x] = 1.f;
        }""")
    with pytest.raises(KernelDeadlockError, match=r"k\.cu:4.*k\.cu:6|k\.cu:6.*k\.cu:4"):
        rcuda.launch(k, (1,), (64,), (rcuda.ptr(torch.zeros(64)),))


def test_shuffle_with_a_lane_that_exited_is_a_deadlock_error(tmp_path):
    """A full-mask shuffle that half the warp never executes names the missing lanes."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(float* out) {
          if (threadIdx.x >= 16) return;
          out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
        }""")
    with pytest.raises(KernelDeadlockError, match=r"__shfl_xor_sync.*16\.\.31.*exited"):
        rcuda.launch(k, (1,), (32,), (rcuda.ptr(torch.zeros(32)),))


# ----------------------------------------------------------------------------- Hopper (Task 5.6)

HOPPER_KERNEL = """
    #include <cuda_fp16.h>
    #include "pagedlab_ptx.cuh"
    #include "pagedlab_wgmma.cuh"
    using namespace pagedlab;
    // D [64 x 64] = A [64 x 64] * B^T, A and B (rows along K) brought by TMA in the 128-byte
    // swizzle, multiplied by 4 wgmma m64n64k16 of one warpgroup. BYTES: what the barrier expects.
    extern "C" __global__ void k(float* d, const __half* a, const __half* b,
                                 const __grid_constant__ TmaDesc amap,
                                 const __grid_constant__ TmaDesc bmap) {
      extern __shared__ __align__(1024) unsigned char smem[];
      const unsigned sa = smem_addr(smem), sb = sa + 8192, bar = sa + 16384;
      if (threadIdx.x == 0) { mbar_init(bar, 1); fence_mbarrier_init(); }
      __syncthreads();
      if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar, BYTES);
        tma_load_2d(sa, amap, 0, 0, bar);
        tma_load_2d(sb, bmap, 0, 0, bar);
      }
      mbar_wait(bar, 0);
      float acc[32];
      for (int i = 0; i < 32; ++i) acc[i] = 0.f;
      wgmma_fence();
      for (int kd = 0; kd < 4; ++kd)
        wgmma_ss(WgmmaShape<64>(), acc, wgmma_desc(sa + 32 * kd, 16, 1024, 1),
                 wgmma_desc(sb + 32 * kd, 16, 1024, 1), kd > 0, __half());
      wgmma_commit();
      wgmma_wait<0>();
      const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
      for (int j = 0; j < 8; ++j)
        for (int e = 0; e < 4; ++e)
          d[(16 * w + g + 8 * (e / 2)) * 64 + 8 * j + 2 * t + e % 2] = acc[4 * j + e];
    }"""


def _hopper_inputs():
    from reference import tma

    rng = np.random.default_rng(1)
    a = torch.from_numpy(rng.standard_normal((1, 1, 64, 64)).astype(np.float16))
    b = torch.from_numpy(rng.standard_normal((1, 1, 64, 64)).astype(np.float16))
    return a, b, tma.tensor_map(a, 64), tma.tensor_map(b, 64)


def test_tma_mbarrier_and_wgmma_follow_the_hardware_layouts(tmp_path):
    """pagedlab_wgmma.cuh under emulation: TMA boxes land in the 128-byte swizzle and count
    their bytes on the mbarrier, the waiting warpgroup wakes, and wgmma m64n64k16 through
    swizzled K-major descriptors (start advanced 32 bytes per k-step) computes D = A B^T in the
    accumulator layout — checked against numpy. (The 128-byte swizzle's agreement with the
    hardware rests on Lab 5's Hopper solution, GPU-tested, passing its tests emulated, and on
    `pagedlab bench agreement`; the other swizzle modes follow the PTX ISA's canonical layouts
    and have not been compared with a GPU.)"""
    k = kernel(tmp_path, HOPPER_KERNEL, options=(f"-I{rcuda.INCLUDE_DIR}", "-DBYTES=16384"))
    a, b, amap, bmap = _hopper_inputs()
    d = torch.zeros(64, 64)
    rcuda.launch(k, (1,), (128,), (rcuda.ptr(d), rcuda.ptr(a), rcuda.ptr(b), amap, bmap),
                 shared_mem=16384 + 64)
    expect = a[0, 0].double().numpy() @ b[0, 0].double().numpy().T
    np.testing.assert_allclose(d.numpy(), expect, rtol=1e-4, atol=1e-3)


def test_an_mbarrier_that_never_completes_is_a_deadlock_error(tmp_path):
    """A barrier told to expect more bytes than the copies bring never completes its phase: the
    error names the waiting threads, the barrier and the missing transaction bytes, and the
    lines of the kernel's own mbar_wait and mbar_init calls (not of the header's wrappers)."""
    k = kernel(tmp_path, HOPPER_KERNEL, options=(f"-I{rcuda.INCLUDE_DIR}", "-DBYTES=20480"))
    a, b, amap, bmap = _hopper_inputs()
    d = torch.zeros(64, 64)
    with pytest.raises(KernelDeadlockError) as err:
        rcuda.launch(k, (1,), (128,), (rcuda.ptr(d), rcuda.ptr(a), rcuda.ptr(b), amap, bmap),
                     shared_mem=16384 + 64)
    msg = str(err.value)
    assert "0..127 wait (mbar_wait" in msg and "4096 transaction bytes" in msg, msg
    lines = (tmp_path / "k.cu").read_text().splitlines()
    wait = next(i for i, line in enumerate(lines, 1) if "mbar_wait(bar, 0)" in line)
    init = next(i for i, line in enumerate(lines, 1) if "mbar_init(bar, 1)" in line)
    assert f"(mbar_wait, line {wait})" in msg and f"initialised at line {init}" in msg, msg


HOPPER_MISTAKES = {
    # name: (kernel body after `bar` is set up, what the error must say)
    "barrier used before mbar_init": ("mbar_arrive(bar);", "which no mbar_init of this block"),
    "barrier overwritten": ("if (threadIdx.x == 0) { mbar_init(bar, 1); smem[16384] = 7; }\n"
                            "__syncthreads(); mbar_arrive(bar);", "something overwrote"),
    "named barrier 0": ("named_bar_sync(0, 128);", "the id must be 1..15"),
    "named barrier of part of a warp": ("if (threadIdx.x % 32 < 16) named_bar_sync(1, 64);",
                                        "executed by whole warps"),
    "a TMA box off its swizzle period": ("if (threadIdx.x == 0) { mbar_init(bar, 1);\n"
                                         "tma_load_2d(sa + 128, amap, 0, 0, bar); }",
                                         "must start 1024-byte aligned"),
    "a TMA box past the launch's shared memory": (
        "if (threadIdx.x == 0) { mbar_init(bar, 1); tma_load_2d(sa + 16384 + 1024, amap, 0, 0, bar); }",
        "past the launch's shared memory"),
}


@pytest.mark.parametrize("mistake", sorted(HOPPER_MISTAKES))
def test_hopper_mistakes_are_named(tmp_path, mistake):
    """Misused mbarriers, named barriers and TMA loads stop with an error that says what went
    wrong (an uninitialised or overwritten barrier, barrier id 0 or half a warp at a named
    barrier, a box
    misaligned or outside the launch's shared memory) instead of a wrong answer or a hang."""
    body, expect = HOPPER_MISTAKES[mistake]
    k = kernel(tmp_path, '''
        #include <cuda_fp16.h>
        #include "pagedlab_ptx.cuh"
        #include "pagedlab_wgmma.cuh"
        using namespace pagedlab;
        extern "C" __global__ void k(const __half* a, const __grid_constant__ TmaDesc amap) {
          extern __shared__ __align__(1024) unsigned char smem[];
          const unsigned sa = smem_addr(smem), bar = sa + 16384;
          ''' + body + '''
        }''', options=(f"-I{rcuda.INCLUDE_DIR}",))
    a, _, amap, _ = _hopper_inputs()
    with pytest.raises((KernelFaultError, KernelDeadlockError)) as err:
        rcuda.launch(k, (1,), (128,), (rcuda.ptr(a), amap), shared_mem=16384 + 64)
    assert expect in str(err.value), str(err.value)


def test_wgmma_of_part_of_a_warpgroup_is_a_deadlock_error(tmp_path):
    """A wgmma that only some threads of the warpgroup issue names the waiting and the
    missing threads instead of hanging."""
    k = kernel(tmp_path, """
        #include <cuda_fp16.h>
        #include "pagedlab_wgmma.cuh"
        using namespace pagedlab;
        extern "C" __global__ void k(float* out) {
          extern __shared__ __align__(1024) unsigned char smem[];
          float acc[32] = {};
          if (threadIdx.x < 96)
            wgmma_ss(WgmmaShape<64>(), acc, wgmma_desc(0, 16, 1024, 1), wgmma_desc(0, 16, 1024, 1),
                     0, __half());
          out[threadIdx.x] = acc[0];
        }""", options=(f"-I{rcuda.INCLUDE_DIR}",))
    out = torch.zeros(128)
    with pytest.raises(KernelDeadlockError) as err:
        rcuda.launch(k, (1,), (128,), (rcuda.ptr(out),), shared_mem=8192)
    msg = str(err.value)
    assert "0..95 wait in wgmma" in msg and "96..127" in msg and "exited" in msg, msg


def test_shared_memory_over_the_limit_is_refused(tmp_path):
    """Asking for more dynamic shared memory than a block can have is an error, not a crash."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(float* out) { extern __shared__ float s[]; out[0] = s[0]; }""")
    with pytest.raises(KernelFaultError, match="shared memory"):
        rcuda.launch(k, (1,), (1,), (rcuda.ptr(torch.zeros(1)),), shared_mem=1 << 20)


def test_a_write_past_the_launchs_shared_memory_is_a_fault(tmp_path):
    """A kernel that stores more than the launch's dynamic shared memory (shared_mem too small
    for what it stores: on a GPU an out-of-range shared address) fails with KernelFaultError
    naming the byte, the block and shared_mem; the same kernel with enough is fine, and so is a
    kernel whose static __shared__ array follows the dynamic part."""
    k = kernel(tmp_path, """
        extern "C" __global__ void k(float* out) {
          extern __shared__ float s[];
          s[threadIdx.x] = threadIdx.x;  // blockDim.x floats
          __syncthreads();
          out[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
        }""")
    out = torch.zeros(256)
    rcuda.launch(k, (2,), (256,), (rcuda.ptr(out),), shared_mem=256 * 4)
    assert out[0] == 255
    with pytest.raises(KernelFaultError) as err:
        rcuda.launch(k, (2,), (256,), (rcuda.ptr(out),), shared_mem=128 * 4)
    msg = str(err.value)
    assert "byte 512" in msg and "block (0,0,0)" in msg and "shared_mem=512" in msg, msg
    both = kernel(tmp_path, """
        extern "C" __global__ void k(float* out) {
          extern __shared__ float s[];
          __shared__ float t[64];
          s[threadIdx.x] = 1.0f;
          t[threadIdx.x] = 2.0f;
          __syncthreads();
          out[threadIdx.x] = s[threadIdx.x] + t[63 - threadIdx.x];
        }""")
    out = torch.zeros(64)
    rcuda.launch(both, (3,), (64,), (rcuda.ptr(out),), shared_mem=64 * 4)
    assert bool((out == 3).all())


# ----------------------------------------------------------------------------- Lab 4 kernels

LAB4 = "lab04_decode_kernels"
needs_solutions = pytest.mark.skipif(not (SOLUTIONS_DIR / LAB4).is_dir(),
                                     reason="needs the solutions/ folder")


def decode_case(seed, lens, num_q_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                dtype=torch.float16, **kw):
    from reference.inputs import make_decode_case
    from reference.oracle import paged_decode_ref

    c = make_decode_case(seed, lens, num_q_heads, num_kv_heads, head_size, block_size,
                         dtype=np.float32, **kw)
    args = (torch.from_numpy(c.query).to(dtype), torch.from_numpy(c.kv.key_cache).to(dtype),
            torch.from_numpy(c.kv.value_cache).to(dtype), torch.from_numpy(c.kv.block_tables),
            torch.from_numpy(c.kv.context_lens))
    ref, lse = paged_decode_ref(args[0].float().numpy(), args[1].float().numpy(),
                                args[2].float().numpy(), c.kv.block_tables, c.kv.context_lens,
                                c.scale)
    return args, c.scale, ref, lse


def lab4(kernel_dir=None):
    """The Lab 4 solution module; with ``kernel_dir``, a fresh copy that loads its .cu files
    from there (a planted bug)."""
    import importlib.util
    import sys

    path = SOLUTIONS_DIR / LAB4 / "solution.py"
    if kernel_dir is None:
        from reference.loader import load_impl

        return load_impl(LAB4, "solution")
    spec = importlib.util.spec_from_file_location(f"_emu_lab4_{kernel_dir.name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while it is executed
    spec.loader.exec_module(mod)
    mod.KERNEL_DIR = kernel_dir
    return mod


def planted(tmp_path, file: str, old: str, new: str):
    """A copy of Lab 4's solution kernels with one text edit in ``file`` (exactly once)."""
    dst = tmp_path / LAB4  # named after its lab, as mutant copies are: given headers resolve
    shutil.copytree(SOLUTIONS_DIR / LAB4, dst, ignore=shutil.ignore_patterns("*.py", "mutants"))
    text = (dst / file).read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {file}"
    (dst / file).write_text(text.replace(old, new))
    return lab4(dst)


@needs_solutions
@pytest.mark.parametrize("version", ["naive", "v0", "v1", "v2", "v3", "v4", "v5", "v6"])
def test_lab4_solution_kernels_match_the_oracle_emulated(version):
    """Every Lab 4 solution kernel, through its own launcher on CPU tensors, matches the
    float64 oracle within the GPU tests' tolerance (NaN-poisoned caches and output buffer);
    the split-K kernels also with a forced split (the reduce kernel runs) and their lse."""
    from labs.lab04_decode_kernels._cases import assert_matches

    impl = lab4()
    args, scale, ref, lse = decode_case(7, [1, 17, 0, 130, 64], head_size=64, block_size=16)
    out = torch.full_like(args[0], float("nan"))
    got = impl.KERNELS[version](*args, scale, out=out)
    assert_matches(got, ref, args[4].numpy(), "float16", f"{version} (emulated)")
    if version in ("v3", "v4", "v5", "v6"):
        got, got_lse = impl.KERNELS[version](*args, scale, plan=impl.SplitKVPlan(3, 64),
                                             max_context_len=192, return_lse=True)
        assert_matches(got, ref, args[4].numpy(), "float16", f"{version} split (emulated)")
        finite = np.isfinite(lse)
        np.testing.assert_allclose(got_lse.numpy()[finite], lse[finite], rtol=1e-3, atol=1e-3)
        assert np.isneginf(got_lse.numpy()[~finite]).all()


@needs_solutions
def test_planted_out_of_bounds_block_table_read(tmp_path):
    """v1 reading one block-table entry past a sequence's last token (`<=` for `<`): the last
    sequence fills its table, so the read leaves block_tables — reported with the array, the
    index and the thread, where a GPU reads garbage silently."""
    impl = planted(tmp_path, "decode_v1.cu", "t < len; t += NUM_WARPS", "t <= len; t += NUM_WARPS")
    args, scale, ref, lse = decode_case(3, [5, 64], head_size=64, block_size=16, num_q_heads=2,
                                        num_kv_heads=2)
    args = args[:3] + (args[3][:, :4].contiguous(),) + args[4:]  # sequence 1 fills its 4 blocks
    with pytest.raises(KernelOutOfBoundsError) as err:
        impl.KERNELS["v1"](*args, scale)
    msg = str(err.value)
    assert "paged_decode_v1" in msg and "block_tables at element index 8" in msg, msg
    assert "block (1, " in msg and "thread (" in msg, msg


@needs_solutions
def test_planted_missing_barrier_before_shared_memory_reuse(tmp_path):
    """v0 without the barrier that ends block_max: block_sum then overwrites the shared
    reduction slots that slower warps have not read yet — a wrong answer under emulation."""
    impl = planted(tmp_path, "decode_v0.cu",
                   "for (int w = 1; w < NUM_WARPS; ++w) r = fmaxf(r, red[w]);\n  __syncthreads();",
                   "for (int w = 1; w < NUM_WARPS; ++w) r = fmaxf(r, red[w]);")
    args, scale, ref, lse = decode_case(5, [300, 200], head_size=64, block_size=16)
    got = impl.KERNELS["v0"](*args, scale).double().numpy()
    bad = ~np.isclose(got, ref, rtol=1e-2, atol=1e-2)
    assert bad.any(), "the missing __syncthreads() went unnoticed"


@needs_solutions
def test_planted_missing_barrier_before_reading_shared_memory(tmp_path):
    """v4 without the barrier after staging queries and block ids: warps read shared memory no
    thread wrote yet — poisoned NaN under emulation, never a lucky pass."""
    impl = planted(tmp_path, "decode_v4.cu",
                   "s_blocks[i] = table[i];\n  __syncthreads();", "s_blocks[i] = table[i];")
    args, scale, ref, lse = decode_case(5, [300, 200], head_size=64, block_size=16)
    out = impl.KERNELS["v4"](*args, scale)
    assert not np.allclose(out.double().numpy(), ref, rtol=1e-2, atol=1e-2)


@needs_solutions
def test_planted_barrier_in_divergent_branch(tmp_path):
    """v0's block_max barrier moved inside `if (lane == 0)`: a deadlock error naming the
    line and the threads, never a hang."""
    impl = planted(tmp_path, "decode_v0.cu",
                   "if (threadIdx.x % WARP_SIZE == 0) red[threadIdx.x / WARP_SIZE] = v;\n"
                   "  __syncthreads();\n  float r = red[0];",
                   "if (threadIdx.x % WARP_SIZE == 0) {\n    red[threadIdx.x / WARP_SIZE] = v;\n"
                   "    __syncthreads();\n  }\n  float r = red[0];")
    args, scale, ref, lse = decode_case(5, [30, 20], head_size=64, block_size=16)
    with pytest.raises(KernelDeadlockError, match=r"decode_v0\.cu:\d+.*__syncthreads|"
                                                 r"__syncthreads.*decode_v0\.cu:\d+"):
        impl.KERNELS["v0"](*args, scale)


def test_without_emulation_cpu_tensors_still_raise():
    """Emulation is opt-in: without it the launchers keep refusing CPU tensors (the validation
    tests rely on it)."""
    from reference.errors import DeviceMismatchError

    if not (SOLUTIONS_DIR / LAB4).is_dir():
        pytest.skip("needs the solutions/ folder")
    args, scale, ref, lse = decode_case(1, [3], head_size=64)
    with emulate.emulation(False), pytest.raises(DeviceMismatchError):
        lab4().KERNELS["v1"](*args, scale)
    assert REPO_ROOT.is_dir()


# ----------------------------------------------------------------------------- Lab 5 kernels

LAB5 = "lab05_prefill_kernels"


@pytest.mark.skipif(not (SOLUTIONS_DIR / LAB5).is_dir(), reason="needs the solutions/ folder")
@pytest.mark.parametrize("kernel_name, dtype, alibi", [
    ("naive", "float32", False), ("naive", "float16", True), ("tiled", "float16", False),
    ("tiled", "bfloat16", True), ("tc", "float16", False), ("tc", "bfloat16", True)])
def test_lab5_solution_kernels_match_the_oracle_emulated(kernel_name, dtype, alibi):
    """Every Lab 5 solution kernel (naive, tiled, tensor-core), through its launcher on CPU
    tensors, matches the float64 oracle within the GPU tests' tolerance: ragged query lengths
    over history, GQA, ALiBi, a sequence with a single new token."""
    from labs.lab05_prefill_kernels._cases import check_close, launcher, make_batch, oracle
    from reference.loader import load_impl

    impl = load_impl(LAB5, "solution")
    batch = make_batch(3, [5, 1, 40], [0, 17, 30], 4, 2, 64, 16, dtype=dtype, alibi=alibi,
                       device="cpu")
    out = launcher(impl, kernel_name)(**batch)
    check_close(out, oracle(batch), batch, dtype=dtype, what=f"{kernel_name} (emulated)")


def test_endless_loop_stops_with_a_timeout(tmp_path, monkeypatch):
    """A kernel that never ends stops after PAGEDLAB_EMU_TIMEOUT seconds of CPU time with an
    error naming the kernel and a thread, instead of hanging the test run."""
    from reference.errors import KernelTimeoutError

    monkeypatch.setenv("PAGEDLAB_EMU_TIMEOUT", "1")
    k = kernel(tmp_path, """
        extern "C" __global__ void k(volatile int* flag) { while (*flag == 0) {} }""")
    with pytest.raises(KernelTimeoutError, match=r"kernel k, block \(0, 0, 0\)"):
        rcuda.launch(k, (1,), (2,), (rcuda.ptr(torch.zeros(1, dtype=torch.int32)),))


# ----------------------------------------------------------------------------- racecheck

RACE_KERNELS = """
    #include "pagedlab_ptx.cuh"
    // Clean: write, barrier, read another warp's slot, barrier, reuse.
    extern "C" __global__ void clean(float* out) {
      __shared__ float s[64];
      s[threadIdx.x] = threadIdx.x;
      __syncthreads();
      const float v = s[63 - threadIdx.x];
      __syncthreads();
      s[threadIdx.x] = 2.f * v;
      __syncthreads();
      out[threadIdx.x] = s[threadIdx.x ^ 32];
    }
    // RAW across warps: the barrier is missing.
    extern "C" __global__ void raw(float* out) {
      __shared__ float s[64];
      s[threadIdx.x] = threadIdx.x;
      out[threadIdx.x] = s[63 - threadIdx.x];
    }
    // WAR: warp 1 overwrites what warp 0 still reads (no barrier before reuse).
    extern "C" __global__ void war(float* out) {
      __shared__ float s[64];
      s[threadIdx.x] = threadIdx.x;
      __syncthreads();
      const float v = s[63 - threadIdx.x];
      s[threadIdx.x] = v;
      out[threadIdx.x] = v;
    }
    // Lanes of one warp: ordered by __syncwarp, unordered without it.
    extern "C" __global__ void lanes(float* out, int sync) {
      __shared__ float s[32];
      s[threadIdx.x] = threadIdx.x;
      if (sync) __syncwarp();
      out[threadIdx.x] = s[threadIdx.x ^ 1];
    }
    // A shuffle exchanges registers, not memory: it orders no shared-memory access.
    extern "C" __global__ void shfl_only(float* out) {
      __shared__ float s[32];
      s[threadIdx.x] = threadIdx.x;
      const float v = __shfl_sync(0xffffffffu, 1.f * threadIdx.x, 0);
      out[threadIdx.x] = s[threadIdx.x ^ 1] + v;
    }
    // cp.async: reading the destination before the wait that lands it is a hazard.
    extern "C" __global__ void async_copy(const float* in, float* out, int early) {
      __shared__ __align__(16) float s[64 * 4];
      cp_async_16(__cvta_generic_to_shared(&s[4 * threadIdx.x]), in + 4 * threadIdx.x, 16);
      cp_async_commit();
      if (!early) cp_async_wait_all();
      __syncthreads();
      out[threadIdx.x] = s[4 * (63 - threadIdx.x)];
      if (early) cp_async_wait_all();
    }
    // A ring slot refilled by cp.async after the warp read it: each lane reads its neighbour's
    // 16 bytes, then refills its own. Ordered by the __syncwarp between (v6's ring), racy
    // without it; the cp.async is issued after the read, so no read of it is in flight.
    extern "C" __global__ void refill(const float* in, float* out, int sync) {
      __shared__ __align__(16) float s[32 * 4];
      const int lane = threadIdx.x;
      s[4 * lane] = lane;
      __syncwarp();
      const float v = s[4 * ((lane + 1) % 32)];
      if (sync) __syncwarp();
      cp_async_16(__cvta_generic_to_shared(&s[4 * lane]), in + 4 * lane, 16);
      cp_async_commit();
      cp_async_wait_all();
      __syncwarp();
      out[lane] = v + s[4 * ((lane + 1) % 32)];
    }
    // Atomics never race.
    extern "C" __global__ void atomics(int* out) {
      __shared__ int n;
      if (threadIdx.x == 0) n = 0;
      __syncthreads();
      atomicAdd(&n, 1);
      __syncthreads();
      if (threadIdx.x == 0) out[0] = n;
    }
"""


def _race(tmp_path, name, *args, block=64):
    k = kernel(tmp_path, RACE_KERNELS, name)
    with emulate.racecheck() as report:
        rcuda.launch(k, (2,), (block,), args)
    assert report.launches == 1
    return report


def test_racecheck_passes_ordered_kernels(tmp_path):
    """Accesses ordered by __syncthreads, by __syncwarp within a warp, by the cp.async wait, and
    atomics: no hazard, and the results are the plain build's."""
    out = torch.zeros(64)
    assert _race(tmp_path, "clean", rcuda.ptr(out)).hazards == []
    assert out.tolist() == [2.0 * (63 - (t ^ 32)) for t in range(64)]
    assert _race(tmp_path, "lanes", rcuda.ptr(out), np.int32(1), block=32).hazards == []
    src = torch.arange(256, dtype=torch.float32)
    assert _race(tmp_path, "async_copy", rcuda.ptr(src), rcuda.ptr(out), np.int32(0)).hazards == []
    assert out.tolist() == [float(4 * (63 - t)) for t in range(64)]
    count = torch.zeros(1, dtype=torch.int32)
    assert _race(tmp_path, "atomics", rcuda.ptr(count)).hazards == []
    assert count.item() == 64


@pytest.mark.parametrize("name, kind", [("raw", "RAW"), ("war", "WAR")])
def test_racecheck_reports_a_missing_barrier(tmp_path, name, kind):
    """A missing __syncthreads between two warps' accesses is reported with the kernel, the
    shared array and offset, both (block, thread) pairs and the source lines. (Warp 1's read
    of warp 0's slot is RAW; its write over a slot warp 0 read is WAR: both kernels have both.)"""
    out = torch.zeros(64)
    report = _race(tmp_path, name, rcuda.ptr(out))
    kinds = [h.kind for h in report.hazards]
    assert kind in kinds, f"{name}: expected a {kind} hazard, got {kinds}"
    h = report.hazards[kinds.index(kind)]
    assert h.kernel == name
    assert h.location.startswith("s+") and h.block == "(0, 0, 0)"
    assert h.first[0] != h.second[0]
    assert h.first[1].startswith("k.cu:") and h.second[1].startswith("k.cu:"), h
    assert "RACECHECK SUMMARY" in report.summary() and f"kernel {name}" in report.summary()


def test_racecheck_orders_lanes_only_through_collectives(tmp_path):
    """Lanes of one warp that exchange through shared memory without __syncwarp race (the GPU
    does not run a warp in lockstep since Volta)."""
    out = torch.zeros(32)
    report = _race(tmp_path, "lanes", rcuda.ptr(out), np.int32(0), block=32)
    assert sorted(h.kind for h in report.hazards) == ["RAW", "WAR"]


def test_racecheck_a_shuffle_orders_no_memory(tmp_path):
    """A __shfl_sync between one lane's write and another's read is no __syncwarp: the pair is
    a hazard (as compute-sanitizer's racecheck reports it)."""
    out = torch.zeros(32)
    report = _race(tmp_path, "shfl_only", rcuda.ptr(out), block=32)
    assert "RAW" in [h.kind for h in report.hazards]


def test_racecheck_sees_a_read_before_the_cp_async_wait(tmp_path):
    """A cp.async destination read by another thread before the wait that lands it is a hazard
    (on the GPU a race the copy usually wins)."""
    src = torch.arange(256, dtype=torch.float32)
    out = torch.zeros(64)
    report = _race(tmp_path, "async_copy", rcuda.ptr(src), rcuda.ptr(out), np.int32(1))
    assert "WAR" in [h.kind for h in report.hazards]


def test_racecheck_a_cp_async_refill_after_a_syncwarp(tmp_path):
    """A cp.async that refills what lanes of its own warp read before a __syncwarp is ordered
    after those reads (v6's ring refills the slot the warp just used this way): no hazard.
    Without the __syncwarp, the neighbour's read may overlap the copy: a WAR hazard."""
    src = torch.arange(128, dtype=torch.float32)
    out = torch.zeros(32)
    ordered = _race(tmp_path, "refill", rcuda.ptr(src), rcuda.ptr(out), np.int32(1), block=32)
    assert ordered.hazards == [], ordered.summary()
    assert out.tolist() == [float((t + 1) % 32 + 4 * ((t + 1) % 32)) for t in range(32)]
    racy = _race(tmp_path, "refill", rcuda.ptr(src), rcuda.ptr(out), np.int32(0), block=32)
    assert "WAR" in [h.kind for h in racy.hazards], racy.summary()


def test_racecheck_env_raises_at_the_first_racy_launch(tmp_path, monkeypatch):
    """PAGEDLAB_EMU_RACECHECK=1 runs every launch under racecheck and stops at a hazard."""
    from reference.errors import KernelRaceError

    k = kernel(tmp_path, RACE_KERNELS, "raw")
    out = torch.zeros(64)
    monkeypatch.setenv(emulate.RACECHECK_ENV, "1")
    with pytest.raises(KernelRaceError, match=r"RAW hazard .* kernel raw on shared s\+"):
        rcuda.launch(k, (1,), (64,), (rcuda.ptr(out),))


def test_large_arrays_are_paged_in_lazily_and_still_fenced(tmp_path):
    """An argument array of 256 MiB or more is not copied up front: the pages a kernel touches
    come in on first access and go back after the launch (a 4 GiB cache costs what a kernel
    reads), and one element past the end still traps."""
    import mmap

    k = kernel(tmp_path, """
        extern "C" __global__ void k(float* big, long long n, long long extra) {
          const long long i = n - 1 - threadIdx.x * 1000003LL;
          big[i + extra] = big[i] + 1.f;
        }""")
    n = (300 << 20) // 4
    buf = mmap.mmap(-1, n * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    big = torch.frombuffer(buf, dtype=torch.float32)
    idx = torch.tensor([n - 1 - t * 1000003 for t in range(32)])
    big[idx] = 41.0
    rcuda.launch(k, (1,), (32,), (rcuda.ptr(big), np.int64(n), np.int64(0)))
    assert big[idx].tolist() == [42.0] * 32
    assert float(big[:1000].abs().sum()) == 0.0  # untouched pages stay as they were
    with pytest.raises(KernelOutOfBoundsError, match=r"out-of-bounds write of big at element "
                                                     rf"index {n}\b"):
        rcuda.launch(k, (1,), (1,), (rcuda.ptr(big), np.int64(n), np.int64(1)))


def test_agreement_tool_records_and_compares(tmp_path, capsys):
    """`pagedlab bench agreement`: a recording (here made on the emulated device) compared with
    the emulated device agrees exactly; a recording whose output was altered past the tests'
    tolerance is reported as DISAGREE with exit status 1."""
    from reference.tools.bench import agreement

    folder = tmp_path / "rec"
    only = "lab4-v1-ragged,lab5-tiled-varlen"
    assert agreement.main(["--record", str(folder), "--device", "emulate", "--only", only]) == 0
    assert agreement.main(["--compare", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "2/2 outputs agree" in out and "DISAGREE" not in out
    path = folder / "lab4-v1-ragged-f16.npz"
    data = dict(np.load(path))
    data["result_out"] = data["result_out"] + 0.05
    np.savez(path, **data)
    assert agreement.main(["--compare", str(folder)]) == 1
    assert "DISAGREE" in capsys.readouterr().out
