"""The safe codec between the trusted test process and the student's worker: msgpack, never pickle.

Plain values cross as values: None, bool, int, float, str, bytes; lists, tuples, dicts, sets
of them; numpy arrays, numpy scalars and torch tensors of numeric or bool dtypes (CUDA tensors
by CUDA IPC where the allocation is the tensor's own, otherwise through host memory);
numpy/torch dtypes, torch devices, slices. Each side rebuilds them with
its *own* classes, so a value from the worker is exactly what its type says (an ``int`` is an
``int``: a student's always-equal object cannot come back as one).

Every other object stays where it lives and crosses as a *handle* (its id in a table):
:class:`Codec` takes ``to_handle``/``from_handle`` callbacks, one pair per side. Handles go
both ways: the worker's objects are handles on the trusted side, and trusted objects a test
hands to student code (an allocator, a model) are *reverse handles* in the worker, whose
method calls come back to the trusted side (:mod:`reference.grader.proxy`).

A CPU tensor may also cross *by reference* (``share``/``unshare`` hooks): its storage lives in
a shared-memory file both processes map, so a write on either side is seen by the other (the
pool's caches, which tests poison and then read). Only data is mapped, never code.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import msgpack
import numpy as np

EXT_TUPLE, EXT_NDARRAY, EXT_TENSOR, EXT_HANDLE, EXT_SET, EXT_FROZENSET = 1, 2, 3, 4, 5, 6
EXT_NPSCALAR, EXT_BIGINT, EXT_TORCH_DTYPE, EXT_NP_DTYPE, EXT_NP_TYPE = 7, 8, 9, 10, 11
EXT_SLICE, EXT_DEVICE, EXT_ELLIPSIS, EXT_CUPY, EXT_SHARED, EXT_ARG = 12, 13, 14, 15, 16, 17

#: numpy dtype kinds that may cross (bool, ints, floats, complex).
NUMERIC_KINDS = "biufc"


class _BigInt:
    """Marks an int too large for msgpack's 64 bits (sent as its decimal text)."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value


def _torch():
    return sys.modules.get("torch")


def _cupy():
    return sys.modules.get("cupy")


