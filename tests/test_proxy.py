"""The isolation proxy's contract: what a test reads through ``impl`` under grading is what it
would read in-process — attribute snapshots never outlive a call that may change them, and
concurrent calls really run concurrently in the worker."""

from __future__ import annotations

import os
import stat
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest

from reference.errors import OutOfBlocksError
from reference.grader.sandbox import IsolationError, ensure_worker_user, grant_traverse
from reference.loader import MUTANT_DIR_ENV

try:
    ensure_worker_user()
    CANNOT = None
except IsolationError as exc:  # not root, no sudo: nothing here can run
    CANNOT = str(exc)

# NOTE: slow: every test starts a worker process (seconds each on 2 cores).
pytestmark = pytest.mark.slow

needs_worker = pytest.mark.skipif(CANNOT is not None, reason=f"isolation unavailable: {CANNOT}")

MODULE = '''
    import threading

    from reference.errors import OutOfBlocksError


    class Block:
        def __init__(self, block_id):
            self.block_id, self.ref_count, self.block_hash = block_id, 0, None


    class Manager:
        def __init__(self, n):
            self.blocks = [Block(i) for i in range(n)]
            self.reads = 0
            self._barrier = threading.Barrier(4, timeout=20)

        @property
        def num_reads(self):
            self.reads += 1  # a property runs code: its value must never come from a snapshot
            return self.reads

        @property
        def num_free_blocks(self):
            return sum(1 for b in self.blocks if not b.ref_count)

        def get_ref_count(self, block_id):
            return self.blocks[block_id].ref_count

        def take(self, block_id):
            if self.blocks[block_id].ref_count:
                raise OutOfBlocksError(f"block {block_id} is taken")
            self.blocks[block_id].ref_count += 1

        def meet(self):
            self._barrier.wait()  # returns only when 4 calls are inside at once
            return True


    class Pool:
        def __init__(self, num_rows, manager=None):
            import torch

            self.cache = torch.zeros(num_rows, 4)
            self.manager = manager
            self._ids = [1, 2]

        def take(self, n):
            return self.manager.allocate(n)  # a call-back into the trusted process

        def ids_live(self):
            return self._ids  # the pool's own list (a bug a test catches by editing it)

        def ids_copy(self):
            return list(self._ids)

        def write(self, row, value):
            self.cache[row] = value

        def aliases_cache(self, t):
            return t.untyped_storage().data_ptr() == self.cache.untyped_storage().data_ptr()

        def poke(self, obj, name):
            return getattr(obj, name)

        def call(self, fn, *args):
            return fn(*args)


    def raw_callback(obj, op, name):
        # What a dishonest submission would do: skip the stub and ask the trusted side itself.
        return object.__getattribute__(obj, "_worker").callback(op, obj, name)


    def forged_shared(pid, fd):
        # A shared-tensor reference to a file the worker does not own (the grader's own files).
        import msgpack

        body = msgpack.packb(["0" * 32, pid, fd, 8, "torch.uint8", [8], [1], 0])
        return msgpack.ExtType(16, body)


    def forged_handle(rid):
        import msgpack

        return msgpack.ExtType(4, msgpack.packb([rid]))


    def read_env(name):
        import os

        return os.environ.get(name)


    def stray_write(t):
        # A kernel's stray store: one element past the view's end, inside its storage.
        flat = t.new_empty(0).set_(t.untyped_storage())
        flat[t.storage_offset() + t.numel()] = 42


    def fill(out, value):
        out[...] = value
        return out, out[0:1]


    def poke_far(t):
        import cupy

        # A kernel's store far outside any allocation: an illegal address, sticky in this
        # process's CUDA context. Launches are asynchronous: the call returns before it faults.
        kernel = cupy.RawKernel(
            'extern "C" __global__ void poke(float* out) { out[(long long)1 << 40] = 1.0f; }',
            "poke")
        kernel((1,), (1,), (cupy.asarray(t),))


    def fault_as_if_on_a_gpu():
        import sys

        # Stands in for a kernel fault on a machine without a GPU: the worker's check of its
        # CUDA context (made after every call that raised) reports the context lost.
        sys.modules["__main__"]._cuda_context_lost = lambda: True
        raise RuntimeError("cudaErrorIllegalAddress: a stand-in")


    def crossed_by_ipc(t):
        import sys

        # NOTE: the worker runs as ``python -m reference.grader.worker``: its module is __main__
        return sys.modules["__main__"]._WORKER[0]._shared.is_shared(t)


    def layout(t):
        return [list(t.stride()), t.storage_offset(), t.data_ptr() % 16, t.is_contiguous(),
                t.tolist()]
'''


