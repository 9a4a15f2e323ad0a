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

Emulated device: with ``PAGEDLAB_DEVICE=emulate`` (or inside ``emulate.emulation()``) the same
functions compile with g++ and run the kernel on the CPU (see :mod:`reference.emulate`):
:func:`load_module` returns an emulated module, :func:`ptr` of a CPU tensor is a fenced host
array, :func:`launch` runs the grid there, and :func:`device_ok` accepts CPU tensors.

Capture: inside :func:`capture_launches` :func:`launch` records each launch instead of running it
(the plan/run split of ``reference/launch_plan.py`` learns a launcher's kernels that way).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np

from reference.tma import TensorMap

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


# ----------------------------------------------------------------------------- sm_80 stages

#: What only sm_80+ has, as the kernel source spells it (the PTX wrappers of pagedlab_ptx.cuh or
#: the raw PTX): a file that uses one cannot run on a T4 (sm_75).
SM80_FEATURES = (("mma.sync m16n8k16", re.compile(r"\bmma_16816\b|mma\.sync\.aligned\.m16n8k16")),
                 ("ldmatrix", re.compile(r"\bldmatrix_x4(?:_trans)?\b|\bldmatrix\.sync")),
                 ("cp.async", re.compile(r"\bcp_async_16\b|\bcp\.async\.(?:ca|cg)")))
_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def sm80_features(cu_path: str | Path) -> list[str]:
    """The sm_80-only features a kernel file uses (comments ignored), in SM80_FEATURES order.

    Args:
        cu_path: the ``.cu`` file (its own text: the shared headers only define wrappers).

    Returns:
        Feature names, empty for a file that runs on sm_75.
    """
    return _features(cu_path, SM80_FEATURES)


def _features(cu_path: str | Path, table: tuple) -> list[str]:
    """The names of ``table``'s (name, pattern) entries found in a file, comments ignored."""
    st = Path(cu_path).stat()
    return list(_scan_features(str(cu_path), st.st_mtime_ns, st.st_size, table))


@functools.lru_cache(maxsize=256)
def _scan_features(path: str, mtime_ns: int, size: int, table: tuple) -> tuple[str, ...]:
    # NOTE: keyed on mtime and size too, so an edited kernel file is scanned again; cached
    # because load_module asks on every launch of the one-call path.
    text = _COMMENT_RE.sub(" ", Path(path).read_text())
    return tuple(name for name, pattern in table if pattern.search(text))


#: The compute capability the SM80_FEATURES need, as messages and skip reasons spell it.
SM80_CAPABILITY_TEXT = "8.0"


def device_capability() -> tuple[int, int]:
    """The current CUDA device's compute capability, e.g. ``(7, 5)`` for a T4."""
    import torch

    return tuple(torch.cuda.get_device_capability())


def runs_sm80_stages(x) -> bool:
    """True unless ``x`` (a torch tensor or CuPy array) lives on a GPU below compute capability
    8.0, where the stages that use ``mma.sync`` / ``ldmatrix`` / ``cp.async`` refuse: dispatchers
    pick a CUDA-core stage there. CPU tensors (emulated, or refused later by the launcher's device
    check) and anything else answer True."""
    device = getattr(x, "device", None)
    if getattr(device, "type", None) == "cuda":
        import torch

        return tuple(torch.cuda.get_device_capability(device)) >= (8, 0)
    if is_cupy(x) and hasattr(device, "compute_capability"):
        return int(device.compute_capability) >= 80
    return True


def check_capability(cu_path: str | Path, name: str | None = None,
                     capability: tuple[int, int] | None = None) -> None:
    """Refuses a stage that needs sm_80 on an older GPU, before CuPy compiles it.

    Args:
        cu_path: the stage's kernel file.
        name: the kernel, for the message.
        capability: the device's (default: :func:`device_capability`).

    Raises:
        ComputeCapabilityError: (an UnsupportedConfigError) the file uses mma.sync m16n8k16,
            ldmatrix or cp.async and the device's compute capability is below 8.0; names the
            stage, what it needs and the ways to run it. A test that meets it on such a GPU
            skips with that reason (``reference/capability_skip.py``).
    """
    from reference.errors import ComputeCapabilityError

    features = sm80_features(cu_path)
    if not features:
        return
    major, minor = capability or device_capability()
    if (major, minor) >= (8, 0):
        return
    stage = f"kernel {name} ({Path(cu_path).name})" if name else Path(cu_path).name
    raise ComputeCapabilityError(
        f"{stage} needs compute capability 8.0 (sm_80) or newer: it uses {', '.join(features)}; "
        f"this GPU is {major}.{minor} (sm_{major}{minor}; a Colab or Kaggle T4 is 7.5). Run this "
        "stage on an sm_80+ GPU (A100, L4, H100, ...), or on the CPU with PAGEDLAB_DEVICE=emulate; "
        "the CUDA-core stages run on this GPU.", required=SM80_CAPABILITY_TEXT,
        capability=f"{major}.{minor}")


# ----------------------------------------------------------------------------- sm_90a stages

#: What only Hopper has (compute capability 9.0, the sm_90a target), as the kernel source spells
#: it: the wrappers of pagedlab_wgmma.cuh or the raw PTX. Such a file is compiled for sm_90a and
#: runs on no other GPU (the emulated device models wgmma and TMA: it runs such files too).
#: NOTE: including the wrappers' header counts too, so a starter whose kernel body is still a
#: TODO is refused off Hopper like the finished kernel (not compiled into an empty kernel).
SM90A_FEATURES = (("wgmma.mma_async", re.compile(r"\bwgmma_(?:ss|rs_tb|fence|commit|wait)\b|"
                                                 r"\bwgmma\.(?:mma_async|fence|commit_group)|"
                                                 r'#\s*include\s*"pagedlab_wgmma\.cuh"')),)
#: The compute capability the SM90A_FEATURES need, as messages and skip reasons spell it.
SM90A_CAPABILITY_TEXT = "9.0"
#: The compiler option that selects the architecture-specific Hopper target.
SM90A_ARCH_OPTION = "-arch=sm_90a"


def sm90a_features(cu_path: str | Path) -> list[str]:
    """The Hopper-only features a kernel file uses (comments ignored): empty for most files."""
    return _features(cu_path, SM90A_FEATURES)


def check_hopper(cu_path: str | Path, name: str | None = None) -> bool:
    """Refuses a Hopper-only stage anywhere but a Hopper GPU, before anything compiles.

    Args:
        cu_path: the stage's kernel file.
        name: the kernel, for the message.

    Returns:
        True when the file needs sm_90a (and this device is Hopper, or the emulated device,
        which models wgmma and TMA), False for other files.

    Raises:
        ComputeCapabilityError: (an UnsupportedConfigError) the file uses wgmma and the device
            is not compute capability 9.0 — an older or newer GPU (or the emulated device made
            to report one by ``reference.emulate.emulated_capability``).
    """
    from reference.errors import ComputeCapabilityError

    features = sm90a_features(cu_path)
    if not features:
        return False
    if emulating():  # the emulator models wgmma, TMA and mbarriers (pagedlab_emu_runtime.h)
        from reference import emulate

        have = "{}.{}".format(*emulate.capability())
        device = f"the emulated device (as compute capability {have})"
    else:
        have = "{}.{}".format(*device_capability())
        device = f"compute capability {have}"
    if have == SM90A_CAPABILITY_TEXT:
        return True
    stage = f"kernel {name} ({Path(cu_path).name})" if name else Path(cu_path).name
    raise ComputeCapabilityError(
        f"{stage} needs a Hopper GPU (compute capability 9.0, the sm_90a target: H100, H200): "
        f"it uses {', '.join(features)}; this device is {device}. The mma.sync stage "
        "(paged_prefill_tc) computes the same on sm_80+ GPUs and on the emulated device.",
        required=SM90A_CAPABILITY_TEXT, capability=have)


def load_module(cu_path: str | Path, *, options: tuple[str, ...] = (), backend: str = "nvrtc",
                name_expressions: tuple[str, ...] | None = None, kernel_name: str | None = None):
    """Compiles a ``.cu`` file (cached per source text and options) into a CuPy RawModule.

    Args:
        cu_path: the ``.cu`` file; ``#include "x.cuh"`` resolves against its folder, then its
            lab's (:func:`kernel_include_dirs`), then ``reference/include``.
        options: extra compiler options (``-DNAME=VALUE``, ...).
        backend: ``"nvrtc"`` (default, no toolkit needed) or ``"nvcc"``.
        name_expressions: template instantiations to make addressable, if any.
        kernel_name: the kernel wanted (names the stage if the device cannot run it).

    Returns:
        The compiled ``cupy.RawModule``.

    Raises:
        UnsupportedConfigError: the file needs sm_80 (mma.sync, ldmatrix, cp.async) and the GPU
            is older (a T4): see :func:`check_capability`; or it needs Hopper (wgmma) and the
            device is not one: see :func:`check_hopper` (such a file is compiled for sm_90a).
    """
    hopper = check_hopper(cu_path, kernel_name)
    if emulating():
        from reference import emulate

        return emulate.load_module(cu_path, options=tuple(options),
                                   name_expressions=name_expressions)
    path = Path(cu_path)
    check_capability(path, kernel_name)
    dirs = kernel_include_dirs(path)
    # NOTE: CuPy caches compiled modules by source text and options, which do not change when
    # only an included header does: the headers' digest goes into the source as a comment.
    headers = [h for d in (*dirs, INCLUDE_DIR) for h in sorted(d.glob("*.cuh"))]
    source = path.read_text() + f"\n// headers {source_digest(*headers)}\n"
    opts = BASE_OPTIONS + tuple(f"-I{d}" for d in dirs) + include_options() + tuple(options)
    if hopper:  # NOTE: left alone, CuPy targets the device's plain sm_90, which rejects wgmma
        opts += (SM90A_ARCH_OPTION,)
    names = tuple(name_expressions) if name_expressions else None
    module = _compile(source, opts, backend, names)
    _ORIGINS.setdefault(id(module), (module, KernelOrigin(str(path.resolve()), tuple(options),
                                                           backend, names)))
    return module


class KernelOrigin(NamedTuple):
    """Where a compiled kernel came from: enough to compile it again elsewhere.

    Attributes:
        path: the ``.cu`` file (absolute).
        options: the extra compiler options :func:`load_module` was given (not the include
            folders it adds itself).
        backend: ``"nvrtc"``, ``"nvcc"`` or ``"emulate"``.
        name_expressions: template instantiations, or None.
    """

    path: str
    options: tuple
    backend: str
    name_expressions: tuple | None


#: Every module :func:`load_module` compiled in this process, by id: (module, its origin).
#: NOTE: the compile cache keeps the modules alive, so their ids stay theirs.
_ORIGINS: dict[int, tuple] = {}


def kernel_origin(kernel) -> tuple[KernelOrigin, str] | None:
    """Returns the origin and name of a kernel :func:`load_module` compiled, or None.

    Speed grading (``reference/grader/speed_record.py``) asks it of each kernel a launcher
    launched, to compile the same file again in a process that runs no student Python.

    Args:
        kernel: a ``cupy.RawKernel`` from a module of :func:`load_module` (or the emulator's).

    Returns:
        ``(origin, kernel name)``; None for a kernel compiled some other way.
    """
    name = getattr(kernel, "name", None)
    if type(kernel).__name__ == "EmulatedKernel":
        path, options = kernel.module.source
        return KernelOrigin(str(Path(path).resolve()), tuple(options), "emulate", None), name
    try:
        handle = kernel.kernel.ptr
    except Exception:  # noqa: BLE001 — not a CuPy kernel: no origin to report
        return None
    for module, origin in list(_ORIGINS.values()):
        try:
            if module.get_function(name).kernel.ptr == handle:
                return origin, name
        except Exception:  # noqa: BLE001 — this module has no kernel of that name
            continue
    return None


def get_kernel(cu_path: str | Path, name: str, **kwargs):
    """Returns the ``extern "C"`` kernel ``name`` from a ``.cu`` file (see :func:`load_module`)."""
    return load_module(cu_path, kernel_name=name, **kwargs).get_function(name)


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


class RecordedLaunch(NamedTuple):
    """One launch :func:`launch` recorded inside :func:`capture_launches` (nothing ran)."""

    kernel: object
    grid: tuple
    block: tuple
    args: tuple
    shared_mem: int


#: Per thread: the capture in progress (a list of RecordedLaunch and one of kept arrays), if any.
_CAPTURE = threading.local()


@contextlib.contextmanager
def capture_launches():
    """Records the launches made in the ``with`` block (this thread only) instead of running them.

    While it is open, :func:`launch` appends a :class:`RecordedLaunch` and returns, and
    :func:`ptr` keeps every tensor it converts alive until the capture is dropped, so the
    pointers recorded stay valid (scratch a launcher allocates included).

    Yields:
        ``(launches, kept)``: the list the launches are appended to, and the tensors kept alive.
    """
    if getattr(_CAPTURE, "record", None) is not None:
        raise RuntimeError("capture_launches() cannot be nested")
    _CAPTURE.record = record = ([], [])
    try:
        yield record
    finally:
        _CAPTURE.record = None


def launch(kernel, grid, block, args, shared_mem: int = 0) -> None:
    """Launches ``kernel`` on the current torch stream.

    Args:
        kernel: a ``cupy.RawKernel``.
        grid: grid dimensions (tuple of up to 3 ints).
        block: block dimensions (tuple of up to 3 ints).
        args: kernel arguments: :func:`ptr` pointers, ``np.int32`` / ``np.float32`` scalars.
        shared_mem: dynamic shared memory in bytes (the kernel's limit is raised when needed).
    """
    record = getattr(_CAPTURE, "record", None)
    if record is not None:
        record[0].append(RecordedLaunch(kernel, tuple(grid), tuple(block), tuple(args),
                                        int(shared_mem)))
        return
    if type(kernel).__name__ == "EmulatedKernel":
        from reference import emulate

        return emulate.launch(kernel, grid, block, args, shared_mem)
    raise_shared_mem_limit(kernel, shared_mem)
    with torch_stream():
        kernel(tuple(grid), tuple(block), kernel_args(args), shared_mem=shared_mem)


def raise_shared_mem_limit(kernel, shared_mem: int) -> None:
    """Raises ``kernel``'s dynamic shared-memory limit to ``shared_mem`` when it is lower (a
    driver call: the launchers and plans call this once per kernel), after
    :func:`check_shared_mem`.

    Args:
        kernel: a ``cupy.RawKernel``.
        shared_mem: the dynamic shared memory a launch asks for, in bytes (0: nothing to do).

    Raises:
        UnsupportedConfigError: the GPU cannot give one block that much.
    """
    # NOTE: the default limit is 48 KiB minus the kernel's static shared memory, so a request of
    # exactly 48 KiB already needs the raise when the kernel has any static arrays.
    if shared_mem and kernel.max_dynamic_shared_size_bytes < shared_mem:
        check_shared_mem(kernel, shared_mem)
        kernel.max_dynamic_shared_size_bytes = shared_mem


def check_shared_mem(kernel, shared_mem: int) -> None:
    """Refuses a launch whose shared memory the current GPU cannot give one block, with a typed
    error instead of the driver's CUDA_ERROR_INVALID_VALUE (a tuning with more stages or warps
    than fit, say).

    Args:
        kernel: a ``cupy.RawKernel`` (its static shared memory counts too).
        shared_mem: the dynamic shared memory requested, in bytes.

    Raises:
        UnsupportedConfigError: static + dynamic shared memory is over the device's per-block
            opt-in limit.
    """
    limit = _shared_mem_optin()
    static = int(kernel.attributes.get("shared_size_bytes", 0))
    if static + shared_mem > limit:
        from reference.errors import UnsupportedConfigError

        raise UnsupportedConfigError(
            f"{kernel.name} needs {shared_mem} bytes of dynamic shared memory (+ {static} "
            f"static) but this GPU gives a block at most {limit}: choose fewer stages, warps or "
            f"a smaller tile")


def _shared_mem_optin() -> int:
    """The most shared memory one block may opt into on the current CUDA device, in bytes."""
    import cupy

    # NOTE: 97 is cudaDevAttrMaxSharedMemoryPerBlockOptin (227 KiB on an H100/H200).
    return int(cupy.cuda.runtime.deviceGetAttribute(97, cupy.cuda.runtime.getDevice()))


def kernel_args(args) -> tuple:
    """``args`` as CuPy passes them: a :class:`reference.tma.TensorMap` becomes its 128 encoded
    bytes; pointers and scalars stay as they are."""
    return tuple(a.value if isinstance(a, TensorMap) else a for a in args)


def ptr(x) -> np.uint64:
    """Returns the device pointer of a torch tensor or CuPy array, as a kernel argument.

    Under emulation a CPU tensor (or NumPy array) gives a :class:`reference.emulate.HostArray`,
    which carries its extent so that the engine can fence it.
    """
    if emulating() and (isinstance(x, np.ndarray) or getattr(getattr(x, "device", None), "type",
                                                               None) == "cpu"):
        from reference import emulate

        return emulate.HostArray(x)
    record = getattr(_CAPTURE, "record", None)
    if record is not None:
        record[1].append(x)
    if hasattr(x, "data_ptr"):
        return np.uint64(x.data_ptr())
    return np.uint64(x.data.ptr)


def emulating() -> bool:
    """True when kernels run on the emulated device (``PAGEDLAB_DEVICE=emulate``)."""
    from reference import emulate

    return emulate.emulating()


def device_ok(device) -> bool:
    """True when a launcher may run on tensors of ``device`` (a torch.device): a CUDA device,
    or the CPU under emulation."""
    return device.type == "cuda" or (device.type == "cpu" and emulating())


def num_sms(device) -> int:
    """Streaming multiprocessors of ``device`` (a torch.device or a CUDA device index); the
    emulated device's fixed count for the CPU under emulation."""
    if isinstance(device, int):
        import torch

        return torch.cuda.get_device_properties(device).multi_processor_count
    if device.type == "cpu" and emulating():
        from reference import emulate

        return emulate.NUM_SMS
    import torch

    return torch.cuda.get_device_properties(device.index or 0).multi_processor_count


def is_cupy(x) -> bool:
    """True when ``x`` is an array of the device's array library (checked without importing CuPy).

    On a GPU that is a CuPy array. On the emulated device the CPU's array library, NumPy, stands
    in for CuPy (CuPy mirrors NumPy's API), so a NumPy array counts too, but only there: off the
    emulated device a NumPy array is host memory no kernel can read, and launchers refuse it.

    Args:
        x: anything.

    Returns:
        True for a CuPy array, or a NumPy array under emulation.
    """
    if type(x).__module__.startswith("cupy"):
        return True
    # NOTE: isinstance first: emulating() reads the environment, and this runs on every launch.
    return isinstance(x, np.ndarray) and emulating()


def to_host(x) -> np.ndarray:
    """Returns a host NumPy array with the contents of a torch tensor, CuPy array or NumPy array.

    Args:
        x: the array (a NumPy array is returned as is, other array-likes through ``np.asarray``).

    Returns:
        A NumPy array (a copy for device memory).
    """
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)


def as_torch(x):
    """Returns ``x`` as a torch tensor sharing its memory (torch tensors pass through).

    Args:
        x: a torch tensor, or a CuPy array (a NumPy array under emulation: :func:`is_cupy`).

    Returns:
        A torch tensor on ``x``'s device, no copy (DLPack).

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
    """Returns ``out`` as the caller's kind: the array library's array if ``template`` was one.

    Args:
        out: the result, a torch tensor.
        template: what the caller passed (its query).

    Returns:
        ``out`` as a CuPy array sharing its memory if ``template`` is a CuPy array (a NumPy
        array under emulation, where NumPy stands in for CuPy), else ``out`` itself.
    """
    if not is_cupy(template):
        return out
    if isinstance(template, np.ndarray):  # the emulated device's stand-in for CuPy
        return np.from_dlpack(out)
    import cupy

    return cupy.from_dlpack(out)
