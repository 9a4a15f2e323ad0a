"""The trusted side of isolated grading: ``impl`` as a proxy for a module living in a worker.

Under grading (``PAGEDLAB_ISOLATED`` set by the runner: ``root`` or ``sudo``) the ``impl`` fixture returns
:func:`remote_impl`: attribute reads, calls and the usual operators are forwarded to the
worker (:mod:`reference.grader.worker`), which alone imports the student's code. Values come
back through the safe codec (:mod:`reference.grader.codec`); objects with methods stay in the
worker and are :class:`Remote` handles here (the same object is always the same handle, so
``is`` works). Array arguments a call writes into are copied back into the caller's arrays.

Exceptions come back as data and are raised again as the *trusted* class of that name:
``reference.errors``' classes and builtins only (walking up the student's class's bases); any
other is :class:`RemoteError`. A worker that dies fails the running call with
:class:`WorkerDiedError`; the next test gets a fresh worker.

Round trips are the cost of isolation, so a handle also carries a snapshot of the object's
small plain attributes (instance ``__dict__`` entries and slots; see
:func:`reference.grader.worker._plain_attrs`): ``block.ref_count`` is answered from it while no
call that may have run student code was sent or answered since (``WorkerClient._epoch``).
NOTE: a worker that lies about purity only keeps its own, earlier values in view longer —
values its code could have returned anyway; what crosses is still rebuilt by the codec.

Call-backs: a trusted object a test passes to student code (an allocator, a model, a function)
crosses as a *reverse handle*; the worker's stub sends its method calls back, and the thread
that is reading replies runs them here, on the trusted object, with codec-decoded arguments
(:meth:`WorkerClient._serve_callback`): public names only (no ``_``), a few operators, never
anything unpickled or imported. Modules and classes are never handed over.

NOTE: a ``Remote`` never forwards ``==`` against a plain value (only against another handle):
a student object claiming to equal everything compares equal to nothing the test wrote.
"""

from __future__ import annotations

import builtins
import collections
import itertools
import os
import pwd
import types
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

import msgpack

from reference import errors as reference_errors
from reference.grader.codec import Codec, is_compact, storage_bytes
from reference.grader.sandbox import (DEVICE_ENV, FORWARDED_ENV, ISOLATED_ENV, WORKER_USER,
                                      ensure_worker_user, make_worker_home,
                                      namespace_worker_pid, worker_command, worker_in_namespace)
from reference.grader.shared import TrustedShared
from reference.grader.worker import (FLAG_CONCURRENT, STATUS_RETIRED, PendingReply, FrameReader,
                                     _describe_exception, frame_header, write_all)
from reference.paths import REPO_ROOT, lab_of_path

#: Bytes of the worker's output kept (the tail); the rest is dropped, so endless output is harmless.
OUTPUT_TAIL_BYTES = 64 * 1024
#: Seconds a worker that lost its CUDA context gets to exit before it is killed.
RETIRE_WAIT_S = 30
#: The packed empty list: the copy-back part of most replies (nothing to unpack then).
_EMPTY_LIST = b"\x90"
#: What a call-back may do to a trusted object besides its public attributes and methods.
CALLBACK_OPS = {
    "len": len,
    "bool": bool,
    "iter": lambda obj: list(obj),
    "getitem": lambda obj, key: obj[key],
    "contains": lambda obj, item: item in obj,
    "repr": lambda obj: repr(obj)[:20000],
    "str": lambda obj: str(obj)[:20000],
}


_LIVE_CONTAINERS = frozenset({"builtins.list", "builtins.dict", "builtins.set",
                              "builtins.bytearray"})


#: .active: this thread is running a call-back for the worker.
_CALLBACK_THREAD = threading.local()


class RemoteError(Exception):
    """An exception raised in student code whose class is neither a builtin nor a reference error."""


class WorkerDiedError(RuntimeError):
    """The student's process died (exit, signal, kill) while serving a call."""


