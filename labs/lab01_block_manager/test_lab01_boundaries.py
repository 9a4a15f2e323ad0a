"""Lab 1, Part E: both sides of every limit — exactly enough is accepted, one more is refused."""

from __future__ import annotations

import pytest

from labs.lab01_block_manager._state import check_invariants, snapshot
from reference.errors import DoubleFreeError, OutOfBlocksError


@pytest.mark.points(1)
@pytest.mark.parametrize("num_blocks, num_taken", [(1, 0), (5, 0), (5, 2), (7, 6)])
def test_allocate_n_can_take_exactly_every_free_block(impl, num_blocks, num_taken):
    """With k blocks free, allocate_n(k + 1) is refused and changes nothing, and allocate_n(k)
    takes all k; then allocate_n(0) still works on the empty pool."""
    bm = impl.BlockManager(num_blocks)
    bm.allocate_n(num_taken)
    free = num_blocks - num_taken
    before = snapshot(bm)
    with pytest.raises(OutOfBlocksError):
        bm.allocate_n(free + 1)
    assert snapshot(bm) == before
    got = bm.allocate_n(free)
    assert len(got) == len(set(got)) == free, (
        f"allocate_n({free}) with exactly {free} blocks free must take them all, got {got} — "
        f"likely cause: an off-by-one in the check (>= where > is meant)"
    )
    assert bm.num_free_blocks == 0 and bm.allocate_n(0) == []
    check_invariants(bm)


@pytest.mark.points(1)
def test_free_blocks_accepts_a_block_listed_exactly_ref_count_times(impl):
    """free_blocks may list a block as many times as it is referenced (all references of a
    beam group at once), and refuses one more, changing nothing."""
    bm = impl.BlockManager(3)
    bm.allocate_n(2)
    bm.increase_ref_count(1)
    bm.increase_ref_count(1)  # block 1 now has 3 references
    before = snapshot(bm)
    with pytest.raises(DoubleFreeError):
        bm.free_blocks([1, 0, 1, 1, 1])
    assert snapshot(bm) == before, "a refused free_blocks must change nothing"
    bm.free_blocks([1, 0, 1, 1])
    assert bm.num_free_blocks == 3, (
        "listing block 1 exactly ref_count (3) times must free it — likely cause: an off-by-one "
        "in the repeat check")
    check_invariants(bm)


@pytest.mark.points(1)
def test_cache_block_refuses_any_other_hash(impl):
    """A cached block re-cached under a *smaller* or a *larger* hash is refused with a
    ValueError naming block_hash, changing nothing; an equal hash (even a recomputed int
    object) returns True."""
    bm = impl.BlockManager(2)
    bm.allocate()
    h = impl.hash_block_tokens(None, [1, 2, 3])
    assert bm.cache_block(0, h)
    before = snapshot(bm)
    for other in (h - 1, h + 1, 0):
        with pytest.raises(ValueError, match="block_hash"):
            bm.cache_block(0, other)
            raise AssertionError(
                f"cache_block(0, {other}) on a block cached under {h} was accepted — likely "
                f"cause: the 'different hash' check compares with < or > instead of !="
            )
        assert snapshot(bm) == before
    # the same value recomputed is another int object: equality, not identity, must decide
    same = impl.hash_block_tokens(None, [1, 2, 3])
    assert bm.cache_block(0, same) is True and bm.cache_block(0, h) is True, (
        "re-caching a block under an equal hash must return True — likely cause: hashes "
        "compared with `is` instead of ==")
    check_invariants(bm)
