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
