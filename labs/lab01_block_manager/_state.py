"""Test helpers for Lab 1: snapshots of a manager's whole state, and the invariant check.

NOTE: the readers (``_snapshot``, ``_observe``) run through ``gather``: where the manager
lives, so graded isolated a whole state is read in one round trip, not one per block.
"""

from __future__ import annotations

import contextlib
import sys
import threading

from reference.grader.proxy import Remote, gather


@contextlib.contextmanager
def frequent_thread_switches(impl):
    """Makes Python switch threads as often as it can where ``impl``'s code runs, so that
    calls made from several threads interleave inside it (a missing lock shows).

    NOTE: graded isolated, the student's code runs in the grading worker, which always
    switches that often; this process's threads only send calls there, and switching them
    faster would only slow the test down.
    """
    if isinstance(impl, Remote):
        yield
        return
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def snapshot(bm) -> tuple:
    """Everything observable about a BlockManager, as a comparable value."""
    return gather(_snapshot, bm)


def _snapshot(bm) -> tuple:
    return (
        tuple(bm.free_block_queue.block_ids()),
        tuple(b.ref_count for b in bm.blocks),
        tuple(b.block_hash for b in bm.blocks),
        tuple(sorted((h, b.block_id) for h, b in bm.cached_block_hash_to_block.items())),
    )


def ref_counts(bm, num_blocks: int) -> tuple[list, int]:
    """``([bm.get_ref_count(i) for i in range(num_blocks)], bm.num_free_blocks)``."""
    return gather(_ref_counts, bm, num_blocks)


def _ref_counts(bm, num_blocks: int) -> tuple[list, int]:
    return [bm.get_ref_count(i) for i in range(num_blocks)], bm.num_free_blocks


def _observe(bm) -> dict:
    """What :func:`check_invariants` checks, read in one go (plain values only)."""
    table = bm.cached_block_hash_to_block
    return {
        "queued": list(bm.free_block_queue.block_ids()),
        "num_free_blocks": bm.num_free_blocks,
        "num_blocks": bm.num_blocks,
        "blocks": [(b.block_id, b.ref_count, b.block_hash) for b in bm.blocks],
        "entries": [(h, b.block_hash) for h, b in table.items()],
        # per block: its hash's map entry is the block itself (None: the block has no hash)
        "own_entry": [None if b.block_hash is None else table.get(b.block_hash) is b
                      for b in bm.blocks],
    }


def check_invariants(bm) -> None:
    """Asserts the manager's invariants, with a message that says which one broke."""
    state = gather(_observe, bm)
    queued, num_free = state["queued"], state["num_free_blocks"]
    assert len(queued) == len(set(queued)), f"a block is queued twice: {queued}"
    assert len(queued) == num_free, (
        f"num_free_blocks={num_free} but the free queue holds {len(queued)} blocks"
    )
    in_queue = set(queued)
    for block_id, ref_count, _ in state["blocks"]:
        assert ref_count >= 0, f"block {block_id} has ref_count {ref_count}"
        assert (block_id in in_queue) == (ref_count == 0), (
            f"block {block_id}: ref_count={ref_count} but "
            f"{'in' if block_id in in_queue else 'not in'} the free queue — a block must be "
            f"free xor used"
        )
    used = sum(1 for _, ref_count, _ in state["blocks"] if ref_count > 0)
    assert used + num_free == state["num_blocks"], "free + used != total"
    for h, block_hash in state["entries"]:
        assert block_hash == h, f"map entry {h} points at block with hash {block_hash}"
    for (block_id, _, block_hash), own in zip(state["blocks"], state["own_entry"]):
        if block_hash is not None:
            assert own, f"block {block_id} has hash {block_hash} but is not its map entry"


class _SlipInLock:
    """A lock that lets one other call in at one moment: just before its first ``acquire``
    (``"pre"``) or just after its first ``release`` (``"post"``) — what another thread could do
    there if a call took the lock more than once, or read shared state outside it."""

    def __init__(self, when: str, other):
        self._lock, self._when, self._other = threading.Lock(), when, other

    def _slip_in(self, when: str) -> None:
        if self._when == when and self._other is not None:
            other, self._other = self._other, None
            other()

    def acquire(self, *args, **kwargs):
        self._slip_in("pre")
        return self._lock.acquire(*args, **kwargs)

    def release(self) -> None:
        self._lock.release()
        self._slip_in("post")

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _outcome(call, messages: list | None = None) -> tuple:
    """(``"ok"``, the value) or (``"raised"``, the exception's class name); the exception's
    text goes to ``messages`` (for the failure message, not the comparison)."""
    try:
        return ("ok", call())
    except Exception as exc:  # noqa: BLE001 — the outcome is the point
        if messages is not None:
            messages.append(f"{type(exc).__name__}: {exc}")
        return ("raised", type(exc).__name__)


def call_with_another_slipped_in(scenario: str) -> dict:
    """Runs one of three scenarios on the implementation's ``BlockManager`` with its ``_lock``
    replaced by one that lets a competing call in mid-way, and reports what each call saw.

    NOTE: tests call it through ``reference.grader.proxy.given``: it runs where the student's
    code runs (graded isolated, a lock swapped in the test's process could not reach it).

    Args:
        scenario: ``"get_computed_blocks"`` (two freed cached blocks; an ``allocate`` after the
            lock's first release), ``"get_cached_block"`` (one freed cached block; an
            ``allocate`` before its first acquire), ``"free_blocks"`` / ``"free"`` /
            ``"increase_ref_count"`` (one block in use; that call on it, with a ``free`` of it
            after the call's first release).

    Returns:
        ``{"call": outcome, "other": outcome, "ref_counts": [...], "num_free_blocks": n,
        "errors": [...]}``, outcomes as ``("ok", value)`` or ``("raised", "ErrorName")``,
        ``errors`` the raised exceptions' texts.
    """
    from reference.loader import load_impl

    impl = load_impl("lab01_block_manager")
    other: list = []
    errors: list = []
    if scenario == "get_computed_blocks":
        bm = impl.BlockManager(2)
        h0 = impl.hash_block_tokens(None, [1])
        h1 = impl.hash_block_tokens(h0, [2])
        bm.allocate_n(2)
        bm.cache_block(0, h0)
        bm.cache_block(1, h1)
        bm.free(0)
        bm.free(1)
        bm._lock = _SlipInLock("post", lambda: other.append(_outcome(bm.allocate, errors)))
        result = _outcome(lambda: bm.get_computed_blocks([h0, h1]), errors)
    elif scenario == "get_cached_block":
        bm = impl.BlockManager(1)
        h = impl.hash_block_tokens(None, [7])
        bm.cache_block(bm.allocate(), h)
        bm.free(0)
        bm._lock = _SlipInLock("pre", lambda: other.append(_outcome(bm.allocate, errors)))
        result = _outcome(lambda: bm.get_cached_block(h), errors)
    elif scenario in ("free_blocks", "free", "increase_ref_count"):
        bm = impl.BlockManager(2)
        block_id = bm.allocate()
        bm._lock = _SlipInLock("post", lambda: other.append(
            _outcome(lambda: bm.free(block_id), errors)))
        call = {"free_blocks": lambda: bm.free_blocks([block_id]),
                "free": lambda: bm.free(block_id),
                "increase_ref_count": lambda: bm.increase_ref_count(block_id)}[scenario]
        result = _outcome(call, errors)
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    bm._lock = threading.Lock()
    return {"call": result, "other": other[0] if other else None,
            "ref_counts": [bm.get_ref_count(i) for i in range(bm.num_blocks)],
            "num_free_blocks": bm.num_free_blocks, "errors": errors}
