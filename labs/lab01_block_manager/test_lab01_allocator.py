"""Lab 1, Part A: allocation, reference counting and bad input (the seed's manager, done right)."""

from __future__ import annotations

import pytest

from labs.lab01_block_manager._state import check_invariants, snapshot
from reference.errors import BlockNotAllocatedError, DoubleFreeError, OutOfBlocksError


@pytest.mark.points(1)
def test_fresh_manager_hands_out_ids_in_order(impl):
    """A fresh manager hands out 0, 1, 2, ... and counts its free blocks down to 0."""
    bm = impl.BlockManager(4)
    assert bm.num_free_blocks == 4
    got = [bm.allocate() for _ in range(4)]
    assert got == [0, 1, 2, 3], f"a fresh manager must hand out ids in order, got {got}"
    assert bm.num_free_blocks == 0
    assert [bm.get_ref_count(i) for i in range(4)] == [1, 1, 1, 1]
    check_invariants(bm)


@pytest.mark.points(1)
@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError),
                                        ("4", TypeError), (True, TypeError), (None, TypeError)])
def test_constructor_rejects_bad_num_blocks(impl, bad, error):
    """num_blocks must be an int > 0; the error is typed and names num_blocks."""
    with pytest.raises(error, match="num_blocks"):
        impl.BlockManager(bad)


@pytest.mark.points(1)
def test_allocate_when_full_raises_out_of_blocks(impl):
    """Allocating from an empty pool raises OutOfBlocksError (a MemoryError) and changes nothing."""
    bm = impl.BlockManager(2)
    bm.allocate(), bm.allocate()
    before = snapshot(bm)
    with pytest.raises(OutOfBlocksError) as info:
        bm.allocate()
    assert isinstance(info.value, MemoryError)
    assert snapshot(bm) == before


@pytest.mark.points(2)
def test_allocate_n_is_all_or_nothing(impl):
    """allocate_n takes n distinct blocks, or raises OutOfBlocksError having taken none — nor
    evicted the hash of a free cached block it would have taken."""
    bm = impl.BlockManager(4)
    first = bm.allocate_n(4)
    assert first == [0, 1, 2, 3]
    assert bm.cache_block(3, impl.hash_block_tokens(None, [3]))
    bm.free(3)  # the one free block, still cached
    assert bm.allocate_n(0) == []
    before = snapshot(bm)
    with pytest.raises(OutOfBlocksError, match="n=2"):
        bm.allocate_n(2)
    assert snapshot(bm) == before, (
        "a failed allocate_n must leave the manager unchanged — blocks taken before the failure "
        "leaked or a cached block lost its hash (likely cause: allocating one by one and "
        "raising, or rolling back, half-way)"
    )
    assert bm.allocate() == 3, "the one free block must still be free after the failed call"


@pytest.mark.points(1)
@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1.5, TypeError), ("2", TypeError)])
def test_allocate_n_rejects_bad_n(impl, bad, error):
    """allocate_n(n) needs an int n >= 0 and names n in its error; state is unchanged."""
    bm = impl.BlockManager(4)
    before = snapshot(bm)
    with pytest.raises(error, match=r"\bn\b"):
        bm.allocate_n(bad)
    assert snapshot(bm) == before


@pytest.mark.points(1)
def test_free_returns_block_to_the_tail_of_the_free_queue(impl):
    """Freed blocks are reused least-recently-freed first, after the never-used ones."""
    bm = impl.BlockManager(4)
    a, b, c = bm.allocate(), bm.allocate(), bm.allocate()
    bm.free(b)
    bm.free(a)
    assert bm.num_free_blocks == 3
    assert bm.free_block_queue.block_ids() == [3, b, a]
    assert [bm.allocate() for _ in range(3)] == [3, b, a]
    check_invariants(bm)


@pytest.mark.points(2)
def test_shared_block_stays_used_until_last_reference_is_freed(impl):
    """With ref_count 2 the first free keeps the block in use; the second frees it."""
    bm = impl.BlockManager(3)
    block = bm.allocate()
    bm.increase_ref_count(block)
    assert bm.get_ref_count(block) == 2
    bm.free(block)
    assert bm.get_ref_count(block) == 1
    assert bm.num_free_blocks == 2, (
        "a block shared by two sequences went back to the free list after one free — likely "
        "cause: free() ignores ref_count"
    )
    assert block not in [bm.allocate(), bm.allocate()], "a shared block was handed out again"
    bm.free(block)
    assert bm.get_ref_count(block) == 0
    assert bm.num_free_blocks == 1
    check_invariants(bm)


