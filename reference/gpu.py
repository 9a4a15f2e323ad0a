"""Is there a usable CUDA GPU here? One answer for tests, benchmarks and the mutant check."""

from __future__ import annotations

import functools


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
    return gpu_skip_reason()


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
