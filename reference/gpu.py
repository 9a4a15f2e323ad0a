"""Is there a usable CUDA GPU here? One answer for tests, benchmarks and the mutant check."""

from __future__ import annotations

import functools
import os
import sys


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """Returns True when torch sees a CUDA device and CuPy can use it."""
    return gpu_skip_reason() is None


@functools.lru_cache(maxsize=1)
def gpu_skip_reason() -> str | None:
    """Returns why GPU tests cannot run here, or None when they can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch (GPU-REQ tests run on a machine with an NVIDIA GPU)"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed: pip install -e '.[gpu]' (or '.[gpu-cu12]' for CUDA 12)"
    return None


# --- Kernel tests on the emulated device (reference/emulate.py) -------------------------------
# A kernel test marked ``@pytest.mark.emulated`` runs on the emulated device when
# PAGEDLAB_DEVICE=emulate is set (conftest.py turns emulation on inside exactly those tests);
# otherwise it needs the GPU, as before.


def emulation_requested() -> bool:
    """True when PAGEDLAB_DEVICE=emulate asks for the kernel tests to run emulated."""
    import os

    return os.environ.get("PAGEDLAB_DEVICE", "").strip().lower() == "emulate"


def kernel_skip_reason() -> str | None:
    """Why the kernel tests cannot run here (on the GPU, or emulated when requested), or None."""
    if emulation_requested():
        import shutil

        from reference.emulate import CXX

        try:
            import torch  # noqa: F401
        except ImportError:
            return "torch is not installed"
        return None if shutil.which(CXX) else f"the emulated device needs a C++ compiler ({CXX})"
    why = gpu_skip_reason()
    if why is None:
        return None
    # NOTE: most students have no GPU: the skip says how to run the same tests emulated.
    return (f"{why}; no GPU? run the kernel tests emulated: PAGEDLAB_DEVICE=emulate pytest -m "
            "emulated <lab folder> (pagedlab grade emulates by itself)")


def kernel_device() -> str:
    """The torch device kernel tests put their tensors on: ``"cpu"`` under emulation."""
    from reference.emulate import emulating

    return "cpu" if emulating() else "cuda"


def synchronize() -> None:
    """Waits for the GPU (nothing to wait for under emulation: launches are synchronous)."""
    from reference.emulate import emulating

    if not emulating():
        import torch

        torch.cuda.synchronize()


def cuda_context_lost(wait: bool = False) -> bool:
    """True when this process has a CUDA context and it can no longer run work (a sticky
    error: an illegal address, a trap, a launch failure, which every later CUDA call reports).

    Args:
        wait: synchronize, so a fault in a kernel still running counts too (the grading worker,
            after a call that raised); False queries the stream and never waits (a hung kernel
            then reads as healthy: pytest-timeout and the grader's watchdog deal with it).

    NOTE: only where torch already made a context: no GPU work otherwise.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    try:
        if wait:
            torch.cuda.synchronize()
        else:
            torch.cuda.current_stream().query()
    except Exception:  # noqa: BLE001 — any CUDA error here means the context is unusable
        return True
    return False


#: GPU cycles of the side stream's sleep, tried in turn (about 0.2, 1 and 4 s on an H100/H200).
BUSY_STREAM_CYCLES = (400_000_000, 2_000_000_000, 8_000_000_000)


def run_behind_busy_stream(poison, write, launch):
    """Runs ``launch()`` on a fresh side stream that is still busy writing its input.

    On the side stream: a sleep, then ``write()`` (the real input over the poisoned one), then
    ``launch()``. A kernel launched on that stream waits for the write; one launched on any
    other stream runs during the sleep and reads the poison. That only proves something if the
    kernel was launched before the sleep ended. In one process that is known: the stream is
    still busy when ``launch()`` returns (nothing in a launch waits for the GPU), and if it is
    not, the try is repeated behind a longer sleep (a loaded machine's host can outlast 0.2 s).

    NOTE: graded isolated the call crosses to the worker process, which waits for its stream
    (and so for this sleep) before it answers: the stream is always idle by then, and the
    check above cannot tell. There the sleep is 1 s from the start, five times the one under
    which Lab 5's default-stream mutant once escaped (at -j 28 on a 2-GPU machine), after a
    first call that compiles the kernel. A worker that takes longer than that to launch lets
    a wrong-stream launch pass there (not measured as happening).

    Args:
        poison: puts the poisoned input in place (called before each try, on the current stream).
        write: enqueues the real input's write on the current (side) stream.
        launch: the call under test.

    Returns:
        ``launch()``'s result, once the side stream has finished.

    Raises:
        AssertionError: in one process, the stream was idle by the time the call returned even
            after the longest sleep (the call spent seconds on the host).
    """
    import torch

    from reference.checks import DEBUG_ENV
    from reference.grader.sandbox import ISOLATED_ENV

    isolated = bool(os.environ.get(ISOLATED_ENV))
    # NOTE: debug mode's value checks read the device (a synchronisation, which would idle the
    # stream before the call returns): off for these calls, in the worker too (the variable
    # is forwarded with each call). A first call on the default stream compiles the kernel and
    # sets up the worker's stream flag, so neither happens behind the sleep.
    saved = os.environ.pop(DEBUG_ENV, None)
    try:
        poison()
        launch()
        torch.cuda.synchronize()
        return _tries(poison, write, launch, isolated)
    finally:
        if saved is not None:
            os.environ[DEBUG_ENV] = saved


def _tries(poison, write, launch, isolated: bool):
    """The tries of :func:`run_behind_busy_stream`."""
    import torch

    for cycles in BUSY_STREAM_CYCLES[1:2] if isolated else BUSY_STREAM_CYCLES:
        poison()
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
            write()
            result = launch()
            still_busy = not side.query()
        side.synchronize()
        if still_busy or isolated:
            return result
        print(f"run_behind_busy_stream: the stream was idle when the call returned after a "
              f"{cycles:,}-cycle sleep; trying a longer one", file=sys.stderr)
    raise AssertionError(
        f"the side stream's sleep ({BUSY_STREAM_CYCLES[-1]:,} cycles) was over before the call "
        "returned: the call spent seconds on the host (a synchronisation inside it?), so this "
        "test cannot tell which stream it launched on")


def array_module():
    """The device's array library, for tests that pass arrays other than torch tensors.

    Launchers accept the array library's arrays and return the caller's kind. On a GPU that
    library is CuPy; on the emulated device it is the CPU's, NumPy (CuPy mirrors NumPy's API,
    and ``reference.cuda.is_cupy`` counts a NumPy array as one only under emulation), so the
    same test proves the same contract on either device. Convert a torch tensor (zero-copy)
    with ``array_module().from_dlpack(tensor)``.

    Returns:
        The ``cupy`` module on a GPU, the ``numpy`` module under emulation.

    Raises:
        ImportError: on a GPU without CuPy installed.
    """
    from reference.emulate import emulating

    if emulating():
        import numpy

        return numpy
    import cupy

    return cupy


def gpu_only(why: str):
    """A skip mark for a kernel test that proves something only a GPU has (streams, CuPy,
    racecheck, device memory): it skips under emulation, with ``why`` in the reason."""
    import pytest

    return pytest.mark.skipif(emulation_requested(), reason=f"GPU-only under emulation: {why}")
