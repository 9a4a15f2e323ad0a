"""The worker: the only process that imports and runs student code when grading isolated.

Started by :class:`reference.grader.proxy.WorkerClient` (as an unprivileged user, see
:mod:`reference.grader.sandbox`). It reads requests from its stdin and answers on its stdout,
one length-prefixed msgpack frame each (:mod:`reference.grader.codec`); before any student code
loads it moves those two pipes to private descriptors and points fd 0 at ``/dev/null`` and
fd 1 at stderr, so a student's ``print`` never lands in the protocol.

Calls the tests make concurrently run on concurrent threads here (see :class:`Worker`): a
missing lock in student code still shows.

Usage: ``python -m reference.grader.worker LAB``.
"""

from __future__ import annotations

import os
import struct
import sys
import threading
import types

import msgpack
import numpy as np

from reference.grader.codec import Codec

#: Most calls served at once (tests start a handful of threads; hypothesis none).
MAX_THREADS = 64
_HEADER = struct.Struct("<I")
#: GIL switch interval of the worker: as short as can be, so calls that run at the same time
#: interleave as they would in one process (a missing lock shows). Idle threads cost nothing.
SWITCH_INTERVAL_S = 1e-6


def frame_header(size: int) -> bytes:
    """Returns the 4-byte length prefix of a frame of ``size`` bytes."""
    return _HEADER.pack(size)


def write_all(fd: int, data: bytes) -> None:
    """Writes all of ``data`` to ``fd`` (a pipe may take it in parts)."""
    written = os.write(fd, data)
    if written == len(data):
        return
    view = memoryview(data)[written:]
    while view:
        view = view[os.write(fd, view):]


class FrameReader:
    """Reads length-prefixed frames from a raw fd, buffering what arrives beyond a frame.

    Args:
        fd: the descriptor to read (never closed here).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf = bytearray()

    def read(self) -> bytes | None:
        """Returns the next frame's body; None at end of stream (or a torn frame)."""
        if not self._buf:
            # Fast path: a frame usually arrives whole, in one read, and alone.
            chunk = os.read(self._fd, 65536)
            if not chunk:
                return None
            if len(chunk) >= _HEADER.size and \
                    _HEADER.unpack_from(chunk)[0] == len(chunk) - _HEADER.size:
                return chunk[_HEADER.size:]
            self._buf += chunk
        if not self._fill(_HEADER.size):
            return None
        (size,) = _HEADER.unpack_from(self._buf)
        end = _HEADER.size + size
        if not self._fill(end):
            return None
        body = bytes(self._buf[_HEADER.size:end])
        del self._buf[:end]
        return body

    def _fill(self, n: int) -> bool:
        while len(self._buf) < n:
            chunk = os.read(self._fd, max(65536, n - len(self._buf)))
            if not chunk:
                return False
            self._buf += chunk
        return True


class _Table:
    """Objects the trusted side holds handles to, by id (kept alive while the worker lives).

    A handle carries, besides its id, class name and method names, a *snapshot* of the
    object's small plain attributes (:func:`_plain_attrs`, packed): the trusted side answers
    ``block.ref_count`` from it until the next call that may have run student code, which
    saves most round trips of tests that walk a structure (a state machine's invariants).
    """

    def __init__(self) -> None:
        self._methods: dict[type, list[str]] = {}  # per class: dir() is slow, classes fixed
        self._objects: dict[int, object] = {}
        self._ids: dict[int, int] = {}  # id(obj) -> handle id
        self._lock = threading.Lock()
        self._local = threading.local()
        self.codec: Codec | None = None

    def handle(self, obj: object) -> list:
        with self._lock:
            hid = self._ids.get(id(obj))
            if hid is None:
                hid = len(self._objects) + 1
                self._objects[hid], self._ids[id(obj)] = obj, hid
        cls = type(obj)
        methods = self._methods.get(cls)
        if methods is None or isinstance(obj, type):
            methods = sorted(n for n in dir(cls) if not n.startswith("__")
                             and callable(getattr(cls, n, None)) and not isinstance(obj, type))
            self._methods[cls] = methods
        return [hid, f"{cls.__module__}.{cls.__qualname__}", methods, self.attrs_of(obj)]

    def attrs_of(self, obj: object) -> bytes | None:
        """Returns the packed snapshot of ``obj``'s plain attributes; None when it has none.

        NOTE: two levels at most (a manager's snapshot holds its blocks' snapshots, theirs
        hold bare handles) and :data:`MAX_NESTED_SNAPSHOTS` per reply, so a linked structure
        is never packed whole.
        """
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth >= MAX_SNAPSHOT_DEPTH or (depth and local.budget <= 0):
            return None
        attrs = _plain_attrs(obj)
        if attrs is None:
            return None
        if depth == 0:
            local.budget = MAX_NESTED_SNAPSHOTS
        else:
            local.budget -= 1
        local.depth = depth + 1
        try:
            return self.codec.pack(attrs)
        except Exception:  # noqa: BLE001 — a value that cannot cross: no snapshot then
            return None
        finally:
            local.depth = depth

    def get(self, payload: list) -> object:
        return self._objects[payload[0]]


