"""Lab 2, Part G: copy-on-write at its edges — a no-op append, and writes that reach back past
the private last block into a block the parent still shares."""

from __future__ import annotations

import pytest

from labs.lab02_kv_cache_pool._state import check_invariants, new_pool, snapshot


@pytest.mark.points(1)
def test_appending_zero_tokens_to_a_fork_takes_no_block(impl, device):
    """append_tokens(seq, 0) on either side of a fork whose last block is shared and partial
    changes nothing: no copy, no block taken, ref counts unchanged."""
    pool = new_pool(impl, device)
    pool.add_sequence(0, 6)  # blocks [0, 1]; block 1 holds 2 of 4 tokens
    pool.fork(0, 1)
    before = snapshot(pool)
    for seq_id in (1, 0):
        pool.append_tokens(seq_id, 0)
        assert snapshot(pool) == before, (
            f"append_tokens({seq_id}, 0) changed the pool (free blocks "
            f"{before[5]} -> {pool.num_free_blocks}) — likely cause: copy-on-write triggered "
            f"without a new token to write (check num_new_tokens > 0 first)"
        )
    check_invariants(pool)


@pytest.mark.points(1)
def test_slot_mapping_refuses_every_shared_block_it_would_write(impl, device):
    """After a fork, the child appends past its copied block; asking for slots of tokens that
    reach back into the first (full, still shared) block is refused, one token fewer is not."""
    pool = new_pool(impl, device)
    pool.add_sequence(0, 6)  # blocks [0, 1]
    pool.fork(0, 1)
    pool.append_tokens(1, 3)  # child: [0, copy of 1, new]; 9 tokens; block 0 still shared
    table = pool.get_block_table(1)
    assert table[0] == 0 and pool.block_manager.get_ref_count(0) == 2
    assert len(pool.slot_mapping([1], [5])) == 5  # tokens 4..8: private blocks only
    before = snapshot(pool)
    for n in (6, 9):  # tokens 3..8 / 0..8 include block 0, which the parent holds
        with pytest.raises(ValueError):
            pool.slot_mapping([1], [n])
            raise AssertionError(
                f"slot_mapping([1], [{n}]) reaches token {9 - n}, in block 0 which the parent "
                f"shares, and was accepted — likely cause: only the last block checked for "
                f"sharing; check every block the new tokens fall in"
            )
        assert snapshot(pool) == before
    check_invariants(pool)