class Codec:
    """Packs and unpacks values for one side of the boundary.

    Args:
        to_handle: object -> its handle payload (a list), or raises ``TypeError`` (trusted side).
        from_handle: handle payload -> the object (or a proxy for it).
    """

    def __init__(self, to_handle: Callable[[Any], list], from_handle: Callable[[list], Any],
                 share: Callable[[Any], list | None] | None = None,
                 unshare: Callable[[list], Any] | None = None):
        self._to_handle, self._from_handle = to_handle, from_handle
        # share: tensor -> reference payload, or None to send a copy; unshare: the reverse.
        self._share, self._unshare = share, unshare
        # NOTE: a Packer costs several µs to build, a call packs 2-4 times: each thread keeps
        # its own (a Packer is not thread-safe), a stack of them since ``_default`` packs
        # nested values (a tuple's items) while the outer one is busy.
        self._local = threading.local()
        # Classes already seen to cross as handles: they skip the chain of checks below.
        self._handle_types: set[type] = set()

    def pack(self, obj: Any) -> bytes:
        """Returns the bytes of ``obj`` (see the module docstring for what may cross)."""
        try:
            return self._packb(obj)
        except OverflowError:
            return self._packb(_mark_bigints(obj))

    def unpack(self, data: bytes) -> Any:
        """Rebuilds a value packed by the other side's :meth:`pack`."""
        return msgpack.unpackb(data, ext_hook=self._ext, strict_map_key=False, raw=False,
                               use_list=True)

    def pack_result(self, obj: Any, args: list, kwargs: dict) -> bytes:
        """Packs a call's result; an array or tensor that *is* one of the call's arguments
        crosses as that argument's position, so the caller gets its own object back
        (``out=`` returned as is: ``got is out`` holds as in one process)."""
        self._local.args = {id(v): k for k, v in [*enumerate(args), *kwargs.items()]
                            if _is_array_like(v)}
        try:
            return self.pack(obj)
        finally:
            self._local.args = None

    def unpack_result(self, data: bytes, args: list, kwargs: dict) -> Any:
        """Unpacks what :meth:`pack_result` packed for a call made with ``args``/``kwargs``."""
        self._local.call = (args, kwargs)
        try:
            return self.unpack(data)
        finally:
            self._local.call = None

    def _packb(self, obj: Any) -> bytes:
        free = getattr(self._local, "free", None)
        if free is None:
            free = self._local.free = []
        packer = free.pop() if free else msgpack.Packer(default=self._default, strict_types=True,
                                                        use_bin_type=True)
        data = packer.pack(obj)  # NOTE: a Packer that raised is dropped, not reused
        free.append(packer)
        return data

    def _default(self, obj: Any) -> msgpack.ExtType:  # noqa: C901 — one branch per type
        # NOTE: strict_types sends every subclass here: its value is taken with the *base*
        # class's own methods, so an overridden __eq__/__int__ never decides what crosses.
        if type(obj) in self._handle_types:
            return msgpack.ExtType(EXT_HANDLE, self._packb(self._to_handle(obj)))
        refs = getattr(self._local, "args", None)
        if refs and id(obj) in refs and _is_array_like(obj):
            return msgpack.ExtType(EXT_ARG, self._packb(refs[id(obj)]))
        if isinstance(obj, _BigInt):
            return msgpack.ExtType(EXT_BIGINT, int.__repr__(obj.value).encode())
        if isinstance(obj, np.ndarray):
            return msgpack.ExtType(EXT_NDARRAY, self._packb(_array_fields(obj)))
        if isinstance(obj, np.generic):
            arr = np.asarray(obj)
            _check_dtype(arr.dtype, type(obj))
            return msgpack.ExtType(EXT_NPSCALAR, self._packb([arr.dtype.str, arr.tobytes()]))
        if isinstance(obj, bool):
            return bool(obj)
        if isinstance(obj, int):
            value = int.__index__(obj)
            return msgpack.ExtType(EXT_BIGINT, int.__repr__(value).encode())
        if isinstance(obj, float):
            return float.__float__(obj)
        if isinstance(obj, str):
            return str.__str__(obj)
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return bytes(obj)
        if isinstance(obj, tuple):
            return msgpack.ExtType(EXT_TUPLE, self._packb(list(tuple.__iter__(obj))))
        if isinstance(obj, list):
            return list(list.__iter__(obj))
        if isinstance(obj, dict):
            return dict(dict.items(obj))
        if isinstance(obj, (set, frozenset)):
            code = EXT_FROZENSET if isinstance(obj, frozenset) else EXT_SET
            return msgpack.ExtType(code, self._packb(list(obj)))
        if isinstance(obj, np.dtype):
            return msgpack.ExtType(EXT_NP_DTYPE, obj.str.encode())
        if isinstance(obj, type) and issubclass(obj, np.generic):
            return msgpack.ExtType(EXT_NP_DTYPE, np.dtype(obj).str.encode() + b"|type")
        if isinstance(obj, slice):
            return msgpack.ExtType(EXT_SLICE, self._packb([obj.start, obj.stop, obj.step]))
        if obj is Ellipsis:
            return msgpack.ExtType(EXT_ELLIPSIS, b"")
        torch = _torch()
        if torch is not None:
            if isinstance(obj, torch.Tensor):
                shared = self._share(obj) if self._share is not None else None
                if shared is not None:
                    return msgpack.ExtType(EXT_SHARED, self._packb(shared))
                return msgpack.ExtType(EXT_TENSOR, self._packb(_tensor_fields(torch, obj)))
            if isinstance(obj, torch.dtype):
                return msgpack.ExtType(EXT_TORCH_DTYPE, str(obj).encode())
            if isinstance(obj, torch.device):
                return msgpack.ExtType(EXT_DEVICE, str(obj).encode())
        cupy = _cupy()
        if cupy is not None and isinstance(obj, cupy.ndarray):
            # NOTE: through host memory; CUDA IPC would avoid the copy (see README).
            return msgpack.ExtType(EXT_CUPY, self._packb(_array_fields(cupy.asnumpy(obj))))
        payload = self._to_handle(obj)
        if obj is not Ellipsis:
            self._handle_types.add(type(obj))
        return msgpack.ExtType(EXT_HANDLE, self._packb(payload))

    def _ext(self, code: int, data: bytes) -> Any:  # noqa: C901
        if code == EXT_TUPLE:
            return tuple(self.unpack(data))
        if code == EXT_HANDLE:
            return self._from_handle(self.unpack(data))
        if code == EXT_NDARRAY:
            return _rebuild_array(self.unpack(data))
        if code == EXT_NPSCALAR:
            dtype, raw = self.unpack(data)
            return np.frombuffer(raw, dtype=_numeric_dtype(dtype))[0]
        if code == EXT_BIGINT:
            return int(data.decode())
        if code in (EXT_SET, EXT_FROZENSET):
            items = self.unpack(data)
            return set(items) if code == EXT_SET else frozenset(items)
        if code == EXT_NP_DTYPE:
            text = data.decode()
            if text.endswith("|type"):
                return _numeric_dtype(text[:-5]).type
            return _numeric_dtype(text)
        if code == EXT_SLICE:
            return slice(*self.unpack(data))
        if code == EXT_ELLIPSIS:
            return Ellipsis
        if code == EXT_TENSOR:
            return _rebuild_tensor(self.unpack(data))
        if code == EXT_ARG:
            return self._argument(self.unpack(data))
        if code == EXT_SHARED and self._unshare is not None:
            return self._unshare(self.unpack(data))
        if code == EXT_TORCH_DTYPE:
            return _torch_dtype(data.decode())
        if code == EXT_DEVICE:
            import torch
            return torch.device(data.decode())
        if code == EXT_CUPY:
            import cupy
            return cupy.asarray(_rebuild_array(self.unpack(data)))
        raise TypeError(f"unknown codec extension {code}")


    def _argument(self, key: Any) -> Any:
        """The caller's own array or tensor argument ``key`` (see :meth:`pack_result`)."""
        args, kwargs = getattr(self._local, "call", None) or ((), {})
        if type(key) is int and 0 <= key < len(args):
            value = args[key]
        elif type(key) is str and key in kwargs:
            value = kwargs[key]
        else:
            raise TypeError("the worker named an argument the call did not have")
        if not _is_array_like(value):
            raise TypeError("the worker named an argument that is not an array")
        return value


