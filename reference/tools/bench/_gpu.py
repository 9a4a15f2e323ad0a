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


def capture_graph(fn, calls: int):
    """Captures ``calls`` back-to-back calls of ``fn`` in a CUDA graph and returns the graph.

    NOTE: ``fn`` is first warmed up on a side stream, as torch's graph docs ask, so lazy
    initialisation (module loads, allocator pools) never lands inside the capture.

    Raises:
        RuntimeError: (torch's) ``fn`` cannot be captured, e.g. it synchronises.
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        for _ in range(calls):
            fn()
    return g


def measure(fn, *, graph: bool = True):
    """Times ``fn`` as replays of a CUDA graph of back-to-back calls (no host launch gaps).

    Python-side work in a launcher (validation, argument packing) is comparable to a short
    kernel's run time; timing eager calls back to back would then time the host. A graph holds
    only the launches, so its replay times the kernels. Slow baselines (over 20 ms a call) and
    calls that cannot be captured are timed eagerly, and the returned note says so.

    Args:
        fn: launches the work on the current torch stream and returns its output.
        graph: try a CUDA graph first.

    Returns:
        (µs per call, how it was timed: "graph" / "eager" / "eager (graph capture failed: ...)",
        the output of one untimed call).
    """
    import torch

    out = fn()
    torch.cuda.synchronize()
    single = time_cuda(fn, warmup=1, iters=1, repeats=1)
    if single > 20_000:  # a slow baseline: a few eager calls are plenty
        return time_cuda(fn, warmup=0, iters=1, repeats=3), "eager", out
    if graph:
        try:
            n = 10 if single < 1000 else 3
            g = capture_graph(fn, n)
            us = time_cuda(g.replay, warmup=3, iters=max(2, 200 // n), repeats=7) / n
            del g
            return us, "graph", out
        except Exception as exc:  # noqa: BLE001 — fall back to eager timing, say so
            torch.cuda.synchronize()
            how = f"eager (graph capture failed: {type(exc).__name__})"
            return time_cuda(fn, warmup=3, iters=20, repeats=7), how, out
    return time_cuda(fn, warmup=3, iters=20, repeats=7), "eager", out


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


def host_us_per_call(fn, *, calls: int = 200, busy_ms: float = 50.0, repeats: int = 5) -> float:
    """Returns the host (CPU) time of one ``fn()`` call in microseconds, without any sync.

    The GPU is first given ``busy_ms`` of work (``torch.cuda._sleep``), so the launches that
    follow only queue: ``time.perf_counter`` around ``calls`` back-to-back calls then measures
    the Python and driver work of a call, never a wait on the GPU (FlashInfer's ``run`` is
    measured the same way, in the same run). The GPU drains after each timing. The median of
    ``repeats`` such timings is returned, so one scheduler hiccup or garbage collection inside a
    loop does not set the figure. (It cannot remove the machine's own spread: D2's ``plan.run``
    measured 41 and 17 µs in two runs on lent H200 machines on 2026-11-29.)

    Args:
        fn: launches work on the current torch stream (no host sync inside).
        calls: calls timed per repeat (the launch queue must hold them all: keep it in the
            hundreds).
        busy_ms: the GPU's head start, so that the first launches queue behind it. (A call
            slower on the host than on the GPU lets the GPU drain and idle later in the loop;
            that costs the host nothing: a launch waits only on a full queue.)
        repeats: timings taken; the median is returned.

    Returns:
        Microseconds of host time per call.
    """
    import statistics
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    timings = []
    for _ in range(repeats):
        # NOTE: _sleep spins for a number of clock cycles; at <= 2 GHz this is >= busy_ms.
        torch.cuda._sleep(int(busy_ms * 2e6))
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        timings.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(timings)


def launch_costs(fn) -> dict:
    """Returns ``{"eager_us": ..., "host_us": ...}`` for a launcher: CUDA-event time of eager
    back-to-back calls (what a notebook or an uncaptured serving loop sees: the slower of host
    and kernel) and :func:`host_us_per_call`."""
    return {"eager_us": time_cuda(fn, warmup=3, iters=20, repeats=7),
            "host_us": host_us_per_call(fn)}
