"""GPU measurement helpers shared by the kernel benchmarks (Labs 4 and 5).

Method (see the handouts): warm up first, time with CUDA events around many back-to-back
launches, take the median of several such runs, and rotate among input sets larger than L2 when
the workload would otherwise fit in cache. Ceilings are measured in the same run, on the same
device, so "% of ceiling" never mixes machines.
"""

from __future__ import annotations

import statistics


def time_cuda(fn, *, warmup: int = 5, iters: int = 20, repeats: int = 5) -> float:
    """Returns the median time of one ``fn()`` call in microseconds.

    Args:
        fn: launches the work on the current torch stream (no host sync inside).
        warmup: untimed calls first (compilation, caches, clocks).
        iters: calls between one pair of events.
        repeats: event pairs; the median is returned.
    """
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / iters)
    return statistics.median(samples)


def copy_ceiling_gbps(num_bytes: int = 2 << 30) -> float:
    """Measures device-to-device copy bandwidth (bytes read + written per second, in GB/s)."""
    import torch

    src = torch.empty(num_bytes // 2, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    us = time_cuda(lambda: dst.copy_(src), iters=10)
    del src, dst
    torch.cuda.empty_cache()
    return num_bytes / (us * 1e-6) / 1e9


def gemm_ceiling_tflops(n: int = 8192, dtype_name: str = "float16") -> float:
    """Measures a large square matrix product's rate (TFLOP/s) on random data."""
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    us = time_cuda(lambda: a @ b, iters=10)
    return 2 * n**3 / (us * 1e-6) / 1e12


def flashinfer_or_reason():
    """Returns (flashinfer module, None) when importable, else (None, why not)."""
    try:
        import flashinfer

        return flashinfer, None
    except Exception as exc:  # noqa: BLE001 — any import failure means "not measured"
        return None, f"{type(exc).__name__}: {exc}"
