"""The worker: the only process that imports and runs student code when grading isolated.

Started by :class:`reference.grader.proxy.WorkerClient` (as an unprivileged user, see
:mod:`reference.grader.sandbox`). It reads requests from its stdin and answers on its stdout,
one length-prefixed msgpack frame each (:mod:`reference.grader.codec`); before any student code
loads it moves those two pipes to private descriptors and points fd 0 at ``/dev/null`` and
fd 1 at stderr, so a student's ``print`` never lands in the protocol.

Calls the tests make concurrently run on concurrent threads here (see :class:`Worker`): a
missing lock in student code still shows.

Trusted objects a test passes to student code (an allocator, a model) arrive as
:class:`TrustedStub` s: their public methods and attributes are *call-backs*, run by the
trusted side on its own object and answered like any call. Tensors that are a student object's
attributes cross by reference, in shared memory (:mod:`reference.grader.shared`).

Usage: ``python -m reference.grader.worker LAB``.
"""

from __future__ import annotations

import functools
import os
import select
import struct
import sys
import threading
import time
import types

import msgpack
import numpy as np

from reference.grader.codec import EXT_HANDLE, Codec, is_compact, storage_bytes
from reference.grader.shared import WorkerShared
from reference.gpu import cuda_context_lost

#: After a call that raised: is this process's CUDA context gone? (waits for pending kernels)
_cuda_context_lost = functools.partial(cuda_context_lost, wait=True)

#: Most calls served at once (tests start a handful of threads; hypothesis none).
MAX_THREADS = 64
_HEADER = struct.Struct("<I")
#: GIL switch interval of the worker: as short as can be, so calls that run at the same time
#: interleave as they would in one process (a missing lock shows). Idle threads cost nothing.
SWITCH_INTERVAL_S = 1e-6
#: Request flag (bits of a request's 7th item): another call was in flight when it was sent,
#: so the worker keeps a thread reading while it runs this one.
FLAG_CONCURRENT = 1
#: How often the worker looks for a request that no thread is reading (see Worker._watch).
WATCH_INTERVAL_S = 1e-3
#: Reply status: the call failed and the worker exits after this reply, its CUDA context lost
#: (see Worker._answer). 0 is a result, 1 an exception.
STATUS_RETIRED = 2
#: The worker's exit code when it retires that way.
EXIT_CUDA_LOST = 75


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

    def buffered(self) -> bool:
        """True when bytes of a next frame were read already (no read needed to see them)."""
        return bool(self._buf)

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
        self._stubs: dict[int, TrustedStub] = {}
        self.codec: Codec | None = None
        self.worker: Worker | None = None

    def handle(self, obj: object) -> list:
        if type(obj) is TrustedStub:
            return [object.__getattribute__(obj, "_rid")]  # back to the trusted side: its id
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
        if len(payload) == 1:
            return self._objects[payload[0]]
        rid, type_name, methods = payload  # a trusted object: one stub per object, so `is` works
        with self._lock:
            stub = self._stubs.get(rid)
            if stub is None:
                stub = self._stubs[rid] = TrustedStub(self.worker, rid, type_name, methods)
        return stub


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


def _layout(cls: type) -> tuple:
    """Returns ``cls``'s (slot descriptors as (name, descriptor), whether instances keep a
    plain ``__dict__``, names a class data descriptor shadows), computed once per class.

    NOTE: a class changed after its first snapshot (student code may) is not looked at again:
    what a snapshot holds is the worker's word anyway (see the proxy's module docstring).
    """
    layout = _LAYOUTS.get(cls)
    if layout is None:
        members, seen, shadowed = [], set(), set()
        for klass in cls.__mro__:
            for name, attr in klass.__dict__.items():
                if name in seen:
                    continue
                seen.add(name)
                if type(attr) is types.MemberDescriptorType:
                    members.append((name, attr))
                if _is_data_descriptor(attr):
                    shadowed.add(name)
        own = type(_class_attr(cls, "__dict__")) is types.GetSetDescriptorType
        layout = _LAYOUTS[cls] = (tuple(members), own, frozenset(shadowed))
    return layout


_LAYOUTS: dict[type, tuple] = {}


