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
* The trusted side opens it as ``/proc/<worker pid>/fd/<n>``, and only after ``stat`` says the
  process and the file belong to the worker's user and the file is a regular one: anything
  that passes is a file the worker could write anyway. The opened file must be the one
  stat'ed (same inode), sealed against shrinking, and as large as the worker says.
* A view is built only after its extent is checked against the mapped size.

NOTE: the worker keeps every shared storage (and its fd) until it exits, so a storage's
address is never reused by an unrelated tensor that would then be taken as shared.
NOTE: moving a storage re-points the tensor read (``set_``) and every other tensor on the old
storage that crosses later; a view the student code keeps elsewhere and never hands over
stays on the old storage (its writes are not seen). CUDA tensors still cross as copies: CUDA
IPC (``torch.multiprocessing``'s ``cudaIpcGetMemHandle``) is the place to add them.
Opening another user's ``/proc/<pid>/fd`` needs root: under ``sudo`` grading tensors cross as
copies (Lab 2 then cannot be graded isolated).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import secrets
import stat
import threading
from typing import Any

_TOKEN = re.compile(r"[0-9a-f]{32}")


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
        return t.device.type == "cpu" and not t.is_meta and _storage_ptr(t) in self._by_ptr

    def view(self, payload: list):
        """Rebuilds the trusted side's view of a shared storage as a view of the worker's."""
        import torch

        token, dtype, shape, stride, byte_offset = payload
        base = self._by_token.get(token) if type(token) is str else None
        if base is None:
            raise TypeError("a shared tensor the worker does not hold")
        from reference.grader.codec import _torch_dtype

        dtype = _torch_dtype(dtype)
        itemsize = torch.empty(0, dtype=dtype).element_size()
        return torch.empty(0, dtype=dtype).set_(base.untyped_storage(), byte_offset // itemsize,
                                                shape, stride)

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
    """

    def __init__(self, worker_uid: int) -> None:
        self._uid = worker_uid
        self._by_token: dict[str, Any] = {}
        self._by_ptr: dict[int, str] = {}
        self._lock = threading.Lock()
        # Opening another user's /proc/<pid>/fd needs root; otherwise tensors cross as copies.
        self.enabled = os.geteuid() == 0

    def reference(self, t) -> list | None:
        """Returns the payload of a view of a shared storage; None: send a copy."""
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
