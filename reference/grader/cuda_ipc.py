"""CUDA tensors across the grading boundary by CUDA IPC: both processes map the same GPU memory.

A kernel test hands student code CUDA tensors (a paged cache, a strided query view, an ``out=``
to fill) and reads what the kernel wrote. Copies through host memory cannot serve that: a view
would arrive compacted (other strides, another alignment) and a kernel's writes into ``out``
would land in the worker's copy. So a CUDA tensor's *storage* crosses as a CUDA IPC handle
(``torch.UntypedStorage._share_cuda_``, i.e. ``cudaIpcGetMemHandle``) and the other side opens
it (``_new_shared_cuda``, i.e. ``cudaIpcOpenMemHandle``) and rebuilds the view on it (dtype,
shape, stride, storage offset). Both directions: a test's tensors reach the worker, and a
tensor the student code allocates (a kernel's output) comes back the same way. Only data is
mapped: a handle names device memory, never code.

What CUDA IPC needs, and why it works across users: the handle is a driver-level token for one
allocation on one GPU; any process on the *same host* that can open the *same device*
(``/dev/nvidia*`` readable by the worker's user, the same ``CUDA_VISIBLE_DEVICES``, which the
worker's environment keeps) can map it, whatever its uid. Not across hosts, not across devices,
and not where the container hides the other process's driver context (a separate PID/IPC
namespace per process may refuse it). An open that fails is an error that names the reason;
tensors never fall back to copies silently.

The checks on what is opened (the other side is not trusted):

* the payload is well formed (ints, a 64-byte handle, a 32-hex token), the device index exists,
  the dtype is numeric;
* the storage's claimed extent ``[offset, offset + size)`` lies inside the allocation the handle
  really maps (the driver's ``cuMemGetAddressRange`` on the opened pointer): a worker claiming a
  larger storage would otherwise let the grader read or write past it (an illegal address that
  kills the grader's CUDA context);
* the view (storage offset, shape, strides) ends inside the storage.

NOTE: torch's IPC reference counting is *not* used. It would have the receiver open, by a name
the sender chose, a shared-memory file and decrement a counter at a sender-chosen offset: from
the worker, a name and an offset the grader must not act on; and the worker could not open the
grader's counter file anyway (root's, mode 0600). Instead the sender keeps every storage it has
shared alive as long as the worker lives (the receiver may map it at any time), and the
receiver opens each storage once (cached by the sender's token) and keeps its mapping. So the
trusted side never reuses GPU memory the worker has mapped (it could otherwise write into a
later test's tensors). The cost: the memory of tensors lent to the worker is held until the
lab's worker exits (torch warns at exit that shared tensors were not released).
NOTE: ordering. The sides run on different streams in different processes: the sender
synchronizes the device before a CUDA tensor crosses, and the worker synchronizes after each
call that used CUDA (:func:`synchronize_if_used`), so a kernel's writes are complete before the
reply that says it returned.
"""

from __future__ import annotations

import ctypes
import re
import secrets
import sys
import threading
from typing import Any

_TOKEN = re.compile(r"[0-9a-f]{32}")
#: ``cudaIpcMemHandle_t`` is 64 bytes (CUDA_IPC_HANDLE_SIZE).
HANDLE_BYTES = 64
#: Payload tags: the sender's own storage (with its handle), or a storage the receiver sent.
OWN, PEER = "own", "peer"


class CudaIpcError(RuntimeError):
    """A CUDA tensor could not cross by CUDA IPC (the reason is in the message)."""


def _fail(what: str, exc: BaseException | None = None) -> CudaIpcError:
    reason = f": {type(exc).__name__}: {exc}" if exc is not None else ""
    return CudaIpcError(
        f"CUDA IPC failed ({what}{reason}). A CUDA tensor crosses the grading boundary as a "
        f"CUDA IPC handle: both processes must be on the same host, see the same GPU (same "
        f"CUDA_VISIBLE_DEVICES, /dev/nvidia* usable by the worker's user) and share the "
        f"driver (no separate container per process)")