def _plain_attrs(obj: object) -> dict | None:
    """Returns ``obj``'s instance attributes that reading runs no code for (its ``__dict__``
    entries and ``__slots__``, none shadowed by a class descriptor), when small; None for
    modules, classes and objects with their own ``__getattribute__``."""
    cls = type(obj)
    if isinstance(obj, (type, types.ModuleType)) or cls.__getattribute__ is not object.__getattribute__:
        return None
    members, has_dict, shadowed = _layout(cls)
    out = {}
    for name, attr in members:
        try:
            out[name] = attr.__get__(obj, cls)
        except AttributeError:
            pass
    if has_dict:
        own = object.__getattribute__(obj, "__dict__")
        if type(own) is dict:
            for name, value in list(own.items()):
                if type(name) is str and name not in shadowed:
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


class TrustedStub:
    """A trusted object handed to student code: attribute reads and calls go back to it.

    NOTE: only public names (no leading ``_``) and a few operators are forwarded; the trusted
    side refuses anything else too, whatever this class is changed into by student code.
    """

    __slots__ = ("_worker", "_rid", "_type", "_methods", "__weakref__")

    def __init__(self, worker: "Worker", rid: int, type_name: str, methods: list[str]) -> None:
        object.__setattr__(self, "_worker", worker)
        object.__setattr__(self, "_rid", rid)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_methods", frozenset(methods))

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._methods:
            return TrustedMethod(self, name)
        return self._worker.callback("getattr", self, name)

    def __setattr__(self, name: str, value) -> None:
        self._worker.callback("setattr", self, name, [value])

    def __call__(self, *args, **kwargs):
        return self._worker.callback("call", self, None, args, kwargs)

    def _op(self, name: str, *args):
        return self._worker.callback("op", self, name, args)

    def __len__(self) -> int:
        return self._op("len")

    def __bool__(self) -> bool:
        return self._op("bool")

    def __iter__(self):
        return iter(self._op("iter"))

    def __getitem__(self, key):
        return self._op("getitem", key)

    def __contains__(self, item) -> bool:
        return self._op("contains", item)

    def __repr__(self) -> str:
        return self._op("repr")

    def __str__(self) -> str:
        return self._op("str")

    def __eq__(self, other) -> bool:
        return self is other

    def __hash__(self) -> int:
        return object.__hash__(self)


class TrustedMethod:
    """A method of a :class:`TrustedStub`: one call-back per call."""

    __slots__ = ("_owner", "_name")

    def __init__(self, owner: TrustedStub, name: str) -> None:
        self._owner, self._name = owner, name

    def __call__(self, *args, **kwargs):
        owner = self._owner
        return object.__getattribute__(owner, "_worker").callback("callmethod", owner,
                                                                  self._name, args, kwargs)

    def __repr__(self) -> str:
        return f"<trusted method {object.__getattribute__(self._owner, '_type')}.{self._name}>"


class PendingReply:
    """A request in flight (the worker's call-backs, the grader's calls): its reply, set once,
    and an event that says "look again"."""

    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event, self.reply = threading.Event(), None


def _rebuild_error(data: list) -> BaseException:
    """A trusted object's exception, raised again in the worker as the class of that name."""
    import builtins

    from reference import errors

    mro, args, text, attrs = data
    for module, name in mro:
        source = builtins if module == "builtins" else errors if module == errors.__name__ else None
        cls = getattr(source, name, None) if source is not None else None
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                exc = cls(*args)
            except Exception:  # noqa: BLE001 — a constructor with other arguments
                exc = cls(text)
            for key, value in attrs.items():
                try:
                    setattr(exc, key, value)
                except Exception:  # noqa: BLE001
                    pass
            return exc
    return RuntimeError(f"{'.'.join(mro[0])}: {text}")


