"""CPU tensors that both sides of the grading boundary see: storage in a sealed ``memfd``.

Lab 2's tests poison the pool's caches and then read what the student's ``write_kv`` wrote
there, and hand views of a cache back to ``write_kv`` to see it refuse aliasing. A copy per
read cannot serve that: the tests' writes would never reach the worker. So a tensor that is a
student object's *attribute* (``pool.key_cache``) crosses by reference the first time it is
read: the worker moves its storage into a shared-memory file (:meth:`WorkerShared.reference`)
and the trusted side maps the same file (:meth:`TrustedShared.view`). Views of a shared
storage then cross as (storage, dtype, shape, stride, offset) both ways, so strides, offsets
and aliasing are what they are in one process.

Why a memfd, and the checks on the trusted side (the worker is not trusted):

* It holds data only: the trusted side maps bytes, never loads anything from it.
* The worker creates it and seals it against shrinking (``F_SEAL_SHRINK``): a file cut short
  under a mapping would crash the grader (``SIGBUS``) when a test reads past the new end.
* The trusted side opens it as ``/proc/<worker pid>/fd/<n>`` (a worker in a PID namespace of
  its own names itself 1; the trusted side then uses the pid it knows), and only after
  ``stat`` says the process and the file belong to the worker's user and the file is a
  regular one: anything
  that passes is a file the worker could write anyway. The opened file must be the one
  stat'ed (same inode), sealed against shrinking, and as large as the worker says.
* A view is built only after its extent is checked against the mapped size.

NOTE: the worker keeps every shared storage (and its fd) until it exits, so a storage's
address is never reused by an unrelated tensor that would then be taken as shared.
NOTE: moving a storage re-points the tensor read (``set_``) and every other tensor on the old
storage that crosses later; a view the student code keeps elsewhere and never hands over
stays on the old storage (its writes are not seen).

CUDA tensors a test hands to student code cross by CUDA IPC the other way round: the trusted
side exports the allocation under the tensor's storage (``cudaIpcGetMemHandle``) and the
worker maps it (``cudaIpcOpenMemHandle``) for the one call, so a kernel writes the test's
own memory: views, offsets and stray stores are what they are in one process, at no copy.
NOTE: an IPC handle opens a whole ``cudaMalloc`` allocation, and torch's caching allocator
packs many tensors into one. Isolated grading therefore runs the test process with
``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (see :data:`CUDA_ENV`): every tensor is its own
allocation, and the worker can reach only tensors it was handed. An allocation shared by
other tensors is never exported (it crosses as a copy).
Opening another user's ``/proc/<pid>/fd`` needs root: under ``sudo`` grading tensors cross as
copies (Lab 2 then cannot be graded isolated).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import secrets
import stat
import threading
from typing import Any

_TOKEN = re.compile(r"[0-9a-f]{32}")
#: Set in the isolated test process: one cudaMalloc per tensor (see the module docstring).
CUDA_ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
#: The marker that starts a CUDA IPC payload (a CPU one starts with a token).
_CUDA = "cuda-ipc"


def _address_range(ptr: int) -> tuple[int, int]:
    """(base, size) of the CUDA allocation holding device address ``ptr`` (driver API)."""
    import ctypes

    lib = _address_range.lib = getattr(_address_range, "lib", None) or ctypes.CDLL("libcuda.so.1")
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    status = lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                         ctypes.c_uint64(ptr))
    if status != 0:
        raise OSError(f"cuMemGetAddressRange failed ({status})")
    return base.value, size.value


def export_cuda(t) -> list | None:
    """The trusted side: ``t``'s CUDA IPC payload, or None (send a copy).

    Returns:
        ``[marker, handle, offset of the storage in its allocation, storage bytes, device index,
        stream wait (see :func:`_order_after_current_stream`), dtype, shape, stride, byte
        offset]``; None when ``t`` is not a CUDA tensor with data,
        CuPy is missing, or its allocation holds more than its own storage (the caching
        allocator is on: exporting would hand the worker other tensors too).
    """
    if t.device.type != "cuda" or str(t.layout) != "torch.strided":
        return None
    storage = t.untyped_storage()
    nbytes, ptr = storage.nbytes(), storage.data_ptr()
    if nbytes == 0:
        return None
    try:
        import cupy
        import torch

        base, size = _address_range(ptr)
        if ptr != base or not nbytes <= size < nbytes + 2 ** 20:
            # NOTE: not this storage's own allocation (the caching allocator is on): the
            # rest could hold other tensors (2^20: below torch's smallest split of a block).
            return None
        with cupy.cuda.Device(t.device.index):
            handle = cupy.cuda.runtime.ipcGetMemHandle(base)
        wait = _order_after_current_stream(torch, t.device)
    except Exception:  # noqa: BLE001 — no driver, no CuPy, a managed pointer: a copy
        return None
    return [_CUDA, bytes(handle), ptr - base, nbytes, t.device.index, wait,
            *_view_payload("", t)[1:]]


@contextlib.contextmanager
def _on_stream(torch, stream):
    """Runs the block on ``stream`` and waits for it after: the result is read (copied back to
    the test) on another stream, which nothing orders after this one."""
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        stream.synchronize()


_WAIT_SOURCE = r"""
extern "C" __global__ void wait_for_flag(unsigned long long flag, int value) {
    // The trusted process bumps the flag on its stream once its queued work is done.
    const volatile int* f = reinterpret_cast<const volatile int*>(flag);
    while (*f < value) { __nanosleep(2000); }
}
"""


def _wait_kernel():
    """The worker's spin-wait kernel (compiled once)."""
    import cupy

    if not hasattr(_wait_kernel, "kernel"):
        _wait_kernel.kernel = cupy.RawKernel(_WAIT_SOURCE, "wait_for_flag")
    return _wait_kernel.kernel