class Remote:
    """A handle on an object living in the worker."""

    __slots__ = ("_client", "_hid", "_type", "_methods", "_cache", "_snap", "_names",
                 "__weakref__")

    def __init__(self, client: "WorkerClient", hid: int, type_name: str, methods: list[str]):
        object.__setattr__(self, "_client", client)
        object.__setattr__(self, "_hid", hid)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_methods", frozenset(methods))
        object.__setattr__(self, "_cache", {} if type_name == "builtins.module" else None)
        # (epoch, packed or unpacked attrs): the object's plain attributes as of that epoch
        # (see WorkerClient._epoch); None when it has none. _names: their names, once known.
        object.__setattr__(self, "_snap", None)
        object.__setattr__(self, "_names", None)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # NOTE: copy/pickle/numpy probe dunders: never forwarded
        if name in self._methods:
            return RemoteMethod(self, name)
        if self._cache is not None and name in self._cache:
            return self._cache[name]
        if self._snap is not None and (self._names is None or name in self._names):
            attrs = self._client.snapshot(self)
            if attrs is not None and name in attrs:
                value = attrs[name]
                # A fresh container each read, as a round trip would give.
                return value.copy() if type(value) in (list, dict, set) else value
        # NOTE: read by trusted code serving a call-back (a model reading a step's inputs), a
        # tensor crosses as a copy; read by a test, it is shared (see worker.Worker._answer).
        copy = {"copy": True} if getattr(_CALLBACK_THREAD, "active", False) else None
        value = self._client.request("getattr", self, name, (), copy)
        if self._cache is not None and isinstance(value, Remote):
            self._cache[name] = value  # a module's classes and functions do not change
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if self._cache is not None:
            self._cache.pop(name, None)  # NOTE: a test swapping a module's function (monkeypatch)
        self._client.request("setattr", self, name, [value])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._client.request("call", self, None, args, kwargs)

    def _op(self, name: str, *args: Any) -> Any:
        return self._client.request("op", self, name, args)

    def __len__(self) -> int:
        return self._op("len")

    def __iter__(self):
        return iter(self._op("iter"))

    def __getitem__(self, key: Any) -> Any:
        return self._op("getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._op("setitem", key, value)

    def __contains__(self, item: Any) -> bool:
        return self._op("contains", item)

    def __bool__(self) -> bool:
        return self._op("bool")

    def __index__(self) -> int:
        return self._op("index")

    def __float__(self) -> float:
        return self._op("float")

    def __repr__(self) -> str:
        try:
            return self._op("repr")
        except Exception as exc:  # noqa: BLE001 — a failing repr must not hide the test's failure
            return f"<{self._type} in the worker; repr failed: {exc}>"

    def __str__(self) -> str:
        return self._op("str")

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, Remote):
            return self is other or self._op("eq", other)
        if self._type in _LIVE_CONTAINERS:
            # A list the student's object still holds (see worker._LIVE_TYPES): compared by
            # its value, which crosses through the codec as a real list.
            return self._op("value") == other
        return NotImplemented

    def __ne__(self, other: Any) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        return object.__hash__(self)

    def __instancecheck__(self, obj: Any) -> bool:
        return isinstance(obj, Remote) and self._op("isinstance", obj)


class RemoteMethod:
    """A method of a :class:`Remote`, called in one round trip."""

    __slots__ = ("_owner", "_name")

    def __init__(self, owner: Remote, name: str) -> None:
        self._owner, self._name = owner, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._owner._client.request("callmethod", self._owner, self._name, args, kwargs)

    def __repr__(self) -> str:
        return f"<remote method {self._owner._type}.{self._name}>"