class Worker:
    """Serves requests for one lab's implementation.

    NOTE: no dispatcher thread. A serving thread takes the read lock, reads one request, lets
    go of the lock and runs that request itself. The trusted side marks each request *solo*
    (no other call of its own in flight when it was sent) or *concurrent*:

    * a solo request is run by the thread that read it, with no other thread woken: nothing
      else can be sent until it is answered, except what a call-back or a blocked call makes
      the trusted side send (see below). Afterwards that thread reads again. A lone call so
      costs one wake-up here, as a raw pipe round trip does.
    * before running a concurrent request, its reader makes sure another thread reads the
      pipe (:meth:`_ensure_reader`: wakes a parked one or starts one), so calls the tests make
      concurrently run concurrently here (a missing lock in student code still shows).
    * a solo request that blocks (on a lock a later call will release) or calls back leaves
      no one reading: the thread calling back ensures a reader itself, and a watchdog thread
      (:meth:`_watch`) does when a frame waits unread while every thread runs a call.

    Threads with nothing to do park (on their own lock, not the read lock, so releasing the
    read lock wakes no one).
    """

    def __init__(self, lab: str, requests_fd: int, replies_fd: int) -> None:
        self.lab, self._out_fd = lab, replies_fd
        self._in_fd = requests_fd
        self._reader = FrameReader(requests_fd)
        self._table = _Table()
        self._shared = WorkerShared()
        self._local = threading.local()  # .move: tensors packed now may move to shared memory
        self._codec = Codec(self._table.handle, self._table.get, self._share, self._shared.view)
        self._table.codec, self._table.worker = self._codec, self
        self._callbacks: dict[int, PendingReply] = {}
        # [count] while a test counts the torch calls student code makes (None otherwise).
        self._torch_calls: list[int] | None = None
        self._recordings: dict = {}  # op "emulate": kind -> (context, what it recorded)
        self._callback_ids = iter(range(1, 1 << 62))
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._num_readers = 1  # threads reading or told to read (the main thread at first)
        self._num_running = 0  # requests being run
        self._num_threads = 1
        self._parked: list[threading.Lock] = []  # held locks of parked threads

    def serve(self) -> None:
        """Answers requests until the trusted side closes the pipe, then exits the process."""
        threading.Thread(target=self._watch, name="watch", daemon=True).start()
        self._serve_loop()

    def _serve_loop(self) -> None:
        """One serving thread: reads when it is the reader, runs what it read, parks when idle."""
        while True:
            with self._read_lock:
                frame = self._reader.read()
            if frame is None:
                os._exit(0)  # NOTE: student threads must not keep a worker alive after its grader
            try:
                request = self._codec.unpack(frame)
            except BaseException as exc:  # noqa: BLE001 — answered as an error below
                request = exc
            with self._state_lock:
                self._num_readers -= 1
            if type(request) is list and len(request) == 6 and request[1] == "cbreply":
                waiter = self._callbacks.pop(request[0], None)
                if waiter is not None:
                    waiter.reply = request[4]
                    waiter.event.set()
            else:
                if type(request) is list and len(request) in (7, 8) and \
                        type(request[6]) is int and request[6] & FLAG_CONCURRENT:
                    self._ensure_reader()  # concurrent: another call may need a thread now
                with self._state_lock:
                    self._num_running += 1
                try:
                    self._answer(request)
                finally:
                    with self._state_lock:
                        self._num_running -= 1
            self._next_role()

    def _next_role(self) -> None:
        """After a frame: read next if no one else is reading, otherwise park until needed."""
        with self._state_lock:
            if self._num_readers == 0:
                self._num_readers = 1
                return
            parked = threading.Lock()
            parked.acquire()
            self._parked.append(parked)
        parked.acquire()  # released by _ensure_reader, which counted this thread as a reader

    def _ensure_reader(self) -> None:
        """Makes sure a thread reads the pipe (wakes a parked one, or starts one)."""
        with self._state_lock:
            if self._num_readers:
                return
            if self._parked:
                self._num_readers = 1
                self._parked.pop().release()
                return
            if self._num_threads >= MAX_THREADS:
                return
            self._num_readers = 1
            self._num_threads += 1
        threading.Thread(target=self._serve_loop, name="serve", daemon=True).start()

    def _watch(self) -> None:
        """Ensures a reader when a frame waits unread while every thread runs a call (a solo
        call blocked on a lock that the next call releases). Costs a wake-up per ms, no more."""
        poller = select.poll()
        poller.register(self._in_fd, select.POLLIN)
        while True:
            time.sleep(WATCH_INTERVAL_S)
            if self._num_readers == 0 and self._num_running and \
                    (self._reader.buffered() or poller.poll(0)):
                self._ensure_reader()

    def _share(self, t) -> list | None:
        return self._shared.reference(t, move=getattr(self._local, "move", False))

    def callback(self, op: str, stub: TrustedStub, name: str | None, args=(), kwargs=None):
        """Runs ``op`` on the trusted object behind ``stub`` (in the trusted process).

        NOTE: the calling thread waits; another serving thread reads the answer, so other calls
        (and call-backs) go on meanwhile.
        """
        cb_id = next(self._callback_ids)
        # NOTE: tensors lent to trusted code (a model writing K/V into the engine's cache) go
        # by reference, as in one process: its writes must land in the worker's tensors.
        self._local.move = True
        try:
            body = self._codec.pack([op, stub, name, list(args), dict(kwargs or {})])
        finally:
            self._local.move = False
        waiter = self._callbacks[cb_id] = PendingReply()
        self._ensure_reader()  # NOTE: this thread is busy: someone must read the answer
        envelope = msgpack.packb([cb_id, "cb", body], use_bin_type=True)
        with self._send_lock:
            write_all(self._out_fd, frame_header(len(envelope)) + envelope)
        waiter.event.wait()
        status, payload = waiter.reply
        if status:
            raise _rebuild_error(payload)
        return payload

    def _answer(self, request) -> None:
        req_id, op, copyback, pure = 0, "", [], False
        try:
            if isinstance(request, BaseException):
                raise request
            req_id, op, target, name, args, kwargs = request[:6]
            if len(request) == 8:
                _set_forwarded_env(request[7])
            # NOTE: decided before the call: a pure read runs no student code.
            pure = op == "snap" or (op == "getattr" and _pure_getattr(target, name))
            originals = _array_bytes(args, kwargs)
            counter = self._torch_calls
            with self._shared.call_stream():
                if counter is not None and op in _COUNTED_OPS:
                    with _TorchCallCounter(counter):
                        result = self._run(op, target, name, args, kwargs)
                else:
                    result = self._run(op, target, name, args, kwargs)
            copyback = _changed_arrays(args, kwargs, originals) if originals else []
            # An attribute that is a tensor (a pool's cache) crosses by reference: the tests'
            # writes to it must reach the worker, and its views must alias it.
            # NOTE: not when trusted code reads it inside a call-back (a model reading a step's
            # inputs): those tensors live one step, and a shared one lives as long as the worker.
            self._local.move = op == "getattr" and not kwargs
            try:
                if type(result) in _LIVE_TYPES and not pure and op != "op" \
                        and sys.getrefcount(result) > _FRESH_REFS:
                    # NOTE: a list (dict, set) the student's object still holds: in one process
                    # the caller would hold that very list, and editing it would edit the
                    # object. It stays here as a handle, so that is what happens isolated too.
                    status, payload = 0, self._codec.pack(msgpack.ExtType(
                        EXT_HANDLE, self._codec.pack(self._table.handle(result))))
                else:
                    status, payload = 0, self._codec.pack_result(result, args, kwargs)
            finally:
                self._local.move = False
        except BaseException as exc:  # noqa: BLE001 — every failure goes back as data
            status, payload = 1, self._codec.pack(_describe_exception(exc))
        try:
            back = self._codec.pack(copyback) if copyback else b"\x90"
        except BaseException as exc:  # noqa: BLE001
            status, payload, back = 1, self._codec.pack(_describe_exception(exc)), b"\x90"
        lost = False
        try:
            self._shared.release_cuda()
        except BaseException as exc:  # noqa: BLE001 — a kernel fault surfaces here
            status, payload, back = 1, self._codec.pack(_describe_exception(exc)), b"\x90"
            lost = True
        if status and not lost:
            lost = _cuda_context_lost()
        envelope = _pack_envelope(req_id, STATUS_RETIRED if lost else status, payload, back, pure)
        with self._send_lock:
            write_all(self._out_fd, frame_header(len(envelope)) + envelope)
            if lost:
                # NOTE: a lost context cannot unmap the test's CUDA memory it mapped (CUDA IPC),
                # and the test process blocks in the driver when it frees memory another
                # process still maps: the next test hung until its timeout. Exiting unmaps
                # everything; the trusted side starts a fresh worker for the next test.
                os._exit(EXIT_CUDA_LOST)

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
        if op == "callmany":
            # proxy.call_each: a test's loop of calls to one method, run here in one trip.
            (calls,) = args
            if type(calls) is not list or any(type(c) is not list for c in calls):
                raise TypeError("callmany takes a list of argument lists")
            method = getattr(target, name)
            return [method(*c) for c in calls]
        if op == "op":
            return _OPS[name](target, *args)
        if op == "given":
            # Lab plumbing (``labs.<lab>._sequence.Sequence``) that must live beside the
            # student's objects: the worker's own import of it.
            return _workbook_attr(name, lambda attr: not attr.startswith("_"), "given lab code")
        if op == "gather":
            # proxy.gather: a lab's test helper that reads a whole state, run here in one trip.
            return _workbook_attr(name, str.isidentifier, "workbook code")(*args)
        if op == "emulate":
            # A test's recording block around emulated launches (racecheck, streams): the
            # launches run here, so they are recorded here. begin -> None; end -> the data.
            from reference.emulate import worker_recording

            (kind,) = args
            if name == "begin":
                if kind in self._recordings:
                    self._recordings.pop(kind)[0].__exit__(None, None, None)
                self._recordings[kind] = worker_recording(kind)
                return None
            if kind not in self._recordings:
                raise ValueError(f"no {kind!r} recording was begun")
            context, data = self._recordings.pop(kind)
            try:
                return data()
            finally:
                context.__exit__(None, None, None)
        if op == "count_torch_calls":
            # A test's torch-call count (Lab 2's "vectorized" test) must be taken where the
            # student's code runs: here. start -> None; stop -> the count since start.
            if name == "start":
                self._torch_calls = [0]
                return None
            counter, self._torch_calls = self._torch_calls, None
            return counter[0] if counter else 0
        raise ValueError(f"unknown request {op!r}")


