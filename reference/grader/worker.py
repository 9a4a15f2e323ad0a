"""The worker: the only process that imports and runs student code when grading isolated.

Started by :class:`reference.grader.proxy.WorkerClient` (as an unprivileged user, see
:mod:`reference.grader.sandbox`). It reads requests from its stdin and answers on its stdout,
one length-prefixed msgpack frame each (:mod:`reference.grader.codec`); before any student code
loads it moves those two pipes to private descriptors and points fd 0 at ``/dev/null`` and
fd 1 at stderr, so a student's ``print`` never lands in the protocol.

Each request runs on a thread of its own (a pool), so calls the tests make concurrently run
concurrently here: a missing lock in student code still shows.

Usage: ``python -m reference.grader.worker LAB``.
"""

from __future__ import annotations

import os
import struct
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from reference.grader.codec import Codec

#: Most calls served at once (tests start a handful of threads; hypothesis none).
MAX_THREADS = 64
_HEADER = struct.Struct("<I")
#: GIL switch interval of the worker: as short as can be, so calls that run at the same time
#: interleave as they would in one process (a missing lock shows). Idle threads cost nothing.
SWITCH_INTERVAL_S = 1e-6


def read_frame(stream) -> bytes | None:
    """Reads one frame; None at end of stream."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    body = stream.read(size)
    return body if len(body) == size else None


def write_frame(stream, body: bytes) -> None:
    """Writes one frame and flushes it."""
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


class _Table:
    """Objects the trusted side holds handles to, by id (kept alive while the worker lives)."""

    def __init__(self) -> None:
        self._objects: dict[int, object] = {}
        self._ids: dict[int, int] = {}  # id(obj) -> handle id
        self._lock = threading.Lock()

    def handle(self, obj: object) -> list:
        with self._lock:
            hid = self._ids.get(id(obj))
            if hid is None:
                hid = len(self._objects) + 1
                self._objects[hid], self._ids[id(obj)] = obj, hid
        cls = type(obj)
        methods = sorted(n for n in dir(cls) if not n.startswith("__")
                         and callable(getattr(cls, n, None)) and not isinstance(obj, type))
        return [hid, f"{cls.__module__}.{cls.__qualname__}", methods]

    def get(self, payload: list) -> object:
        return self._objects[payload[0]]


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
    """Serves requests for one lab's implementation."""

    def __init__(self, lab: str, requests, replies) -> None:
        self.lab, self._in, self._out = lab, requests, replies
        self._table = _Table()
        self._codec = Codec(self._table.handle, self._table.get)
        self._send_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="call")

    def serve(self) -> None:
        """Answers requests until the trusted side closes the pipe."""
        while (frame := read_frame(self._in)) is not None:
            self._pool.submit(self._answer, frame)
        os._exit(0)  # NOTE: student threads must not keep a worker alive after its grader

    def _answer(self, frame: bytes) -> None:
        req_id, op, copyback = 0, "", []
        try:
            req_id, op, target, name, args, kwargs = self._codec.unpack(frame)
            originals = _array_bytes(args, kwargs)
            result = self._run(op, target, name, args, kwargs)
            copyback = _changed_arrays(args, kwargs, originals)
            status, payload = 0, self._codec.pack(result)
        except BaseException as exc:  # noqa: BLE001 — every failure goes back as data
            status, payload = 1, self._codec.pack(_describe_exception(exc))
        try:
            back = self._codec.pack(copyback)
        except BaseException as exc:  # noqa: BLE001
            status, payload, back = 1, self._codec.pack(_describe_exception(exc)), b"\x90"
        envelope = _pack_envelope(req_id, status, payload, back)
        with self._send_lock:
            write_frame(self._out, envelope)

    def _run(self, op: str, target, name, args: list, kwargs: dict):
        if op == "import":
            from reference.loader import load_impl

            return load_impl(self.lab)
        if op == "getattr":
            return getattr(target, name)
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


def _arrays_of(args: list, kwargs: dict):
    for key, value in [*enumerate(args), *kwargs.items()]:
        if _is_array(value):
            yield key, value


def _is_array(value) -> bool:
    torch = sys.modules.get("torch")
    import numpy as np

    return isinstance(value, np.ndarray) or (torch is not None and isinstance(value, torch.Tensor))


def _raw(value) -> bytes:
    import numpy as np

    if isinstance(value, np.ndarray):
        return value.tobytes()
    return value.detach().cpu().contiguous().reshape(-1).view(__import__("torch").uint8) \
        .numpy().tobytes()


def _array_bytes(args: list, kwargs: dict) -> dict:
    return {key: _raw(value) for key, value in _arrays_of(args, kwargs)}


def _changed_arrays(args: list, kwargs: dict, originals: dict) -> list:
    """Array arguments the call wrote into: sent back so the caller's copies change too."""
    return [[key, value] for key, value in _arrays_of(args, kwargs)
            if _raw(value) != originals.get(key)]


def _pack_envelope(req_id: int, status: int, payload: bytes, back: bytes) -> bytes:
    import msgpack

    return msgpack.packb([req_id, status, payload, back], use_bin_type=True)


def main(argv: list[str]) -> int:
    """Moves the protocol off fds 0/1, then serves ``argv[0]``'s lab."""
    # NOTE: a short GIL switch interval: the reader and the call threads hand off per request.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)
    sys.stdout = sys.stderr
    Worker(argv[0], _Exact(requests), replies).serve()
    return 0


class _Exact:
    """A reader that returns exactly n bytes (or fewer only at end of stream)."""

    def __init__(self, raw) -> None:
        self._raw = raw

    def read(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self._raw.read(left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