#: Snapshot limits: attributes per object, items per container attribute, bytes per bytes/str.
MAX_SNAPSHOT_ATTRS, MAX_SNAPSHOT_ITEMS, MAX_SNAPSHOT_BYTES = 64, 64, 1024
#: Snapshots inside snapshots: how deep, and how many in one reply.
MAX_SNAPSHOT_DEPTH, MAX_NESTED_SNAPSHOTS = 2, 256
_SCALARS = frozenset({int, float, bool, str, bytes, type(None)})
_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})


def _class_attr(cls: type, name: str):
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return _MISSING


_MISSING = object()


def _is_data_descriptor(attr) -> bool:
    return hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__")


def _own_dict(obj: object) -> dict | None:
    """Returns ``obj.__dict__`` when the class's ``__dict__`` is Python's own (C) accessor."""
    attr = _class_attr(type(obj), "__dict__")
    if type(attr) is not types.GetSetDescriptorType:
        return None  # NOTE: no __dict__, or a class that defines its own (student code)
    own = object.__getattribute__(obj, "__dict__")
    return own if type(own) is dict else None


def _flat(value) -> bool:
    """True for a value a snapshot may hold: a scalar or an object (a handle), not an array."""
    kind = type(value)
    if kind in _SCALARS:
        return kind not in (str, bytes) or len(value) <= MAX_SNAPSHOT_BYTES
    return kind not in _CONTAINERS and not _is_array(value) and not isinstance(value, np.generic)


def _snapshot_value(value) -> bool:
    kind = type(value)
    if kind in _CONTAINERS:
        if len(value) > MAX_SNAPSHOT_ITEMS:
            return False
        items = [*value.keys(), *value.values()] if kind is dict else value
        return all(_flat(item) for item in items)
    return _flat(value)


def _plain_attrs(obj: object) -> dict | None:
    """Returns ``obj``'s instance attributes that reading runs no code for (its ``__dict__``
    entries and ``__slots__``, none shadowed by a class descriptor), when small; None for
    modules, classes and objects with their own ``__getattribute__``."""
    cls = type(obj)
    if isinstance(obj, (type, types.ModuleType)) or cls.__getattribute__ is not object.__getattribute__:
        return None
    out = {}
    for klass in cls.__mro__:
        for name, attr in klass.__dict__.items():
            if type(attr) is types.MemberDescriptorType and name not in out:
                try:
                    out[name] = attr.__get__(obj, cls)
                except AttributeError:
                    pass
    own = _own_dict(obj)
    if own is not None:
        for name, value in list(own.items()):
            if type(name) is str and not _is_data_descriptor(_class_attr(cls, name)):
                out[name] = value
    out = {k: v for k, v in out.items() if _snapshot_value(v)}
    return dict(list(out.items())[:MAX_SNAPSHOT_ATTRS]) if out else None


def _pure_getattr(obj: object, name: str) -> bool:
    """True when ``getattr(obj, name)`` runs no student code (an instance attribute, a slot,
    a plain class value or function): the trusted side's snapshots then stay valid."""
    if isinstance(obj, types.ModuleType):
        return type(obj) is types.ModuleType and name in obj.__dict__
    cls = type(obj)
    if isinstance(obj, type) or cls.__getattribute__ is not object.__getattribute__:
        return False
    attr = _class_attr(cls, name)
    if attr is _MISSING:
        own = _own_dict(obj)
        return own is not None and name in own
    if type(attr) is types.MemberDescriptorType:
        return True
    if _is_data_descriptor(attr):
        return False
    return type(attr) is types.FunctionType or not hasattr(type(attr), "__get__")


def _describe_exception(exc: BaseException) -> list:
    """Returns [mro as (module, name) pairs, args, str(exc), plain attributes]."""
    mro = [[c.__module__, c.__qualname__] for c in type(exc).__mro__]
    args = [a for a in exc.args if type(a) in (int, float, str, bool, type(None))]
    attrs = {k: v for k, v in vars(exc).items()
             if type(v) in (int, float, str, bool, type(None))} if hasattr(exc, "__dict__") else {}
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 — a student's __str__ may raise too
        text = "<unprintable exception>"
    return [mro, args, text[:20000], attrs]