def _workbook_attr(name: str, allowed, what: str):
    """Returns what ``module:attr`` names: the worker's own import of a ``labs.*`` or
    ``reference.*`` module's attribute, when ``allowed(attr)``.

    Raises:
        ValueError: another module, or an attribute ``allowed`` refuses (saying it is not
            ``what``).
    """
    module, _, attr = name.partition(":")
    if not module.startswith(("labs.", "reference.")) or not allowed(attr):
        raise ValueError(f"{name!r} is not {what}")
    import importlib

    return getattr(importlib.import_module(module), attr)


#: Requests whose student code a torch-call count covers.
_COUNTED_OPS = frozenset({"call", "callmethod", "callmany", "gather", "getattr", "setattr",
                          "op"})


def _TorchCallCounter(counter: list):  # noqa: N802 — a class made on first use (torch is heavy)
    """Returns a torch function mode adding every torch call made inside it to ``counter[0]``."""
    from torch.overrides import TorchFunctionMode

    class Counter(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            counter[0] += 1
            return func(*args, **(kwargs or {}))

    return Counter()


#: Containers returned as handles when something else still holds them (see Worker._answer).
_LIVE_TYPES = frozenset({list, dict, set, bytearray})
#: References to a fresh result inside Worker._answer: its local name and getrefcount's argument.
_FRESH_REFS = 2

_OPS = {
    "value": lambda obj: type(obj)(obj) if type(obj) in _LIVE_TYPES else None,
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
    # NOTE: a tensor in shared memory is skipped: the caller already sees every write to it.
    for key, value in [*enumerate(args), *kwargs.items()]:
        if type(value) not in _PLAIN_TYPES and _is_array(value) and not _shared_tensor(value):
            yield key, value


def _shared_tensor(value) -> bool:
    worker = _WORKER[0] if _WORKER else None
    return worker is not None and not isinstance(value, np.ndarray) and \
        worker._shared.is_shared(value)


_WORKER: list = []


def _set_forwarded_env(env) -> None:
    """Applies the test's changes to the variables of ``sandbox.FORWARDED_ENV`` (None: unset)."""
    from reference.grader.sandbox import FORWARDED_ENV

    import re

    from reference.grader.sandbox import DEVICE_ENV

    if type(env) is not dict:
        raise TypeError("malformed environment update")
    for key, value in env.items():
        if key not in FORWARDED_ENV + DEVICE_ENV or not (value is None or type(value) is str):
            raise TypeError(f"{key!r} is not a forwarded variable")
        if key in DEVICE_ENV and value is not None \
                and not re.fullmatch(r"emulate|\d{1,2}\.\d{1,2}", value):
            raise TypeError(f"{key}={value!r} is not a device state")
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _is_array(value) -> bool:
    torch = sys.modules.get("torch")
    return isinstance(value, np.ndarray) or (torch is not None and isinstance(value, torch.Tensor))


def _raw(value) -> bytes:
    if isinstance(value, np.ndarray):
        return value.tobytes()
    if value.is_meta:
        return b""  # NOTE: a meta tensor has no data: nothing a call can write into
    if not is_compact(value):
        # NOTE: a view crossed with its whole storage (see codec._tensor_fields): a write
        # past the view (a kernel's stray store) is a change the caller must see too.
        return storage_bytes(value).cpu().numpy().tobytes()
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
    worker = Worker(argv[0], requests, replies)
    _WORKER.append(worker)
    worker.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