@pytest.mark.points(2)
def test_double_free_raises_and_leaves_state_unchanged(impl):
    """Freeing a free block raises DoubleFreeError; the block is not queued twice."""
    bm = impl.BlockManager(3)
    block = bm.allocate()
    bm.free(block)
    before = snapshot(bm)
    with pytest.raises(DoubleFreeError, match=f"block_id={block}"):
        bm.free(block)
    assert snapshot(bm) == before, "a refused double free must not change the free queue"
    with pytest.raises(DoubleFreeError):
        bm.free(2)  # never allocated at all


@pytest.mark.points(1)
def test_increase_ref_count_of_free_block_raises(impl):
    """Sharing a free block is refused with BlockNotAllocatedError; state is unchanged."""
    bm = impl.BlockManager(3)
    block = bm.allocate()
    bm.free(block)
    before = snapshot(bm)
    with pytest.raises(BlockNotAllocatedError, match=f"block_id={block}"):
        bm.increase_ref_count(block)
    assert snapshot(bm) == before
    assert bm.get_ref_count(block) == 0


@pytest.mark.points(2)
@pytest.mark.parametrize("method", ["free", "increase_ref_count", "get_ref_count"])
@pytest.mark.parametrize("bad, error", [(-1, IndexError), (4, IndexError), (99, IndexError),
                                        (1.0, TypeError), ("1", TypeError), (True, TypeError),
                                        (None, TypeError)])
def test_bad_block_ids_raise_typed_errors(impl, method, bad, error):
    """Invalid block ids raise TypeError/IndexError naming block_id, and change nothing."""
    bm = impl.BlockManager(4)
    bm.allocate_n(2)
    before = snapshot(bm)
    with pytest.raises(error, match="block_id"):
        getattr(bm, method)(bad)
    assert snapshot(bm) == before


@pytest.mark.points(2)
def test_allocate_never_returns_a_block_in_use(impl):
    """Across allocate/free churn, no id is ever handed out while it is still in use."""
    bm = impl.BlockManager(8)
    live: set[int] = set()
    for step in range(200):
        if len(live) < 8 and (step % 3 != 2 or not live):
            block = bm.allocate()
            assert block not in live, f"step {step}: allocate() returned block {block}, in use"
            live.add(block)
        else:
            block = sorted(live)[step % len(live)]
            bm.free(block)
            live.remove(block)
        assert bm.num_free_blocks == 8 - len(live)
    check_invariants(bm)


@pytest.mark.points(2)
def test_free_blocks_is_all_or_nothing_and_frees_tail_first(impl):
    """free_blocks validates every id first (no partial frees; a block listed more times than
    its ref count is a DoubleFreeError naming ``block_id=``), then frees the list's tail first."""
    bm = impl.BlockManager(6)
    seq = bm.allocate_n(3)  # [0, 1, 2]
    bm.increase_ref_count(seq[0])
    before = snapshot(bm)
    with pytest.raises(DoubleFreeError, match=f"block_id={seq[1]}"):
        bm.free_blocks([seq[1], seq[1]])  # ref_count 1, listed twice
    with pytest.raises(IndexError, match="block_id"):
        bm.free_blocks([seq[0], 17])
    assert snapshot(bm) == before, "a refused free_blocks freed some blocks anyway"
    bm.free_blocks(seq)
    assert bm.get_ref_count(seq[0]) == 1
    assert bm.free_block_queue.block_ids() == [3, 4, 5, 2, 1], (
        "free_blocks must free the tail block first, so it is evicted before the prefix"
    )
    check_invariants(bm)
    # "tail first" is the *list's* last entry, not the highest id: a sequence's blocks need not
    # be in id order
    bm = impl.BlockManager(3)
    bm.allocate_n(3)
    bm.free_blocks([2, 0, 1])
    assert bm.free_block_queue.block_ids() == [1, 0, 2], (
        f"free_blocks([2, 0, 1]) left the free queue {bm.free_block_queue.block_ids()}, not "
        "[1, 0, 2]: free the list's last entry first (reversed(block_ids)), whatever the ids")
