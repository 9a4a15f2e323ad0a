"""Test helpers for Lab 1: snapshots of a manager's whole state, and the invariant check.

NOTE: the readers (``_snapshot``, ``_observe``) run through ``gather``: where the manager
lives, so graded isolated a whole state is read in one round trip, not one per block.
"""

from __future__ import annotations

import contextlib
import sys

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