def _is_array_like(obj: Any) -> bool:
    torch = _torch()
    return isinstance(obj, np.ndarray) or (torch is not None and isinstance(obj, torch.Tensor))


def _mark_bigints(obj: Any) -> Any:
    if type(obj) is int and not -(2 ** 63) <= obj < 2 ** 64:
        return _BigInt(obj)
    if type(obj) in (list, tuple):
        return type(obj)(_mark_bigints(x) for x in obj)
    if type(obj) is dict:
        return {_mark_bigints(k): _mark_bigints(v) for k, v in obj.items()}
    return obj


def _check_dtype(dtype: np.dtype, what: type) -> None:
    if dtype.kind not in NUMERIC_KINDS:
        raise TypeError(f"a {what.__module__}.{what.__qualname__} of dtype {dtype} cannot cross "
                        f"the grading boundary: only numeric and bool arrays can")


def _numeric_dtype(text: str) -> np.dtype:
    dtype = np.dtype(text)
    _check_dtype(dtype, np.ndarray)
    return dtype


def _array_fields(obj: np.ndarray) -> list:
    base = np.ndarray.view(obj, np.ndarray)
    # NOTE: the shape is the array's own: ascontiguousarray turns a 0-d array into shape (1,).
    arr = np.ascontiguousarray(base)
    _check_dtype(arr.dtype, type(obj))
    return [arr.dtype.str, list(base.shape), arr.tobytes()]