class _Allocator:
    """A trusted object handed to student code (as Lab 2's tests hand an allocator)."""

    def __init__(self) -> None:
        self.num_free_blocks = 4
        self._secret = "the key"
        # A library object: never reachable from the worker.
        self.folder = Path(tempfile.gettempdir())

    def allocate(self, n):
        if n > self.num_free_blocks:
            raise OutOfBlocksError(f"{n} blocks wanted, {self.num_free_blocks} free")
        self.num_free_blocks -= n
        return list(range(n))


@pytest.fixture
def client(monkeypatch):
    """A worker serving :data:`MODULE` as Lab 1's implementation (the mutant-folder route)."""
    # NOTE: not tmp_path: pytest's base folder is private (0700) and the worker's user must
    # read this one (nothing secret in it).
    with tempfile.TemporaryDirectory(prefix="pagedlab-proxy-") as tmp:
        folder = Path(tmp)
        folder.chmod(0o755)
        (folder / "solution.py").write_text(textwrap.dedent(MODULE))
        monkeypatch.setenv(MUTANT_DIR_ENV, str(folder))
        from reference.grader.proxy import WorkerClient

        worker = WorkerClient("lab01_block_manager")
        yield worker
        worker.kill()


@needs_worker
def test_the_worker_is_process_1_of_its_own_pid_namespace_where_it_can_be(client):
    """As root with no GPU visible (CI), the worker runs as process 1 of a PID namespace of its
    own, with a /proc that shows only that namespace, as the worker user with no supplementary
    groups, so whatever it leaves running dies with it; elsewhere it runs without one (the
    grader says so on standard error)."""
    from reference.grader.sandbox import WORKER_USER, pid_namespace_works
    import pwd

    children = Path(f"/proc/{client.proc.pid}/task/{client.proc.pid}/children").read_text().split()
    worker = children[0] if children else str(client.proc.pid)
    status = dict(line.split(":", 1) for line in
                  Path(f"/proc/{worker}/status").read_text().splitlines() if ":" in line)
    assert int(status["Uid"].split()[0]) == pwd.getpwnam(WORKER_USER).pw_uid
    assert status["Groups"].split() in ([], [str(pwd.getpwnam(WORKER_USER).pw_gid)])
    ns_pids = status["NSpid"].split()
    if pid_namespace_works():
        assert len(ns_pids) == 2 and ns_pids[1] == "1", \
            f"the worker is not process 1 of a namespace of its own: NSpid {ns_pids}"
        # /proc/<pid>/root is the worker's own view of the file system: its /proc lists only
        # its namespace (another grading's worker, same user, is out of its reach there)
        seen = sorted(d for d in os.listdir(f"/proc/{worker}/root/proc") if d.isdigit())
        assert seen == ["1"], f"the worker's /proc shows processes outside it: {seen[:10]}"
    else:
        assert len(ns_pids) == 1


@needs_worker
def test_attribute_reads_see_every_change_a_call_made(client):
    """A block's ref_count read after ``take`` is the new value: snapshots die with each call."""
    manager = client.module.Manager(4)
    blocks = manager.blocks
    assert [b.ref_count for b in blocks] == [0, 0, 0, 0]
    manager.take(2)
    assert [b.ref_count for b in blocks] == [0, 0, 1, 0], "a snapshot outlived a call"
    assert manager.blocks[2].ref_count == 1
    with pytest.raises(OutOfBlocksError):
        manager.take(2)


@needs_worker
def test_properties_run_on_every_read_and_containers_are_fresh(client):
    """Properties (student code) are never answered from a snapshot; a list attribute read twice
    gives two lists, as two round trips would."""
    manager = client.module.Manager(2)
    assert [manager.num_reads for _ in range(3)] == [1, 2, 3]
    assert manager.reads == 3
    first = manager.blocks
    first.append("x")
    assert len(manager.blocks) == 2, "a test's change to a returned list leaked into the next read"


