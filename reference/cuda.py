"""CUDA plumbing for the kernel labs (4 and 5): compile ``.cu`` files with CuPy, convert
arguments, and launch on the *current torch stream*.

A lab's Python loader sits beside its ``.cu`` file and follows one shape::

    validate every input (raise before launch) -> allocate the output
    -> choose grid / block / shared memory -> launch(kernel, ...) -> return the output

Launchers accept torch CUDA tensors or CuPy arrays; :func:`as_torch` turns either into a torch
tensor without copying, and :func:`like_input` turns the output back into the caller's kind.
Kernels get raw device pointers (:func:`ptr`) and scalars as ``np.int32`` / ``np.float32``.

NOTE: CuPy is imported lazily, so importing a lab's loader (and grading its validation on a
machine without a GPU) works without CuPy installed.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numpy as np

#: Compiler options every kernel gets.
BASE_OPTIONS = ("-std=c++17",)


def cuda_home() -> Path | None:
    """Returns the CUDA toolkit folder (``$CUDA_HOME``, ``$CUDA_PATH`` or /usr/local/cuda)."""
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if candidate and Path(candidate, "include").is_dir():
            return Path(candidate)
    return None


#: Trusted headers every lab kernel may include (``pagedlab_ptx.cuh``: the PTX wrappers).
INCLUDE_DIR = Path(__file__).resolve().parent / "include"


def include_options() -> tuple[str, ...]:
    """Returns ``-I`` options for the workbook's shared headers and the toolkit's (NVRTC lacks
    some, e.g. ``mma.h``)."""
    home = cuda_home()
    return (f"-I{INCLUDE_DIR}",) + ((f"-I{home / 'include'}",) if home else ())


def kernel_include_dirs(cu_path: str | Path) -> tuple[Path, ...]:
    """Returns the folders a ``.cu`` file's ``#include "x.cuh"`` resolves against, in order.

    First the file's own folder; then, for a file outside ``labs/`` — a solution in
    ``solutions/<lab>/``, or a mutant copy of one (a folder named after its lab) — the lab's
    handout folder ``labs/<lab>/``, where the headers given to students are kept once.

    Args:
        cu_path: the ``.cu`` file.

    Returns:
        One or two folders.
    """
    from reference.paths import LABS_DIR

    folder = Path(cu_path).resolve().parent
    lab = LABS_DIR / folder.name
    if folder.name.startswith("lab") and lab.is_dir() and lab != folder:
        return folder, lab
    return (folder,)


@functools.lru_cache(maxsize=None)
def _compile(source: str, options: tuple[str, ...], backend: str, name_expressions: tuple | None):
    import cupy

    return cupy.RawModule(code=source, options=options, backend=backend,
                          name_expressions=name_expressions)


def load_module(cu_path: str | Path, *, options: tuple[str, ...] = (), backend: str = "nvrtc",
                name_expressions: tuple[str, ...] | None = None):
    """Compiles a ``.cu`` file (cached per source text and options) into a CuPy RawModule.

    Args:
        cu_path: the ``.cu`` file; ``#include "x.cuh"`` resolves against its folder, then its
            lab's (:func:`kernel_include_dirs`), then ``reference/include``.
        options: extra compiler options (``-DNAME=VALUE``, ...).
        backend: ``"nvrtc"`` (default, no toolkit needed) or ``"nvcc"``.
        name_expressions: template instantiations to make addressable, if any.

    Returns:
        The compiled ``cupy.RawModule``.
    """
    path = Path(cu_path)
    dirs = kernel_include_dirs(path)
    # NOTE: CuPy caches compiled modules by source text and options, which do not change when
    # only an included header does: the headers' digest goes into the source as a comment.
    headers = [h for d in (*dirs, INCLUDE_DIR) for h in sorted(d.glob("*.cuh"))]
    source = path.read_text() + f"\n// headers {source_digest(*headers)}\n"
    opts = BASE_OPTIONS + tuple(f"-I{d}" for d in dirs) + include_options() + tuple(options)
    return _compile(source, opts, backend, tuple(name_expressions) if name_expressions else None)


def get_kernel(cu_path: str | Path, name: str, **kwargs):
    """Returns the ``extern "C"`` kernel ``name`` from a ``.cu`` file (see :func:`load_module`)."""
    return load_module(cu_path, **kwargs).get_function(name)


def source_digest(*paths: str | Path) -> str:
    """Returns a short hash of source files (for cache keys and benchmark records)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).read_bytes())
    return h.hexdigest()[:12]


def torch_stream():
    """Returns the current torch CUDA stream wrapped as a CuPy stream."""
    import cupy
    import torch

    stream = torch.cuda.current_stream()
    # NOTE: CuPy 14 deprecates ExternalStream in favour of Stream.from_external(), which takes
    # any object implementing the CUDA stream protocol (__cuda_stream__); older CuPy or torch
    # builds lack one side of it, so fall back to the raw handle there.
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None and hasattr(stream, "__cuda_stream__"):
        return from_external(stream)
    return cupy.cuda.ExternalStream(stream.cuda_stream)


def launch(kernel, grid, block, args, shared_mem: int = 0) -> None:
    """Launches ``kernel`` on the current torch stream.

    Args:
        kernel: a ``cupy.RawKernel``.
        grid: grid dimensions (tuple of up to 3 ints).
        block: block dimensions (tuple of up to 3 ints).
        args: kernel arguments: :func:`ptr` pointers, ``np.int32`` / ``np.float32`` scalars.
        shared_mem: dynamic shared memory in bytes (the kernel's limit is raised when needed).
    """
    # NOTE: the default limit is 48 KiB minus the kernel's static shared memory, so a request of
    # exactly 48 KiB already needs the raise when the kernel has any static arrays.
    if shared_mem and kernel.max_dynamic_shared_size_bytes < shared_mem:
        kernel.max_dynamic_shared_size_bytes = shared_mem
    with torch_stream():
        kernel(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)


def ptr(x) -> np.uint64:
    """Returns the device pointer of a torch tensor or CuPy array, as a kernel argument."""
    if hasattr(x, "data_ptr"):
        return np.uint64(x.data_ptr())
    return np.uint64(x.data.ptr)


def is_cupy(x) -> bool:
    """True when ``x`` is a CuPy array (checked without importing CuPy)."""
    return type(x).__module__.startswith("cupy")


def as_torch(x):
    """Returns ``x`` as a torch tensor sharing its memory (torch tensors pass through).

    Raises:
        TypeError: ``x`` is neither a torch tensor nor a CuPy array.
    """
    import torch

    if isinstance(x, torch.Tensor):
        return x
    if is_cupy(x):
        return torch.from_dlpack(x)
    raise TypeError(f"expected a torch tensor or a CuPy array, got {type(x).__name__}")


def like_input(out, template):
    """Returns ``out`` (a torch tensor) as a CuPy array if ``template`` was one, else as is."""
    if is_cupy(template):
        import cupy

        return cupy.from_dlpack(out)
    return out
