"""Lab 2, Part D: fork for parallel sampling and beam search, and copy-on-write."""

from __future__ import annotations

import pytest
import torch

from labs.lab02_kv_cache_pool._state import (
    check_invariants,
    new_pool,
    poison,
    random_kv,
    tensor_bytes,
)
from reference.layout import PAD_BLOCK_ID


def _prompt(pool, seq_id: int, num_tokens: int, seed: int):
    """Adds a sequence and writes its prompt's K/V; returns (k, v)."""
    pool.add_sequence(seq_id, num_tokens)
    k, v = random_kv(seed, num_tokens, pool)
    pool.write_kv(pool.slot_mapping([seq_id], [num_tokens]), k, v)
    return k, v


def _append_and_write(pool, seq_id: int, seed: int):
    """Appends one token to a sequence and writes its K/V; returns (k, v), each [1, H, D]."""
    pool.append_tokens(seq_id, 1)
    k, v = random_kv(seed, 1, pool)
    pool.write_kv(pool.slot_mapping([seq_id], [1]), k, v)
    return k, v


def _refs(pool, blocks):
    return [pool.block_manager.get_ref_count(b) for b in blocks]


@pytest.mark.points(2)
def test_fork_shares_every_block_through_ref_counts(impl, device):
    """fork gives the child its own row holding the parent's block ids and context_len, raises
    each shared block's ref_count by one, and takes no new block."""
    pool = new_pool(impl, device)
    pool.add_sequence(0, 6)
    free_before = pool.num_free_blocks
    pool.fork(0, 1)
    P = PAD_BLOCK_ID
    assert pool.get_row(1) == 1 and pool.get_block_table(1) == [0, 1]
    assert pool.get_context_len(1) == 6
    assert pool.block_tables[1].cpu().tolist() == [0, 1] + [P] * 4
    assert int(pool.context_lens[1]) == 6
    assert _refs(pool, [0, 1]) == [2, 2], f"ref counts after fork: {_refs(pool, [0, 1])}"
    assert pool.num_free_blocks == free_before, "fork must share blocks, not copy them"
    pool.fork(1, 2)
    assert _refs(pool, [0, 1]) == [3, 3]
    check_invariants(pool)


@pytest.mark.points(3)
def test_append_into_a_shared_partial_block_copies_it_first(impl, device):
    """Copy-on-write: the child's first append into the shared, half-full last block copies that
    block (K and V) to a fresh block, swaps it into the child's table and drops one reference;
    the parent's K/V, table and cache blocks stay bit-identical, and the child gathers the
    parent's prefix plus its own token."""
    pool = new_pool(impl, device, dtype=torch.float16)
    poison(pool)
    k, v = _prompt(pool, 0, 6, seed=5)  # blocks [0, 1]; block 1 holds 2 of 4 tokens
    pool.fork(0, 1)
    parent_k, parent_v = (tensor_bytes(t) for t in pool.gather_kv(0))
    parent_blocks = tensor_bytes(pool.key_cache[:2]) + tensor_bytes(pool.value_cache[:2])

    child_k, child_v = _append_and_write(pool, 1, seed=6)
    child_table = pool.get_block_table(1)
    assert child_table[0] == 0 and child_table[1] not in (0, 1), (
        f"after the child's append its table is {child_table}: it still writes into block 1, "
        f"which the parent holds too — copy the shared partial block first (copy-on-write)"
    )
    assert pool.get_block_table(0) == [0, 1]
    assert _refs(pool, [0, 1, child_table[1]]) == [2, 1, 1]
    assert tensor_bytes(pool.key_cache[:2]) + tensor_bytes(pool.value_cache[:2]) == parent_blocks, (
        "the parent's blocks changed when the child appended (copy-on-write must leave them "
        "bit-identical)"
    )
    assert (tensor_bytes(pool.gather_kv(0)[0]), tensor_bytes(pool.gather_kv(0)[1])) == (parent_k, parent_v)

    got_k, got_v = pool.gather_kv(1)
    assert tensor_bytes(got_k) == tensor_bytes(torch.cat([k, child_k])), "child keys: prefix + token"
    assert tensor_bytes(got_v) == tensor_bytes(torch.cat([v, child_v])), (
        "child values differ from the parent's prefix + its token (was only K copied?)"
    )

    # The parent now holds block 1 alone: its own append writes in place, no copy.
    free_before = pool.num_free_blocks
    parent_tok, _ = _append_and_write(pool, 0, seed=7)
    assert pool.get_block_table(0) == [0, 1] and pool.num_free_blocks == free_before
    assert tensor_bytes(pool.gather_kv(1)[0]) == tensor_bytes(got_k), "the child changed"
    assert tensor_bytes(pool.gather_kv(0)[0]) == tensor_bytes(torch.cat([k, parent_tok]))
    check_invariants(pool)


@pytest.mark.points(1)
def test_append_after_a_full_shared_block_needs_no_copy(impl, device):
    """When the shared last block is full, the child's next token starts a fresh block: nothing
    is copied and the full blocks stay shared."""
    pool = new_pool(impl, device)
    pool.add_sequence(0, 8)
    pool.fork(0, 1)
    free_before = pool.num_free_blocks
    pool.append_tokens(1, 1)
    assert pool.get_block_table(1) == [0, 1, 2] and pool.get_block_table(0) == [0, 1]
    assert _refs(pool, [0, 1, 2]) == [2, 2, 1]
    assert pool.num_free_blocks == free_before - 1
    check_invariants(pool)


@pytest.mark.points(2)
def test_freeing_the_parent_keeps_the_childs_blocks(impl, device):
    """After a fork, freeing the parent only drops references: the child's blocks stay
    allocated (ref_count 1) and are not handed out again, so its K/V gather unchanged; freeing
    the child then returns every block."""
    pool = new_pool(impl, device)
    poison(pool)
    k, v = _prompt(pool, 0, 6, seed=8)
    pool.fork(0, 1)
    pool.free_sequence(0)
    assert _refs(pool, [0, 1]) == [1, 1], (
        f"after freeing the parent the child's blocks have ref counts {_refs(pool, [0, 1])}; "
        f"fork must add a reference per shared block, or the parent's free releases them"
    )
    assert pool.num_free_blocks == pool.num_blocks - 2
    _prompt(pool, 2, 8, seed=9)  # a newcomer must get other blocks
    assert set(pool.get_block_table(2)).isdisjoint({0, 1})
    got_k, got_v = pool.gather_kv(1)
    assert tensor_bytes(got_k) == tensor_bytes(k) and tensor_bytes(got_v) == tensor_bytes(v)
    pool.free_sequence(1)
    assert pool.num_free_blocks == pool.num_blocks - 2  # only seq 2's blocks remain
    check_invariants(pool)