@needs_worker
def test_concurrent_calls_run_concurrently_in_the_worker(client):
    """Four threads meet at a barrier inside student code: only possible if the worker runs
    their calls at the same time (a serialised worker would time the barrier out)."""
    manager = client.module.Manager(1)
    results: list[object] = []

    def meet():
        try:
            results.append(manager.meet())
        except Exception as exc:  # noqa: BLE001
            results.append(exc)

    threads = [threading.Thread(target=meet) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [True] * 4, f"calls did not overlap in the worker: {results}"


def test_grant_traverse_lets_others_enter_but_not_list(tmp_path):
    """Folders above a path become enterable by everyone (o+x) and stay unlistable."""
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    (tmp_path / "a").chmod(0o700)
    deep.chmod(0o700)
    changed = grant_traverse([deep / "python"])
    mode = (tmp_path / "a").stat().st_mode
    assert mode & stat.S_IXOTH and not mode & stat.S_IROTH
    assert deep in changed and (tmp_path / "a") in changed


def test_in_process_labs_are_real_labs_and_stated_in_the_readme():
    """Every lab that isolated grading leaves in-process exists and is named, with its reason, in
    the instructors' threat model (a hole nobody can see is worse than a stated one)."""
    from reference.grader.sandbox import GPU_IN_PROCESS_LABS, IN_PROCESS_LABS
    from reference.paths import REPO_ROOT, lab_names

    readme = (REPO_ROOT / "README.md").read_text()
    for lab, reason in {**IN_PROCESS_LABS, **GPU_IN_PROCESS_LABS}.items():
        assert lab in lab_names() and reason
        assert f"Lab {int(lab[3:5])}" in readme.split("Known gap")[1], lab


@needs_worker
def test_call_backs_reach_trusted_objects_and_keep_identity(client):
    """A trusted object passed to student code is called back (its state changes here), comes
    back as the very same object, and its exceptions cross as their trusted class."""
    bm = _Allocator()
    pool = client.module.Pool(2, bm)
    assert pool.manager is bm
    assert pool.take(3) == [0, 1, 2] and bm.num_free_blocks == 1
    with pytest.raises(OutOfBlocksError, match="2 blocks wanted"):
        pool.take(2)
    assert pool.poke(bm, "num_free_blocks") == 1


@needs_worker
@pytest.mark.parametrize("op, name", [("getattr", "_secret"), ("getattr", "__class__"),
                                      ("callmethod", "__init__"), ("getattr", "__dict__"),
                                      ("op", "setitem"), ("op", "getattr"), ("call", None)])
def test_call_backs_refuse_private_names_and_unlisted_operations(client, op, name):
    """Student code may read only public attributes of a trusted object and use a few operators:
    no private state, no way from it to its class, module or globals — also when it bypasses
    its stub and sends the call-back itself."""
    bm = _Allocator()
    pool = client.module.Pool(2, bm)
    if name == "_secret":
        with pytest.raises(AttributeError):
            pool.poke(bm, name)
    with pytest.raises((AttributeError, TypeError)):
        client.module.raw_callback(bm, op, name)


@needs_worker
def test_call_backs_run_concurrently_and_may_call_the_worker(client):
    """Four student threads each wait in a trusted call-back for the other three (a barrier
    here), and a call-back that calls the worker again is answered: no deadlock."""
    pool = client.module.Pool(2)
    barrier = threading.Barrier(4, timeout=20)
    results: list[object] = []

    def run():
        try:
            results.append(pool.call(lambda: barrier.wait() >= 0 and pool.ids_copy()))
        except Exception as exc:  # noqa: BLE001
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [[1, 2]] * 4, f"call-backs did not overlap or deadlocked: {results}"


@needs_worker
def test_attribute_tensors_are_shared_both_ways(client):
    """A tensor attribute (a pool's cache) is the worker's memory: the test's writes reach the
    student code, the student's writes are seen by the test, and a view of it handed back
    aliases it in the worker."""
    pool = client.module.Pool(3)
    cache = pool.cache
    cache.fill_(7.0)
    pool.write(1, 3.0)
    assert cache[:, 0].tolist() == [7.0, 3.0, 7.0]
    assert pool.aliases_cache(cache[1:].t())
    assert not pool.aliases_cache(cache.clone())


@needs_worker
def test_views_keep_strides_offsets_and_alignment(client):
    """A transposed, sliced or misaligned view reaches student code as that view: same strides,
    storage offset and address modulo 16 as in one process."""
    import torch

    base = torch.arange(24, dtype=torch.float16)
    for view in (base.view(4, 6).t(), base.view(4, 6)[:, ::2], base[1:].view(23),
                 base.view(4, 6)[1:]):
        assert client.module.layout(view) == [list(view.stride()), view.storage_offset(),
                                              view.data_ptr() % 16, view.is_contiguous(),
                                              view.tolist()]


@needs_worker
def test_a_list_the_student_object_keeps_stays_live(client):
    """A returned list the student's object still holds is that list, as in one process:
    editing it edits the object (so "returns a copy" tests catch it); a fresh list is a list."""
    pool = client.module.Pool(1)
    fresh = pool.ids_copy()
    assert type(fresh) is list
    live = pool.ids_live()
    assert live == [1, 2]
    live.append(9)
    assert pool.ids_copy() == [1, 2, 9]


@needs_worker
def test_forged_references_from_the_worker_are_refused(client):
    """A worker naming a file it does not own as a shared tensor (the grader's stdin, pid 1's
    files) or a trusted object it was never handed gets a TypeError, nothing mapped or reached."""
    import os

    for pid, fd in ((os.getpid(), 0), (1, 0), (os.getpid(), 999)):
        with pytest.raises(TypeError):
            client.module.forged_shared(pid, fd)
    with pytest.raises(TypeError):
        client.module.forged_handle(12345)


@needs_worker
def test_only_workbook_objects_are_handed_to_student_code(client):
    """Objects of libraries and builtins (a Path, os.system, a partial) never cross as
    call-backs — whatever the worker reaches runs as the grader's user — neither as arguments
    nor through a public attribute of a trusted object."""
    import functools
    import os

    pool = client.module.Pool(1, _Allocator())
    for obj in (Path("/"), os.system, functools.partial(print), os):
        with pytest.raises(TypeError):
            pool.call(obj)
    with pytest.raises(TypeError, match="cannot be passed"):
        pool.poke(_Allocator(), "folder")


@needs_worker
def test_a_tests_debug_variable_reaches_the_worker(client, monkeypatch):
    """``monkeypatch.setenv("PAGEDLAB_DEBUG", ...)`` in a test is what student code reads in
    the worker on the next call, and undoing it unsets it there too (the launchers' debug
    checks follow it)."""
    monkeypatch.delenv("PAGEDLAB_DEBUG", raising=False)
    assert client.module.read_env("PAGEDLAB_DEBUG") is None
    monkeypatch.setenv("PAGEDLAB_DEBUG", "1")
    assert client.module.read_env("PAGEDLAB_DEBUG") == "1"
    monkeypatch.delenv("PAGEDLAB_DEBUG")
    assert client.module.read_env("PAGEDLAB_DEBUG") is None
    monkeypatch.setenv("HOME", "/somewhere")  # NOTE: not forwarded: the worker keeps its own
    assert client.module.read_env("HOME") != "/somewhere"


@needs_worker
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_views_on_every_device_keep_layout_and_stray_writes_come_back(client, device):
    """A strided or offset view — CUDA too, where it crosses as a copy of its whole storage —
    reaches student code with its strides, offset and alignment, and a store past the view's
    end (inside its storage: a kernel's stray write) is seen by the caller, as in one process,
    so the tests' poisoned padding still catches it."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("GPU-REQ: no CUDA GPU visible to torch")
    base = torch.arange(24, dtype=torch.float16, device=device)
    for view in (base.view(4, 6).t(), base.view(4, 6)[:, ::2], base[1:].view(23),
                 base.view(4, 6)[1:3]):
        assert client.module.layout(view) == [list(view.stride()), view.storage_offset(),
                                              view.data_ptr() % 16, view.is_contiguous(),
                                              view.tolist()]
    base = torch.zeros(16, dtype=torch.float32, device=device)
    client.module.stray_write(base[2:6])
    assert base[6].item() == 42, "a store past the view was lost on the way back"


@needs_worker
def test_an_argument_returned_is_the_callers_own_object(client):
    """A launcher that writes into ``out=`` and returns it gives the test its own array back
    (``got is out``, as in one process), with the writes in it; anything else it returns —
    a view of it — is a new value."""
    import numpy as np
    import torch

    for out in (np.zeros(4, np.float32), torch.zeros(4)):
        got, part = client.module.fill(out, 3)
        assert got is out and part is not out
        assert list(out.tolist()) == [3, 3, 3, 3] and list(part.tolist()) == [3]


@needs_worker
def test_cuda_tensors_cross_by_ipc_when_each_is_its_own_allocation(client):
    """Graded isolated (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, set by the grader), a CUDA tensor
    a test passes crosses by CUDA IPC: the worker writes the test's own memory, no copy."""
    import os

    import torch

    if not torch.cuda.is_available():
        pytest.skip("GPU-REQ: no CUDA GPU visible to torch")
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
        pytest.skip("needs PYTORCH_NO_CUDA_MEMORY_CACHING=1 from the process start (the grader's)")
    base = torch.zeros(4096, device="cuda")
    assert client.module.crossed_by_ipc(base[8:])
    client.module.stray_write(base[8:16])
    assert base[16].item() == 42


@needs_worker
def test_a_call_that_loses_the_cuda_context_retires_the_worker(client):
    """When a call leaves the worker's CUDA context lost, its error still reaches the test, the
    worker has exited by the time it does (code 75) and the client is dead, so the next test
    starts a fresh worker instead of calling into a worker that can no longer run kernels."""
    from reference.grader.proxy import WorkerDiedError
    from reference.grader.worker import EXIT_CUDA_LOST

    with pytest.raises(RuntimeError, match="a stand-in"):
        client.module.fault_as_if_on_a_gpu()
    assert client.dead and "CUDA context was lost" in client.dead, client.dead
    assert client.proc.poll() == EXIT_CUDA_LOST, client.proc.poll()
    with pytest.raises(WorkerDiedError, match="CUDA context was lost"):
        client.module.Manager(2)


@needs_worker
def test_a_kernel_fault_on_ipc_memory_retires_the_worker(client):
    """[GPU] A call whose kernel faults (a sticky CUDA error) fails with that error, and the
    worker exits at once: the test can free the memory the worker had mapped, and the next
    call gets a fresh worker. A worker kept alive with a lost context blocked the freeing of
    that memory, and so the next test, until its timeout (180 s per Lab 4 case, H200)."""
    import os
    import time

    import torch

    from reference.grader.proxy import WorkerClient

    if not torch.cuda.is_available():
        pytest.skip("GPU-REQ: no CUDA GPU visible to torch")
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
        pytest.skip("needs PYTORCH_NO_CUDA_MEMORY_CACHING=1 from the process start (the grader's)")
    base = torch.zeros(4096, device="cuda")
    with pytest.raises(BaseException, match="(?i)illegal"):
        client.module.poke_far(base)
    assert client.dead and "CUDA context was lost" in client.dead, client.dead
    assert client.proc.poll() is not None, "the worker is still running after it retired"
    start = time.monotonic()
    del base
    torch.cuda.synchronize()
    fresh = torch.ones(4096, device="cuda")
    assert time.monotonic() - start < 10, "freeing the faulted call's memory blocked"
    worker = WorkerClient("lab01_block_manager")
    try:
        worker.module.stray_write(fresh[8:16])
        assert fresh[16].item() == 42, "a fresh worker did not serve the next call"
    finally:
        worker.kill()


@needs_worker
def test_call_each_is_the_loop_in_one_round_trip(client):
    """``call_each(obj.method, args)`` makes the same calls in the same order as the list
    comprehension, in one round trip; the first exception stops it, raised as the same class."""
    from reference.grader.proxy import call_each

    manager = client.module.Manager(4)
    assert call_each(manager.take, [(0,), (2,)]) == [None, None]
    assert [b.ref_count for b in manager.blocks] == [1, 0, 1, 0]
    with pytest.raises(OutOfBlocksError, match="block 2 is taken"):
        call_each(manager.take, [(1,), (2,), (3,)])
    assert [b.ref_count for b in manager.blocks] == [1, 1, 1, 0], "the loop went on past the error"
    assert call_each(len, [([1, 2],)]) == [2]  # a local callable: a plain loop


@needs_worker
def test_gather_runs_a_reader_where_the_objects_live_in_one_round_trip(client):
    """``gather(reader, obj)`` returns what ``reader(obj)`` returns in one process, in one round
    trip; its errors come back as the same class; the worker runs only workbook code by name."""
    from labs.lab01_block_manager._state import _ref_counts
    from reference.grader.proxy import gather

    manager = client.module.Manager(4)
    manager.take(1)
    first = next(client._ids)
    assert gather(_ref_counts, manager, 4) == ([0, 1, 0, 0], 3)
    assert next(client._ids) == first + 2, "gather took more than one round trip"
    with pytest.raises(IndexError):
        gather(_ref_counts, manager, 5)
    for name in ("os:system", "tests.test_proxy:_Allocator", "labs.lab01_block_manager._state:a.b"):
        with pytest.raises(ValueError, match="is not workbook code"):
            client.request("gather", None, name, ["true"])
    local = [type("M", (), {"get_ref_count": lambda self, i: i, "num_free_blocks": 7})()]
    assert gather(_ref_counts, *local, 2) == ([0, 1], 7)  # no student object: a plain call