#: device -> [flag tensor (int32, its own allocation), its IPC handle, the last value written].
_FLAGS: dict[int, list] = {}


def _order_after_current_stream(torch, device) -> list | None:
    """Makes the worker's kernels come after the test's pending work on the tensor.

    NOTE: nothing orders another process's kernels after this one's. On the default stream,
    the test's work is waited for here. On a side stream (a test inside
    ``torch.cuda.stream(s)``, whose queued work may still be writing the tensor) a counter in
    GPU memory the worker maps is bumped on that stream instead, and the worker runs the call
    on a stream that first waits for the counter (a one-thread spin kernel): a kernel launched
    on torch's current stream sees the data, one launched on another stream does not — as in
    one process. (An interprocess CUDA event would say it more directly, but the worker's
    user failed to open one on the H100: cudaErrorMapBufferObjectFailed.)

    Returns:
        ``[flag handle, value to wait for]``, or None when everything was waited for.
    """
    stream = torch.cuda.current_stream(device)
    if stream == torch.cuda.default_stream(device):
        torch.cuda.synchronize(device)
        _flag(torch, device)  # NOTE: made now, while nothing is pending (see _flag)
        return None
    flag = _flag(torch, device)
    flag[2] = (flag[2] + 1) % 2 ** 31
    flag[0].fill_(flag[2])  # NOTE: on the test's current stream, after its pending work
    return [flag[1], flag[2]]


def _flag(torch, device) -> list:
    """The device's flag: ``[int32 tensor (its own allocation), IPC handle, last value]``.

    NOTE: made at the first tensor a test sends from the default stream, not at its first
    side-stream call: making it (allocate, zero, wait for the zero: the worker must never read
    the fresh allocation's garbage as a value already written) waited for the busy side stream
    too (H100, 2026-11-24, on the default stream and on a stream of its own alike), so a test's
    first side-stream call ran after the very work it must not wait for, and a kernel launched
    on the wrong stream passed. A test whose first CUDA call is on a busy side stream still
    pays that once: the call waits longer, it never reads too early.
    """
    flag = _FLAGS.get(device.index)
    if flag is not None:
        return flag
    import cupy

    tensor = torch.zeros(1, dtype=torch.int32, device=device)
    torch.cuda.synchronize(device)
    base, _ = _address_range(tensor.data_ptr())
    if base != tensor.data_ptr():
        raise OSError("the flag is not its own allocation")
    with cupy.cuda.Device(device.index):
        handle = bytes(cupy.cuda.runtime.ipcGetMemHandle(base))
    flag = _FLAGS[device.index] = [tensor, handle, 0]
    return flag


