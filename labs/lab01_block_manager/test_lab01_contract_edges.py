"""Lab 1, the contract's edges: refusals that come before "already cached", hashes and ids
given as torch scalars, a queue that knows its own blocks, and calls that stay atomic when
another call slips in between."""

from __future__ import annotations

import pytest

from labs.lab01_block_manager._state import call_with_another_slipped_in, snapshot
from reference.errors import BlockNotAllocatedError, DoubleFreeError
from reference.expect import raises_naming
from reference.grader.proxy import given


def _refused(bm, call, error):
    """Runs ``call``, expects ``error``, and checks the manager did not change."""
    before = snapshot(bm)
    with pytest.raises(error):
        call()
    assert snapshot(bm) == before, "a refused call changed the manager (check first, then change)"


@pytest.mark.points(1)
def test_cache_block_and_sharing_refuse_before_anything_else(impl):
    """``cache_block`` raises for a block cached under another hash and for a free block even
    when another block holds the hash (the refusals come before the False return), and
    ``increase_ref_count`` refuses a free block even when it is cached."""
    bm = impl.BlockManager(4)
    a, b = bm.allocate_n(2)
    assert bm.cache_block(a, 111) and bm.cache_block(b, 222)
    _refused(bm, lambda: bm.cache_block(a, 222), ValueError)
    c = bm.allocate()
    bm.free(c)
    _refused(bm, lambda: bm.cache_block(c, 111), BlockNotAllocatedError)
    bm.free(a)  # free, still cached under 111
    _refused(bm, lambda: bm.increase_ref_count(a), BlockNotAllocatedError)


@pytest.mark.points(1)
def test_hashes_and_ids_given_as_torch_scalars_act_as_ints(impl):
    """torch integer scalars are turned into Python ints once: tokens hash as the same ints, a
    block cached under ``torch.tensor(h)`` is found under ``h``, a repeated id in
    ``free_blocks`` counts as a repeat, and ``get_cached_block`` refuses ``2**64``."""
    import torch  # NOTE: here, not at the top: every Lab 1 grading process would pay its import

    assert impl.hash_block_tokens(None, [torch.tensor(1), 2]) == impl.hash_block_tokens(None, [1, 2]), (
        "torch tokens hashed differently from the same ints — likely cause: the converted "
        "tokens of check_int_list were not the ones hashed")
    bm = impl.BlockManager(2)
    a = bm.allocate()
    assert bm.cache_block(a, torch.tensor(12345))
    bm.free(a)
    assert bm.get_cached_block(12345) == a, (
        "a block cached under torch.tensor(12345) is not found under 12345 — likely cause: the "
        "hash stored as given, not as the int the check returned")
    _refused(bm, lambda: bm.free_blocks([torch.tensor(a), torch.tensor(a)]), DoubleFreeError)
    with pytest.raises(ValueError, match="block_hash"):
        bm.get_cached_block(2 ** 64)


@pytest.mark.points(1)
def test_a_queue_refuses_a_block_that_moved_to_another_queue(impl):
    """A block taken from one queue and put in another is no longer the first queue's:
    ``remove`` on the first raises ``ValueError`` and leaves both queues as they were."""
    q1 = impl.FreeBlockQueue([impl.KVCacheBlock(block_id=0), impl.KVCacheBlock(block_id=1)])
    moved = q1.popleft()
    q2 = impl.FreeBlockQueue([moved])
    raises_naming(lambda: q1.remove(moved), ValueError, None,
                  "q1.remove() of a block q1 handed out and q2 now holds",
                  accepted_hint=": likely cause: popleft or remove does not keep the queue's own "
                                "member set")
    got = (q1.block_ids(), len(q1), q2.block_ids(), len(q2))
    assert got == ([1], 1, [0], 1), (
        f"after the refused remove: (q1, len, q2, len) = {got} — likely cause: popleft or "
        "remove does not keep the queue's own member set")


@pytest.mark.points(1)
@pytest.mark.parametrize("scenario", ["get_computed_blocks", "get_cached_block", "free_blocks",
                                      "free", "increase_ref_count"])
def test_calls_stay_atomic_when_another_call_slips_in(impl, scenario):
    """With a competing call let in just before a method's first lock acquire or just after its
    first release, the outcome is one that some serial order of the two calls gives: no hit on
    a block just handed to someone else, no ref count below 0, no block both free and in use
    (``num_free_blocks`` = the blocks whose ref count is 0)."""
    seen = given(impl, call_with_another_slipped_in)(scenario)
    call, other, refs = seen["call"], seen["other"], seen["ref_counts"]
    serial = {
        # the lookup first: both hits, then no block left; or the allocate first: it evicts
        # block 0's hash and the chain misses from its start
        "get_computed_blocks": [(("ok", [0, 1]), ("raised", "OutOfBlocksError")),
                                (("ok", []), ("ok", 0))],
        "get_cached_block": [(("ok", 0), ("raised", "OutOfBlocksError")),
                             (("ok", None), ("ok", 0))],
        "free_blocks": [(("ok", None), ("raised", "DoubleFreeError"))],
        "free": [(("ok", None), ("raised", "DoubleFreeError"))],
        # the increase first: both succeed (ref 1); or the free first: the increase is refused
        "increase_ref_count": [(("ok", None), ("ok", None)),
                               (("raised", "BlockNotAllocatedError"), ("ok", None))],
    }[scenario]
    got = (tuple(call), tuple(other) if other else None)
    free_ok = seen["num_free_blocks"] == sum(1 for r in refs if r == 0)
    assert got in [(tuple(c), tuple(o)) for c, o in serial] and min(refs) >= 0 and free_ok, (
        f"{scenario} with a competing call let in gave {got}, ref counts {refs}, "
        f"num_free_blocks {seen['num_free_blocks']}; a serial order "
        f"gives one of {serial} (errors raised: {seen['errors'] or 'none'}) — likely cause: the "
        "lock taken more than once in one call, or state read before taking it")
