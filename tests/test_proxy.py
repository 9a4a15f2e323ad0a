"""The isolation proxy's contract: what a test reads through ``impl`` under grading is what it
would read in-process — attribute snapshots never outlive a call that may change them, and
concurrent calls really run concurrently in the worker."""

from __future__ import annotations

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

        def take(self, block_id):
            if self.blocks[block_id].ref_count:
                raise OutOfBlocksError(f"block {block_id} is taken")
            self.blocks[block_id].ref_count += 1

        def meet(self):
            self._barrier.wait()  # returns only when 4 calls are inside at once
            return True
'''


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
    from reference.grader.sandbox import IN_PROCESS_LABS
    from reference.paths import REPO_ROOT, lab_names

    readme = (REPO_ROOT / "README.md").read_text()
    for lab, reason in IN_PROCESS_LABS.items():
        assert lab in lab_names() and reason
        assert f"Lab {int(lab[3:5])}" in readme.split("Known gap")[1], lab