class Worker:
    """Serves requests for one lab's implementation.

    NOTE: leader/followers, no dispatcher thread. A serving thread takes the read lock, reads
    one request, lets go of the lock and runs that request itself, so a lone call costs no
    thread handoff. While it runs, another serving thread waits on the pipe; a new one is
    started only when none is left waiting, so calls the tests make concurrently still run
    concurrently here (a missing lock in student code still shows).
    """

    def __init__(self, lab: str, requests_fd: int, replies_fd: int) -> None:
        self.lab, self._out_fd = lab, replies_fd
        self._reader = FrameReader(requests_fd)
        self._table = _Table()
        self._codec = Codec(self._table.handle, self._table.get)
        self._table.codec = self._codec
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._num_waiting = 0  # serving threads not running a call
        self._num_threads = 0

    def serve(self) -> None:
        """Answers requests until the trusted side closes the pipe, then exits the process."""
        self._serve_loop()

    def _serve_loop(self) -> None:
        with self._state_lock:
            self._num_threads += 1
            self._num_waiting += 1
        while True:
            with self._read_lock:
                frame = self._reader.read()
            if frame is None:
                os._exit(0)  # NOTE: student threads must not keep a worker alive after its grader
            with self._state_lock:
                self._num_waiting -= 1
                spawn = self._num_waiting == 0 and self._num_threads < MAX_THREADS
            if spawn:
                threading.Thread(target=self._serve_loop, name="serve", daemon=True).start()
            self._answer(frame)
            with self._state_lock:
                self._num_waiting += 1

    def _answer(self, frame: bytes) -> None:
        req_id, op, copyback, pure = 0, "", [], False
        try:
            req_id, op, target, name, args, kwargs = self._codec.unpack(frame)
            # NOTE: decided before the call: a pure read runs no student code.
            pure = op == "snap" or (op == "getattr" and _pure_getattr(target, name))
            originals = _array_bytes(args, kwargs)
            result = self._run(op, target, name, args, kwargs)
            copyback = _changed_arrays(args, kwargs, originals) if originals else []
            status, payload = 0, self._codec.pack(result)
        except BaseException as exc:  # noqa: BLE001 — every failure goes back as data
            status, payload = 1, self._codec.pack(_describe_exception(exc))
        try:
            back = self._codec.pack(copyback) if copyback else b"\x90"
        except BaseException as exc:  # noqa: BLE001
            status, payload, back = 1, self._codec.pack(_describe_exception(exc)), b"\x90"
        envelope = _pack_envelope(req_id, status, payload, back, pure)
        with self._send_lock:
            write_all(self._out_fd, frame_header(len(envelope)) + envelope)

    def _run(self, op: str, target, name, args: list, kwargs: dict):
        if op == "import":
            from reference.loader import load_impl

            return load_impl(self.lab)
        if op == "getattr":
            return getattr(target, name)
        if op == "snap":
            return self._table.attrs_of(target)
        if op == "setattr":
            setattr(target, name, args[0])
            return None
        if op == "call":
            return target(*args, **kwargs)
        if op == "callmethod":
            return getattr(target, name)(*args, **kwargs)
        if op == "op":
            return _OPS[name](target, *args)
        raise ValueError(f"unknown request {op!r}")


_OPS = {
    "len": len,
    "iter": lambda obj: list(obj),
    "getitem": lambda obj, key: obj[key],
    "setitem": lambda obj, key, value: obj.__setitem__(key, value),
    "contains": lambda obj, item: item in obj,
    "bool": bool,
    "repr": lambda obj: repr(obj)[:20000],
    "str": lambda obj: str(obj)[:20000],
    "eq": lambda obj, other: bool(obj == other),
    "isinstance": lambda cls, obj: isinstance(obj, cls),
    "index": lambda obj: obj.__index__(),
    "float": lambda obj: float(obj),
}


#: Argument types that are never arrays: skipped without a closer look (most arguments).
_PLAIN_TYPES = frozenset({int, float, str, bool, type(None), bytes, list, tuple, dict})


def _arrays_of(args: list, kwargs: dict):
    for key, value in enumerate(args):
        if type(value) not in _PLAIN_TYPES and _is_array(value):
            yield key, value
    for key, value in kwargs.items():
        if type(value) not in _PLAIN_TYPES and _is_array(value):
            yield key, value


def _is_array(value) -> bool:
    torch = sys.modules.get("torch")
    return isinstance(value, np.ndarray) or (torch is not None and isinstance(value, torch.Tensor))


def _raw(value) -> bytes:
    if isinstance(value, np.ndarray):
        return value.tobytes()
    if value.is_meta:
        return b""  # NOTE: a meta tensor has no data: nothing a call can write into
    return value.detach().cpu().contiguous().reshape(-1).view(__import__("torch").uint8) \
        .numpy().tobytes()


def _array_bytes(args: list, kwargs: dict) -> dict:
    return {key: _raw(value) for key, value in _arrays_of(args, kwargs)}


def _changed_arrays(args: list, kwargs: dict, originals: dict) -> list:
    """Array arguments the call wrote into: sent back so the caller's copies change too."""
    return [[key, value] for key, value in _arrays_of(args, kwargs)
            if _raw(value) != originals.get(key)]


def _pack_envelope(req_id: int, status: int, payload: bytes, back: bytes, pure: bool) -> bytes:
    """Returns a reply: ``pure`` says no student code ran (the trusted side's snapshots hold)."""
    return msgpack.packb([req_id, status, payload, back, pure], use_bin_type=True)


def main(argv: list[str]) -> int:
    """Moves the protocol off fds 0/1, then serves ``argv[0]``'s lab."""
    # NOTE: a short GIL switch interval: the reader and the call threads hand off per request.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)
    sys.stdout = sys.stderr
    Worker(argv[0], requests, replies).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