def _storage_ptr(t) -> int:
    return t.untyped_storage().data_ptr()


def _view_payload(token: str, t) -> list:
    return [token, str(t.dtype), list(t.shape), list(t.stride()),
            t.storage_offset() * t.element_size()]


class WorkerShared:
    """The worker's shared storages: made on demand, found by storage address or token."""

    def __init__(self) -> None:
        self._by_ptr: dict[int, tuple[str, Any]] = {}  # storage address -> (token, base)
        self._by_token: dict[str, Any] = {}  # token -> base uint8 tensor
        self._moved: dict[int, tuple[Any, str]] = {}  # old address -> (old storage, token)
        self._fds: dict[str, tuple[int, int]] = {}  # token -> (fd, nbytes)
        self._lock = threading.Lock()
        self.enabled = hasattr(os, "memfd_create")
        # IPC handle -> [base address, open count, device]; storage address -> its handle.
        self._cuda_maps: dict[bytes, list] = {}
        self._cuda_ptrs: dict[int, bytes] = {}
        self._calls = threading.local()  # .opened: the handles this thread's call mapped
        self._streams: dict[int, Any] = {}  # device -> the stream calls wait on (call_stream)
        self._wait_ready: set[int] = set()  # devices whose wait kernel is loaded
        self._flags: dict[bytes, int] = {}  # the trusted side's stream flags, mapped here

    def reference(self, t, move: bool) -> list | None:
        """Returns ``t``'s reference payload, moving its storage to shared memory if ``move``.

        Returns:
            ``[token, pid, fd, nbytes, dtype, shape, stride, byte_offset]``, or None: send a
            copy (not on the CPU, no data, or not shared and not to be moved).
        """
        if not self.enabled or t.device.type != "cpu" or t.is_meta \
                or str(t.layout) != "torch.strided":
            return None
        with self._lock:
            ptr = _storage_ptr(t)
            entry = self._by_ptr.get(ptr)
            try:
                if entry is None and ptr in self._moved:
                    token = self._moved[ptr][1]
                    entry = (token, self._by_token[token])
                    self._repoint(t, entry[1])
                elif entry is None:
                    if not move or t.untyped_storage().nbytes() == 0:
                        return None
                    entry = self._move(t)
            except (OSError, RuntimeError):
                return None  # NOTE: e.g. an inference tensor: it crosses as a copy
        token = entry[0]
        fd, nbytes = self._fds[token]
        return [token, os.getpid(), fd, nbytes, *_view_payload(token, t)[1:]]

    def is_shared(self, t) -> bool:
        """True when ``t``'s storage is shared (writes need no copy-back)."""
        if t.is_meta:
            return False
        if t.device.type == "cuda":
            return _storage_ptr(t) in self._cuda_ptrs
        return t.device.type == "cpu" and _storage_ptr(t) in self._by_ptr

    def view(self, payload: list):
        """Rebuilds the trusted side's view of a shared storage as a view of the worker's."""
        import torch

        if payload and payload[0] == _CUDA:
            return self._import_cuda(payload)
        token, dtype, shape, stride, byte_offset = payload
        base = self._by_token.get(token) if type(token) is str else None
        if base is None:
            raise TypeError("a shared tensor the worker does not hold")
        from reference.grader.codec import _torch_dtype

        dtype = _torch_dtype(dtype)
        itemsize = torch.empty(0, dtype=dtype).element_size()
        return torch.empty(0, dtype=dtype).set_(base.untyped_storage(), byte_offset // itemsize,
                                                shape, stride)

    def _import_cuda(self, payload: list):
        """Maps a tensor the trusted side exported by CUDA IPC (an allocation mapped once, however
        many of the call's tensors it holds, until :meth:`release_cuda`)."""
        import cupy
        import torch

        from reference.grader.codec import _torch_dtype

        _, handle, offset, nbytes, device, wait, dtype, shape, stride, byte_offset = payload
        if wait is not None:
            self._calls.waits = [*getattr(self._calls, "waits", []), (device, wait)]
        with self._lock:
            if device not in self._wait_ready:
                # NOTE: compiled and loaded at the first tensor a device sends, not at the first
                # side-stream call: NVRTC takes far longer than a test's busy side stream, and
                # a call that waited for it would hide a launch on the wrong stream.
                with cupy.cuda.Device(device):
                    _wait_kernel().compile()
                self._wait_ready.add(device)
            entry = self._cuda_maps.get(handle)
            if entry is None:
                with cupy.cuda.Device(device):
                    entry = self._cuda_maps[handle] = [
                        cupy.cuda.runtime.ipcOpenMemHandle(handle), 0, device]
            entry[1] += 1
            mem = cupy.cuda.UnownedMemory(entry[0], offset + nbytes, None, device)
            flat = torch.as_tensor(cupy.ndarray((nbytes,), cupy.uint8,
                                                cupy.cuda.MemoryPointer(mem, offset)),
                                   device=f"cuda:{device}")
            self._cuda_ptrs[flat.untyped_storage().data_ptr()] = handle
        if not hasattr(self._calls, "opened"):
            self._calls.opened = []
        self._calls.opened.append(handle)
        dtype = _torch_dtype(dtype)
        itemsize = torch.empty(0, dtype=dtype).element_size()
        return torch.empty(0, dtype=dtype, device=flat.device).set_(
            flat.untyped_storage(), byte_offset // itemsize, shape, stride)

    def call_stream(self):
        """A context for running this thread's call: on a stream that waits for the test's
        side-stream flags (see :func:`_order_after_current_stream`), or a no-op."""
        waits = getattr(self._calls, "waits", None)
        if not waits:
            return contextlib.nullcontext()
        self._calls.waits = []
        import torch

        device = waits[0][0]
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        stream = self._streams[device]
        import cupy

        for dev, (handle, value) in waits:
            with self._lock:
                ptr = self._flags.get(handle)
                if ptr is None:
                    with cupy.cuda.Device(dev):
                        # NOTE: the trusted side's flag lives as long as it does: kept mapped.
                        ptr = self._flags[handle] = cupy.cuda.runtime.ipcOpenMemHandle(handle)
            # NOTE: one thread spinning on the flag, queued first on the call's stream
            # (cuStreamWaitValue32 refuses IPC-mapped memory: CUDA_ERROR_NOT_SUPPORTED).
            with cupy.cuda.Device(dev), cupy.cuda.ExternalStream(stream.cuda_stream):
                _wait_kernel()((1,), (1,), (cupy.uint64(ptr), cupy.int32(value)))
        return _on_stream(torch, stream)

    def release_cuda(self) -> None:
        """Unmaps what this thread's call mapped, once the GPU is done with it.

        NOTE: a mapping lives one call. The trusted side frees a tensor when its test lets go of
        it, and freeing memory another process still maps blocks in the driver; the call's
        kernels are waited for first (they may still be running: launches are asynchronous).
        Student code that keeps such a tensor past the call keeps an address that is gone.
        """
        opened = getattr(self._calls, "opened", None)
        if not opened:
            return
        self._calls.opened = []
        import cupy
        import torch

        try:
            torch.cuda.synchronize()
        finally:
            with self._lock:
                for handle in opened:
                    entry = self._cuda_maps[handle]
                    entry[1] -= 1
                    if entry[1] == 0:
                        del self._cuda_maps[handle]
                        for ptr in [p for p, h in self._cuda_ptrs.items() if h == handle]:
                            del self._cuda_ptrs[ptr]
                        with cupy.cuda.Device(entry[2]):
                            cupy.cuda.runtime.ipcCloseMemHandle(entry[0])

    def _move(self, t) -> tuple[str, Any]:
        import torch

        old = t.untyped_storage()
        nbytes = old.nbytes()
        fd = os.memfd_create("pagedlab-shared", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        os.ftruncate(fd, nbytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        base = torch.frombuffer(mmap.mmap(fd, nbytes), dtype=torch.uint8)
        base.untyped_storage().copy_(old)
        token = secrets.token_hex(16)
        self._by_token[token], self._fds[token] = base, (fd, nbytes)
        self._by_ptr[base.untyped_storage().data_ptr()] = (token, base)
        self._moved[old.data_ptr()] = (old, token)  # NOTE: kept: its address is never reused
        self._repoint(t, base)
        return token, base

    @staticmethod
    def _repoint(t, base) -> None:
        t.set_(base.untyped_storage(), t.storage_offset(), t.shape, t.stride())


class TrustedShared:
    """The trusted side's mappings of the worker's shared storages, by token.

    Args:
        worker_uid: the worker's user: only its processes' files are mapped.
        worker_pid: where the worker runs in a PID namespace of its own, returns its pid as
            this process's ``/proc`` names it (the pid a payload carries is the worker's own
            view, 1 there, and is then ignored).
    """

    def __init__(self, worker_uid: int, worker_pid=None) -> None:
        self._uid = worker_uid
        self._worker_pid = worker_pid
        self._by_token: dict[str, Any] = {}
        self._by_ptr: dict[int, str] = {}
        self._lock = threading.Lock()
        # Opening another user's /proc/<pid>/fd needs root; otherwise tensors cross as copies.
        self.enabled = os.geteuid() == 0

    def reference(self, t) -> list | None:
        """Returns the payload of a view of a shared storage; None: send a copy."""
        if t.device.type == "cuda":
            return export_cuda(t)
        if t.device.type != "cpu" or t.is_meta:
            return None
        token = self._by_ptr.get(_storage_ptr(t))
        return None if token is None else _view_payload(token, t)

    def view(self, payload: list):
        """Maps (once) and returns the worker's shared tensor that ``payload`` describes.

        Raises:
            TypeError: a malformed payload, a file that is not the worker's sealed memfd, or a
                view reaching past the mapped bytes.
        """
        import torch

        from reference.grader.codec import _TORCH_OK, _torch_dtype

        if type(payload) is not list or len(payload) != 8:
            raise TypeError("a malformed shared tensor")
        token, pid, fd, nbytes, dtype, shape, stride, byte_offset = payload
        if not (type(token) is str and _TOKEN.fullmatch(token) and all(
                type(x) is int and x >= 0 for x in (pid, fd, nbytes, byte_offset))
                and _int_list(shape) and _int_list(stride) and len(shape) == len(stride)):
            raise TypeError("a malformed shared tensor")
        dtype = _torch_dtype(dtype)
        if dtype not in _TORCH_OK(torch):
            raise TypeError(f"a shared tensor of dtype {dtype} cannot cross")
        with self._lock:
            base = self._by_token.get(token)
            if base is None:
                if self._worker_pid is not None:
                    pid = self._worker_pid()
                    if pid is None:
                        raise TypeError("the worker's process is gone")
                base = self._map(pid, fd, nbytes)
                self._by_token[token] = base
                self._by_ptr[base.untyped_storage().data_ptr()] = token
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if byte_offset % itemsize:
            raise TypeError("a shared tensor at a misaligned offset")
        if all(shape):
            end = byte_offset + itemsize * (1 + sum((n - 1) * s for n, s in zip(shape, stride)))
            if end > base.numel():
                raise TypeError(f"a shared tensor view ends at byte {end}, past its storage's "
                                f"{base.numel()} bytes")
        return torch.empty(0, dtype=dtype).set_(base.untyped_storage(), byte_offset // itemsize,
                                                shape, stride)

    def _map(self, pid: int, fd: int, nbytes: int):
        import torch

        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.stat(f"/proc/{pid}").st_uid != self._uid:
                raise TypeError(f"process {pid} is not the worker's")
            before = os.stat(path)  # follows the link without opening the file
            if not stat.S_ISREG(before.st_mode) or before.st_uid != self._uid:
                raise TypeError("a shared tensor's file is not a plain file of the worker")
            handle = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as exc:
            raise TypeError(f"a shared tensor's file cannot be opened: {exc}") from None
        try:
            info = os.fstat(handle)
            seals = fcntl.fcntl(handle, fcntl.F_GET_SEALS)
            if (info.st_ino, info.st_dev) != (before.st_ino, before.st_dev) \
                    or not seals & fcntl.F_SEAL_SHRINK or info.st_size < max(nbytes, 1):
                raise TypeError("a shared tensor's file is not the worker's sealed memfd")
            return torch.frombuffer(mmap.mmap(handle, info.st_size), dtype=torch.uint8)
        except OSError as exc:
            raise TypeError(f"a shared tensor's file cannot be mapped: {exc}") from None
        finally:
            os.close(handle)


def _int_list(values: Any) -> bool:
    return type(values) is list and all(type(v) is int and v >= 0 for v in values)