class WorkerClient:
    """One worker process and the calls in flight to it.

    NOTE: there is no reader thread. A calling thread reads the replies itself while it holds
    ``_read_lock`` (leader/followers): with one call in flight — nearly always — the reply goes
    straight to the thread that waits for it, with no thread handoff (each costs a scheduler
    wake-up, hundreds of µs on a loaded machine). With several, the reading thread hands the
    others their replies and, once it has its own, wakes one of them to read next.
    """

    def __init__(self, lab: str) -> None:
        how = os.environ.get(ISOLATED_ENV)
        if how not in ("root", "sudo"):
            how = ensure_worker_user()
        self.home = make_worker_home()
        argv, extra = worker_command([lab], how, self.home)
        self.lab = lab
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=REPO_ROOT, **extra)
        self._out_fd, self._in_fd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self._worker_pid: int | None = None
        self._shared = TrustedShared(pwd.getpwnam(WORKER_USER).pw_uid,
                                     self._namespace_worker_pid
                                     if worker_in_namespace(how) else None)
        self._codec = Codec(self._to_handle, self._from_handle,
                            self._shared.reference if self._shared.enabled else None,
                            self._shared.view if self._shared.enabled else None)
        # Trusted objects handed to student code, by reverse-handle id (kept alive: the
        # worker may call them at any time while it lives).
        self._trusted: dict[int, Any] = {}
        self._trusted_ids: dict[int, int] = {}
        self._callback_lock = threading.Lock()
        self._num_callbacks = 0  # call-backs running now
        self._handles: weakref.WeakValueDictionary[int, Remote] = weakref.WeakValueDictionary()
        self._handle_lock = threading.Lock()
        self._pending: dict[int, PendingReply] = {}
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._reader = FrameReader(self._in_fd)
        # Bumped whenever student code may have run (every request but a pure read, when it
        # is sent and when its reply comes): a snapshot is valid only in its own epoch.
        self._epoch = 0
        self._epoch_lock = threading.Lock()
        self._local = threading.local()  # .stamp: the epoch of what is being decoded
        self._ids = itertools.count(1)
        # what the worker was last told (FORWARDED_ENV, then DEVICE_ENV)
        self._sent_env: tuple = (None,) * (len(FORWARDED_ENV) + len(DEVICE_ENV))
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_bytes = 0
        self.dead: str | None = None
        threading.Thread(target=self._drain_output, daemon=True).start()
        try:
            self.module = self.request("import", None)
        except BaseException:
            self.kill("the student's module failed to import")  # NOTE: never left running
            raise
        from reference import emulate

        emulate._remotes.append(self)  # what a test records around emulated launches (below)

    # --- codec hooks -------------------------------------------------------------------------
    def _to_handle(self, obj: Any) -> list:
        if isinstance(obj, Remote) and obj._client is self:
            return [obj._hid]
        if isinstance(obj, (Remote, RemoteMethod)) or not _may_hand_over(obj):
            raise TypeError(f"a {type(obj).__module__}.{type(obj).__qualname__} cannot be "
                            f"passed to student code when grading isolated: only plain values, "
                            f"numeric arrays/tensors, objects the student code returned, and "
                            f"instances and functions of the workbook's own code (as "
                            f"call-backs) can")
        return self._reverse_handle(obj)

    def _reverse_handle(self, obj: Any) -> list:
        """Returns ``[rid, class name, public method names]`` of a trusted object."""
        with self._handle_lock:
            rid = self._trusted_ids.get(id(obj))
            if rid is None:
                rid = self._trusted_ids[id(obj)] = len(self._trusted) + 1
                self._trusted[rid] = obj
        cls = type(obj)
        methods = sorted(n for n in dir(cls) if not n.startswith("_")
                         and callable(getattr(cls, n, None)))
        return [rid, f"{cls.__module__}.{cls.__qualname__}", methods]

    def _from_handle(self, payload: list) -> Any:
        if len(payload) == 1:
            rid = payload[0]
            if type(rid) is not int or rid not in self._trusted:
                raise TypeError("the worker named a trusted object it was never given")
            return self._trusted[rid]
        hid, type_name, methods, attrs = payload
        with self._handle_lock:
            handle = self._handles.get(hid)
            if handle is None:
                handle = Remote(self, hid, type_name, methods)
                self._handles[hid] = handle
        if attrs is not None:
            # NOTE: stamped with the epoch of the reply (or snapshot) being decoded, never a
            # later one: another thread's call may have changed the object since.
            object.__setattr__(handle, "_snap", (self._local.stamp, attrs))
        return handle

    def _decode(self, data: bytes, stamp: int) -> Any:
        """Unpacks ``data``, stamping the snapshots of handles in it with epoch ``stamp``."""
        self._local.stamp = stamp
        return self._codec.unpack(data)

    def _bump_epoch(self) -> None:
        with self._epoch_lock:
            self._epoch += 1

    def snapshot(self, handle: Remote) -> dict | None:
        """Returns ``handle``'s plain attributes as of now (a round trip only when stale)."""
        snap = handle._snap
        if snap is None or snap[0] != self._epoch:
            epoch = self._epoch
            packed = self.request("snap", handle)
            if packed is None:
                object.__setattr__(handle, "_snap", None)
                return None
            snap = (epoch, packed)
        epoch, attrs = snap
        if type(attrs) is bytes:
            attrs = self._decode(attrs, epoch)
            object.__setattr__(handle, "_names", frozenset(attrs))
        object.__setattr__(handle, "_snap", (epoch, attrs))
        return attrs

    # --- calls -------------------------------------------------------------------------------
    def request(self, op: str, target: Remote | None, name: str | None = None,
                args: tuple | list = (), kwargs: dict | None = None) -> Any:
        """Sends one request and waits for its answer (re-raising the student's exception)."""
        if self.dead:
            raise WorkerDiedError(self.dead)
        args = list(args)
        kwargs = dict(kwargs) if kwargs else {}
        req_id = next(self._ids)
        slot = PendingReply()
        # NOTE: "concurrent" when another call is in flight (another thread's, or the one a
        # call-back being served here belongs to): the worker then keeps a thread reading
        # while it runs this one. A solo call costs the worker no thread wake-up.
        flags = FLAG_CONCURRENT if self._pending else 0
        self._pending[req_id] = slot
        message = [req_id, op, target, name, args, kwargs, flags]
        env = tuple(map(os.environ.get, FORWARDED_ENV)) + _device_state()
        if env != self._sent_env:
            self._sent_env = env  # NOTE: a test's monkeypatch.setenv, made visible to the worker
            message.append(dict(zip(FORWARDED_ENV + DEVICE_ENV, env)))
        try:
            body = self._codec.pack(message)
        except BaseException:
            self._pending.pop(req_id, None)
            raise
        if op != "getattr" and op != "snap":
            self._bump_epoch()
        try:
            with self._send_lock:
                write_all(self._out_fd, frame_header(len(body)) + body)
            self._await(slot)
        except BaseException:
            # NOTE: abandoned mid-call (a timeout, Ctrl-C, a broken pipe): the worker may be
            # stuck in that call, and a half-read frame leaves the stream unusable, so it
            # goes; the next test starts a fresh one.
            self.kill("a call was abandoned (timeout or interrupt)")
            raise
        finally:
            self._pending.pop(req_id, None)
        if slot.reply is None:
            raise WorkerDiedError(self.dead or "the worker died")
        status, payload, back, pure = slot.reply
        if not pure:
            self._bump_epoch()
        stamp = self._epoch
        if status == STATUS_RETIRED:
            self._retire()
        if status:
            raise _rebuild_exception(self._decode(payload, stamp))
        if back != _EMPTY_LIST:
            _copy_back(self._decode(back, stamp), args, kwargs)
        self._local.stamp = stamp
        return self._codec.unpack_result(payload, args, kwargs)

    def _await(self, slot: PendingReply) -> None:
        """Returns once ``slot`` has its reply or the worker died, reading replies if no one is."""
        while True:
            slot.event.clear()  # NOTE: before the checks, so a wake-up after them is not lost
            if slot.reply is not None or self.dead:
                return
            if self._read_lock.acquire(blocking=False):
                try:
                    callback = self._read_until(slot)
                finally:
                    self._read_lock.release()
                    self._wake_a_waiter()
                if callback is not None:
                    # NOTE: run with the read lock let go: the call-back may call the worker
                    # itself, and other threads' replies must still be read meanwhile. While
                    # one runs, the next gets its own thread: student threads calling back at
                    # once may wait for each other (no trusted thread is theirs to borrow).
                    with self._callback_lock:
                        busy = self._num_callbacks
                        self._num_callbacks += 1
                    if busy:
                        threading.Thread(target=self._serve_counted, args=callback,
                                         daemon=True).start()
                    else:
                        self._serve_counted(*callback)
                continue
            slot.event.wait(0.25)

    def _read_until(self, slot: PendingReply) -> tuple | None:
        """Reads replies until ``slot``'s; returns early with a call-back to run."""
        while slot.reply is None and not self.dead:
            frame = self._reader.read()
            if frame is None:
                code = self.proc.wait()
                self._mark_dead(f"the student's process (worker) died with {_exit_text(code)} "
                                f"while a call ran: os._exit, a crash or a kill — no points for "
                                f"that test{self.output_tail()}")
                return
            message = msgpack.unpackb(frame, raw=False)
            if len(message) == 3:
                return message[0], message[2]  # [callback id, "cb", body]
            req_id, status, payload, back, pure = message
            other = self._pending.get(req_id)
            if other is not None:
                other.reply = (status, payload, back, pure)
                if other is not slot:
                    other.event.set()

    def _serve_counted(self, cb_id: Any, body: Any) -> None:
        try:
            self._serve_callback(cb_id, body)
        finally:
            with self._callback_lock:
                self._num_callbacks -= 1

    def _serve_callback(self, cb_id: Any, body: Any) -> None:
        """Runs one call-back on a trusted object and sends its answer to the worker.

        NOTE: the worker is not trusted: only objects it was handed, only public names and
        :data:`CALLBACK_OPS`; arguments are codec-decoded values, the worker's own handles and
        the trusted objects it was handed.
        """
        try:
            op, target, name, args, kwargs = self._decode(body, self._epoch)
            rid = self._trusted_ids.get(id(target))
            if rid is None or self._trusted.get(rid) is not target:
                raise TypeError("a call-back may reach only trusted objects handed to student code")
            _CALLBACK_THREAD.active = True
            try:
                result = _run_callback(op, target, name, args, kwargs)
            finally:
                _CALLBACK_THREAD.active = False
            answer = [0, result]
            packed = self._codec.pack([cb_id, "cbreply", None, None, answer, {}])
        except Exception as exc:  # noqa: BLE001 — every failure goes back as data
            packed = self._codec.pack([cb_id, "cbreply", None, None,
                                       [1, _describe_exception(exc)], {}])
        try:
            with self._send_lock:
                write_all(self._out_fd, frame_header(len(packed)) + packed)
        except OSError:
            pass  # the worker is gone: the call waiting for it learns so

    def emulate_begin(self, kind: str) -> None:
        """Starts recording ``kind`` (``"racecheck"``, ``"streams"``) of the emulated launches
        the worker runs (``reference.emulate``'s recording blocks call it).

        Raises:
            WorkerDiedError: the worker is gone.
        """
        self.request("emulate", None, "begin", [kind])

    def emulate_end(self, kind: str) -> Any:
        """Stops recording ``kind`` and returns what the worker recorded, as plain data."""
        return self.request("emulate", None, "end", [kind])

    def count_torch_calls(self) -> "WorkerTorchCalls":
        """Returns a context manager counting the torch calls student code makes in the worker."""
        return WorkerTorchCalls(self)

    def _wake_a_waiter(self) -> None:
        """Wakes one thread still waiting for a reply, to read in turn."""
        for other in list(self._pending.values()):
            if other.reply is None:
                other.event.set()
                return

    def _drain_output(self) -> None:
        fd = self.proc.stderr.fileno()
        while chunk := os.read(fd, 65536):
            self._tail.append(chunk)
            self._tail_bytes += len(chunk)
            while self._tail_bytes > OUTPUT_TAIL_BYTES and len(self._tail) > 1:
                self._tail_bytes -= len(self._tail.popleft())

    def output_tail(self, chars: int = 1500) -> str:
        """Returns the end of what the worker printed (empty when nothing)."""
        text = b"".join(self._tail).decode(errors="replace").strip()
        return f"\n--- worker output (tail) ---\n{text[-chars:]}" if text else ""

    def _mark_dead(self, why: str) -> None:
        if self.dead is None:
            self.dead = why
        emulate = sys.modules.get("reference.emulate")
        if emulate is not None and self in emulate._remotes:
            emulate._remotes.remove(self)
        for slot in list(self._pending.values()):
            slot.event.set()

    def _retire(self) -> None:
        """The worker lost its CUDA context in the call just answered and is exiting: this
        client is dead (the next test starts a fresh worker), once the process is gone.

        NOTE: waited for here, before the test sees the error and frees its CUDA tensors:
        freeing memory the worker still maps would block in the driver.
        """
        self._mark_dead("the worker's CUDA context was lost in an earlier call (a sticky "
                        "error: an illegal address, a trap or a launch failure)")
        try:
            self.proc.wait(timeout=RETIRE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill(self.dead)

    def _namespace_worker_pid(self) -> int | None:
        """The worker's pid as this process's /proc names it (the child of ``unshare``)."""
        if self._worker_pid is None:
            self._worker_pid = namespace_worker_pid(self.proc.pid)
        return self._worker_pid

    def kill(self, why: str = "stopped") -> None:
        """Kills the worker; pending and later calls fail with :class:`WorkerDiedError`."""
        self._mark_dead(why)
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass


def _device_state() -> tuple:
    """The test process's emulated-device state, as the worker's DEVICE_ENV variables."""
    emulate = sys.modules.get("reference.emulate")
    if emulate is None:
        from reference.gpu import emulation_requested

        return ("emulate", None) if emulation_requested() else (None, None)
    if not emulate.emulating():
        return None, None
    major, minor = emulate.capability()
    return "emulate", f"{major}.{minor}"


def _run_callback(op: Any, target: Any, name: Any, args: Any, kwargs: Any) -> Any:
    if type(args) is not list or type(kwargs) is not dict \
            or not all(type(k) is str for k in kwargs):
        raise TypeError("malformed call-back arguments")
    if op == "op":
        if name not in CALLBACK_OPS:
            raise TypeError(f"operation {name!r} is not allowed on a trusted object")
        return CALLBACK_OPS[name](target, *args)
    if op == "call":
        if not callable(target):
            raise TypeError(f"a {type(target).__qualname__} cannot be called from student code")
        return target(*args, **kwargs)
    if op == "setattr" and type(name) is str and not name.startswith("_") and len(args) == 1:
        return _set_plain_attribute(target, name, args[0])
    if op not in ("getattr", "callmethod") or type(name) is not str or name.startswith("_") \
            or not name.isidentifier():
        raise AttributeError(f"{name!r}: student code may use only public attributes of a "
                             f"trusted object")
    value = getattr(target, name)
    if op == "getattr":
        return value
    if not callable(value) or isinstance(value, type):
        raise TypeError(f"{name!r} is not a method")
    return value(*args, **kwargs)


class WorkerTorchCalls:
    """``with`` it: ``.count`` is then the number of torch calls the worker's student code made.

    NOTE: what the worker reports; a dishonest worker can lie about it as student code in one
    process can dodge a ``TorchFunctionMode``: it is a check on honest mistakes (a Python loop
    over tokens), not a security boundary.
    """

    def __init__(self, client: WorkerClient) -> None:
        self._client, self.count = client, 0

    def __enter__(self) -> "WorkerTorchCalls":
        self._client.request("count_torch_calls", None, "start")
        return self

    def __exit__(self, *exc: object) -> None:
        count = self._client.request("count_torch_calls", None, "stop")
        self.count = count if type(count) is int else 0


def _may_hand_over(obj: Any) -> bool:
    """True for a trusted object student code may call back: an instance, function or bound
    method of the workbook's own code (a module loaded from the repository).

    NOTE: never a module, a class, a builtin or a library's object: whatever the worker can
    reach through call-backs runs as the grader's user, so a ``Path`` or a ``partial`` of
    ``os.system`` handed over by accident (or reached through a public attribute) would be a
    way out of the sandbox.
    """
    if isinstance(obj, (types.ModuleType, type, types.BuiltinFunctionType)):
        return False
    if type(obj) is object:
        return True  # a bare object() (a test's "not a block manager"): nothing to reach
    if isinstance(obj, types.FunctionType):
        return _workbook_module(obj.__module__)
    if isinstance(obj, types.MethodType):
        return _may_hand_over(obj.__self__) and _workbook_module(obj.__func__.__module__)
    return _workbook_module(type(obj).__module__)


def _workbook_module(name: Any) -> bool:
    module = sys.modules.get(name) if type(name) is str else None
    path = getattr(module, "__file__", None)
    if not path:
        return False
    try:
        return os.path.realpath(path).startswith(str(REPO_ROOT) + os.sep)
    except (TypeError, ValueError):
        return False


def _set_plain_attribute(target: Any, name: str, value: Any) -> None:
    """Sets a public instance attribute of a trusted object to a plain scalar (Lab 6's engine
    records its attention backend on the model); never a method, a property or an object."""
    if type(value) not in (type(None), bool, int, float, str):
        raise TypeError(f"student code may set a trusted object's attribute only to None, a "
                        f"bool, int, float or str, not a {type(value).__qualname__}")
    if not name.isidentifier() or hasattr(type(target), name):
        raise AttributeError(f"{name!r} of a trusted object cannot be set from student code")
    setattr(target, name, value)


def given(impl: Any, obj: Any) -> Any:
    """Returns given lab code (a class, a function) where ``impl``'s code runs.

    In one process that is ``obj`` itself; grading isolated, the worker's own import of it, so
    objects it makes live beside the student's (Lab 6's ``Sequence``, whose lists the student's
    block manager edits in place).

    Args:
        impl: the ``impl`` fixture's value.
        obj: a class or function of ``labs.*`` or ``reference.*``.
    """
    if not isinstance(impl, Remote):
        return obj
    client = object.__getattribute__(impl, "_client")
    return client.request("given", None, f"{obj.__module__}:{obj.__qualname__}")


def call_each(method: Any, arg_tuples: Any) -> list:
    """Returns ``[method(*args) for args in arg_tuples]``, in one round trip when grading
    isolated (``method`` a student object's method: the worker runs the loop).

    Same calls, same order, the first exception stops the loop, as the list comprehension
    would: only the number of round trips differs. Meant for tests' invariant checks that
    read one value per block (``get_ref_count`` over a whole pool).

    Args:
        method: a bound method (of a student object, or any callable in one process).
        arg_tuples: each call's positional arguments.

    Returns:
        The results, in order.
    """
    calls = [list(args) for args in arg_tuples]
    if isinstance(method, RemoteMethod):
        return method._owner._client.request("callmany", method._owner, method._name, [calls])
    return [method(*args) for args in calls]


def gather(reader: Any, *args: Any) -> Any:
    """Returns ``reader(*args)``, run where the student's objects live: in the worker when
    grading isolated (one round trip), here otherwise.

    For a lab's test helpers that only *read* a whole state (every block's ref count, every
    sequence's table) for the caller to check: one trip instead of one per value read. The
    checks stay with the caller; what comes back is what the student's objects said, as any
    value read from them is, and crosses through the codec like any result.

    Args:
        reader: a module-level function of a ``labs.*`` or ``reference.*`` module (the
            worker imports its own copy by name: nothing of the trusted side is sent).
        *args: its arguments (student objects, plain values).

    Returns:
        What ``reader`` returned.
    """
    client = next((object.__getattribute__(a, "_client") for a in args if isinstance(a, Remote)),
                  None)
    if client is None:
        return reader(*args)
    return client.request("gather", None, f"{reader.__module__}:{reader.__qualname__}", args)


def _exit_text(code: int) -> str:
    if code < 0:
        import signal

        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _trusted_class(mro: list) -> type[BaseException] | None:
    for module, name in mro:
        if module == "builtins":
            cls = getattr(builtins, name, None)
        elif module == reference_errors.__name__:
            cls = getattr(reference_errors, name, None)
        else:
            continue
        if isinstance(cls, type) and issubclass(cls, Exception):
            return cls
        if isinstance(cls, type) and issubclass(cls, BaseException):
            return None  # SystemExit, KeyboardInterrupt: never raised here as themselves
    return None


def _rebuild_exception(data: list) -> BaseException:
    mro, args, text, attrs = data
    cls = _trusted_class(mro)
    origin = ".".join(mro[0])
    if cls is None:
        return RemoteError(f"{origin}: {text}" if text else origin)
    try:
        exc = cls(*args)
        if str(exc) != text:
            exc = cls(text)
    except Exception:  # noqa: BLE001 — a constructor with other arguments
        exc = cls(text)
    for key, value in attrs.items():
        try:
            setattr(exc, key, value)
        except Exception:  # noqa: BLE001
            pass
    return exc


def _copy_back(changed: list, args: list, kwargs: dict) -> None:
    for key, value in changed:
        target = args[key] if isinstance(key, int) else kwargs[key]
        if hasattr(target, "copy_"):
            import torch

            with torch.no_grad():
                if _same_view(target, value):
                    # A view that crossed with its whole storage: the whole storage comes back.
                    storage_bytes(target).copy_(storage_bytes(value).to(target.device))
                else:
                    target.copy_(value.to(target.device))
        else:
            target[...] = value


def _same_view(target, value) -> bool:
    """True when ``value`` is a view like ``target`` (shape, stride, offset) over a storage of
    the same size that is more than the view: the codec's form of a strided tensor."""
    import torch

    return isinstance(value, torch.Tensor) and isinstance(target, torch.Tensor) and \
        not is_compact(value) and value.dtype == target.dtype and \
        value.shape == target.shape and value.stride() == target.stride() and \
        value.storage_offset() == target.storage_offset() and \
        value.untyped_storage().nbytes() == target.untyped_storage().nbytes()


_CLIENTS: dict[str, WorkerClient] = {}
#: Workers being started ahead of the first test (see :func:`prestart`), by lab.
_STARTING: dict[str, threading.Thread] = {}


def prestart(lab: str) -> None:
    """Starts ``lab``'s worker in the background, so its start (an interpreter, numpy, torch,
    the student's module) overlaps the test process's own collection.

    A worker that fails to start is not reported here: :func:`remote_impl` then starts one
    itself, and each test gets the error.

    Args:
        lab: a lab folder name.
    """
    if lab in _CLIENTS or lab in _STARTING:
        return

    def start() -> None:
        try:
            _CLIENTS[lab] = WorkerClient(lab)
        except BaseException:  # noqa: BLE001 — reported by remote_impl's own attempt
            pass

    thread = _STARTING[lab] = threading.Thread(target=start, name="worker-start", daemon=True)
    thread.start()


def prestart_for_args(args: list[str]) -> None:
    """Prestarts the worker when pytest's command-line ``args`` name tests of one lab only.

    Args:
        args: pytest's arguments (options and their values are skipped: they name no lab).
    """
    labs = {lab_of_path(arg.split("::")[0]) for arg in args if not arg.startswith("-")}
    labs.discard(None)
    if len(labs) == 1:
        prestart(labs.pop())


def live_worker_home() -> Path | None:
    """The home of a live worker, or None: a child process that runs student code as the same
    user (``reference.child``) shares it, and with it the kernels the worker compiled."""
    for client in list(_CLIENTS.values()):
        if not client.dead:
            return client.home
    return None


def remote_impl(lab: str) -> Remote:
    """Returns the proxy of ``lab``'s implementation (starting a worker when none is alive)."""
    starting = _STARTING.pop(lab, None)
    if starting is not None:
        starting.join()
    client = _CLIENTS.get(lab)
    if client is None or client.dead:
        client = _CLIENTS[lab] = WorkerClient(lab)
    return client.module