def _rebuild_array(fields: list) -> np.ndarray:
    dtype, shape, raw = fields
    return np.frombuffer(raw, dtype=_numeric_dtype(dtype)).reshape(shape).copy()


def _torch_dtype(text: str):
    import torch

    dtype = getattr(torch, text.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{text!r} is not a torch dtype")
    return dtype


def _tensor_fields(torch, obj) -> list:
    t = obj.detach()
    if t.dtype not in _TORCH_OK(torch):
        raise TypeError(f"a torch.Tensor of dtype {t.dtype} cannot cross the grading boundary")
    if t.is_meta:
        return [str(t.dtype), list(t.shape), b"", "meta"]  # NOTE: shape and dtype only, no data
    if not is_compact(t):
        # A view (strided, sliced, at an offset): its whole storage crosses with the view's
        # stride and offset, so the other side sees the same layout and the same alignment
        # (offset modulo 16 bytes), which Lab 4's validation checks, and a write past the
        # view (a kernel's stray store) reaches the caller's storage too.
        # NOTE: a CUDA storage comes here only when CUDA IPC cannot carry it (see
        # reference.grader.shared.export_cuda): through host memory, a copy each way.
        raw = storage_bytes(t).cpu().numpy().tobytes()
        return [str(t.dtype), list(t.shape), raw, str(t.device), list(t.stride()),
                t.storage_offset() * t.element_size()]
    host = t.to("cpu").contiguous().reshape(-1)
    raw = host.view(torch.uint8).numpy().tobytes() if host.numel() else b""
    return [str(t.dtype), list(t.shape), raw, str(t.device)]


def storage_bytes(t):
    """The whole storage under tensor ``t`` (not only its view), as a flat uint8 tensor on its
    device: what a view crosses with."""
    import torch

    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def is_compact(t) -> bool:
    """True when ``t`` is its whole storage, contiguous from its first byte."""
    return t.is_contiguous() and t.storage_offset() == 0 and \
        t.numel() * t.element_size() == t.untyped_storage().nbytes()


def _rebuild_view(torch, dtype, shape: list, raw: bytes, stride: list, byte_offset: int):
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if not (all(type(v) is int and v >= 0 for v in (*shape, *stride, byte_offset))
            and len(shape) == len(stride) and byte_offset % itemsize == 0):
        raise TypeError("a malformed tensor view")
    if all(shape) and byte_offset + itemsize * (1 + sum((n - 1) * s for n, s in
                                                       zip(shape, stride))) > len(raw):
        raise TypeError("a tensor view reaching past its storage")
    # NOTE: torch's allocator, not a bytearray: the storage starts aligned as any other does.
    storage = torch.empty(len(raw), dtype=torch.uint8)
    if raw:
        storage.numpy()[:] = np.frombuffer(raw, dtype=np.uint8)
    return torch.empty(0, dtype=dtype).set_(storage.untyped_storage(), byte_offset // itemsize,
                                            shape, stride)


def _rebuild_tensor(fields: list):
    import torch

    dtype_name, shape, raw, device = fields[:4]
    dtype = _torch_dtype(dtype_name)
    if dtype not in _TORCH_OK(torch):
        raise TypeError(f"a torch.Tensor of dtype {dtype} cannot cross the grading boundary")
    if len(fields) == 6:
        view = _rebuild_view(torch, dtype, shape, raw, *fields[4:])
        if device == "cpu":
            return view
        storage = storage_bytes(view).to(device)
        return torch.empty(0, dtype=dtype, device=device).set_(
            storage.untyped_storage(), view.storage_offset(), view.shape, view.stride())
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    if not raw:
        out = torch.empty(shape, dtype=dtype)
    else:
        out = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
    return out.to(device) if device != "cpu" else out


def _TORCH_OK(torch) -> set:  # noqa: N802 — a constant that needs torch imported
    return {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
            torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
            torch.complex128}