class CudaIpc:
    """One side's CUDA storages shared with, or received from, the other side."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: dict[str, Any] = {}  # token -> own storage (kept alive: see module NOTE)
        self._sent_by_ptr: dict[int, tuple[str, list]] = {}  # storage address -> (token, head)
        self._received: dict[str, Any] = {}  # token -> opened storage (kept mapped)
        self._received_by_ptr: dict[int, str] = {}  # opened storage address -> token

    # --- sending ---------------------------------------------------------------------------
    def reference(self, t) -> list | None:
        """Returns ``t``'s payload (its storage by handle, its view), or None: send a copy.

        None only for a tensor with no GPU memory to map (an empty storage): its data is
        nothing, a copy is exact.

        Raises:
            CudaIpcError: the storage cannot be shared (the reason in the message).
        """
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or str(t.layout) != "torch.strided":
            return None
        view = [str(t.dtype), list(t.shape), list(t.stride()),
                t.storage_offset() * t.element_size()]
        import torch

        # NOTE: before the other process reads: our queued work on this tensor (a test's
        # poisoning of ``out``, the student's kernel) must be done; another process's stream
        # does not wait for ours.
        torch.cuda.synchronize(t.device)
        ptr = storage.data_ptr()
        with self._lock:
            token = self._received_by_ptr.get(ptr)
            if token is not None:
                return [PEER, token, *view]
            entry = self._sent_by_ptr.get(ptr)
            if entry is None:
                entry = self._share(storage)
        token, head = entry
        return [OWN, token, *head, *view]

    def _share(self, storage) -> tuple[str, list]:
        try:
            (device, handle, size_bytes, offset_bytes, _ref_name, _ref_offset, _event,
             _sync) = storage._share_cuda_()
        except Exception as exc:  # noqa: BLE001 — reported with its reason
            raise _fail("could not share a CUDA tensor's storage", exc) from None
        token = secrets.token_hex(16)
        head = [int(device), bytes(handle), int(size_bytes), int(offset_bytes)]
        self._sent[token] = storage
        self._sent_by_ptr[storage.data_ptr()] = (token, head)
        return token, head

    def is_shared(self, t) -> bool:
        """True when ``t``'s storage is mapped by both sides (a write needs no copy-back)."""
        if not getattr(t, "is_cuda", False):
            return False
        ptr = t.untyped_storage().data_ptr()
        return ptr in self._sent_by_ptr or ptr in self._received_by_ptr

    # --- receiving -------------------------------------------------------------------------
    def view(self, payload: Any):
        """Rebuilds the tensor a payload from the other side describes (opening its storage).

        Raises:
            CudaIpcError: a malformed payload, a handle that does not open, or a storage or
                view reaching past the memory the handle maps.
        """
        if type(payload) is not list or len(payload) < 6:
            raise _fail("a malformed CUDA tensor payload")
        tag, token = payload[0], payload[1]
        if type(token) is not str or not _TOKEN.fullmatch(token):
            raise _fail("a malformed CUDA tensor token")
        if tag == PEER and len(payload) == 6:
            storage = self._sent.get(token)
            if storage is None:
                raise _fail("the other side named a CUDA storage it was never sent")
            return _rebuild_view(storage, *payload[2:])
        if tag != OWN or len(payload) != 10:
            raise _fail("a malformed CUDA tensor payload")
        device, handle, size_bytes, offset_bytes = payload[2:6]
        if not (all(type(x) is int and x >= 0 for x in (device, size_bytes, offset_bytes))
                and type(handle) is bytes and len(handle) == HANDLE_BYTES and size_bytes > 0):
            raise _fail("a malformed CUDA storage handle")
        with self._lock:
            storage = self._received.get(token)
            if storage is None:
                storage = _open(device, handle, size_bytes, offset_bytes)
                self._received[token] = storage
                self._received_by_ptr[storage.data_ptr()] = token
        return _rebuild_view(storage, *payload[6:])


def _open(device: int, handle: bytes, size_bytes: int, offset_bytes: int):
    import torch

    count = torch.cuda.device_count()
    if device >= count:
        raise _fail(f"a CUDA tensor on device {device}, but this process sees {count}")
    try:
        with torch.cuda.device(device):
            # NOTE: no reference counter and no event (see the module NOTEs): b"" and False.
            storage = torch.UntypedStorage._new_shared_cuda(
                device, handle, size_bytes, offset_bytes, b"", 0, b"", False)
    except Exception as exc:  # noqa: BLE001
        raise _fail(f"cudaIpcOpenMemHandle on device {device}", exc) from None
    with torch.cuda.device(device):
        base, length = allocation_range(storage.data_ptr())
    if storage.data_ptr() + size_bytes > base + length:
        raise _fail(f"a CUDA storage of {size_bytes} bytes at offset "
                    f"{storage.data_ptr() - base} of an allocation of {length} bytes")
    return storage


def _rebuild_view(storage, dtype: Any, shape: Any, stride: Any, byte_offset: Any):
    import torch

    from reference.grader.codec import _TORCH_OK, _torch_dtype

    if type(dtype) is not str or not (_ints(shape) and _ints(stride) and len(shape) == len(stride)
                                      and type(byte_offset) is int and byte_offset >= 0):
        raise _fail("a malformed CUDA tensor view")
    dtype = _torch_dtype(dtype)
    if dtype not in _TORCH_OK(torch):
        raise _fail(f"a CUDA tensor of dtype {dtype}")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if byte_offset % itemsize:
        raise _fail("a CUDA tensor view at a misaligned offset")
    if all(shape):
        end = byte_offset + itemsize * (1 + sum((n - 1) * s for n, s in zip(shape, stride)))
        if end > storage.nbytes():
            raise _fail(f"a CUDA tensor view ending at byte {end} of a {storage.nbytes()}-byte "
                        f"storage")
    return torch.empty(0, dtype=dtype, device=storage.device).set_(
        storage, byte_offset // itemsize, shape, stride)


def _ints(values: Any) -> bool:
    return type(values) is list and all(type(v) is int and v >= 0 for v in values)


_LIBCUDA: list = []


def allocation_range(ptr: int) -> tuple[int, int]:
    """Returns (base address, size) of the device allocation holding ``ptr`` (the driver's).

    Raises:
        CudaIpcError: the driver library cannot be loaded or the address is not allocated.
    """
    if not _LIBCUDA:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuMemGetAddressRange_v2
        except (OSError, AttributeError) as exc:
            raise _fail("the CUDA driver (libcuda.so.1) has no cuMemGetAddressRange_v2", exc) \
                from None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                       ctypes.c_uint64]
        _LIBCUDA.append(fn)
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    status = _LIBCUDA[0](ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if status != 0:
        raise _fail(f"cuMemGetAddressRange returned CUresult {status} for an opened handle")
    return base.value, size.value


def synchronize_if_used() -> None:
    """Waits for this process's GPU work, when it has used CUDA at all (the worker, per call).

    NOTE: the trusted side reads a kernel's output as soon as the reply comes; the kernel ran
    on the worker's stream, which the trusted process's streams do not wait for.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
