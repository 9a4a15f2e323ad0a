"""Lab 2, Part E: slot arithmetic for every block size and every pool size.

The classic tests use block size 4 or 16 and a few dozen blocks, where a bitmask works as a
modulo and int32 never overflows. These tests take block sizes that are not powers of two,
block ids whose slots pass 2**31, and batches with no new token at all.
"""

from __future__ import annotations

import pytest
import torch

from labs.lab02_kv_cache_pool._state import check_invariants, new_pool, poison, random_kv, scramble
from reference.oracle import gather_kv as oracle_gather_kv


def _expected_slots(pool, seq_ids, counts) -> list[int]:
    """Slots computed from the public accessors, one token at a time (the slow, obvious way)."""
    slots = []
    for seq_id, n in zip(seq_ids, counts):
        table, length = pool.get_block_table(seq_id), pool.get_context_len(seq_id)
        for pos in range(length - n, length):
            slots.append(table[pos // pool.block_size] * pool.block_size + pos % pool.block_size)
    return slots


@pytest.mark.points(2)
@pytest.mark.parametrize("block_size", [3, 5, 6])
def test_slots_are_exact_for_block_sizes_that_are_not_powers_of_two(impl, device, block_size):
    """With block size 3, 5 or 6 (physical blocks out of order), slot_mapping returns
    ``block_id × block_size + pos % block_size`` for a mixed batch, and write_kv puts each
    token's K/V exactly where the float64 oracle's gather (and gather_kv) finds it."""
    pool = new_pool(impl, device, num_blocks=15, block_size=block_size, max_model_len=40)
    scramble(pool)
    poison(pool)
    pool.add_sequence(10, 2 * block_size + 1)
    pool.add_sequence(11, block_size - 1)
    seq_ids, counts = [10, 11], [2 * block_size + 1, block_size - 1]
    k, v = random_kv(block_size, sum(counts), pool)
    slots = pool.slot_mapping(seq_ids, counts)
    want = _expected_slots(pool, seq_ids, counts)
    assert slots.cpu().tolist() == want, (
        f"block_size={block_size}: slots {slots.cpu().tolist()}, expected {want} — likely cause: "
        f"position & (block_size - 1) or a shift used as modulo/division (only right for powers "
        f"of two)"
    )
    pool.write_kv(slots, k, v)
    # one decode step each, then check every token of both sequences
    pool.append_tokens(10), pool.append_tokens(11)
    k2, v2 = random_kv(block_size + 100, 2, pool)
    pool.write_kv(pool.slot_mapping(seq_ids, [1, 1]), k2, v2)
    starts = {10: (0, counts[0]), 11: (counts[0], counts[0] + counts[1])}
    for j, seq_id in enumerate(seq_ids):
        lo, hi = starts[seq_id]
        want_k = torch.cat([k[lo:hi], k2[j : j + 1]]).double().cpu().numpy()
        want_v = torch.cat([v[lo:hi], v2[j : j + 1]]).double().cpu().numpy()
        row = pool.block_tables[pool.get_row(seq_id)].cpu().numpy()
        got_k, got_v = oracle_gather_kv(pool.key_cache.double().cpu().numpy(),
                                        pool.value_cache.double().cpu().numpy(), row,
                                        pool.get_context_len(seq_id))
        assert (got_k == want_k).all() and (got_v == want_v).all(), (
            f"block_size={block_size}: seq {seq_id}'s K/V are not where its block table says — "
            f"likely cause: reshape_and_cache splitting slots with a bitmask or shift"
        )
        gk, gv = pool.gather_kv(seq_id)
        assert (gk.double().cpu().numpy() == want_k).all(), f"gather_kv({seq_id}) keys differ"
        assert (gv.double().cpu().numpy() == want_v).all(), f"gather_kv({seq_id}) values differ"
    check_invariants(pool)


@pytest.mark.points(1)
@pytest.mark.parametrize("block_size", [16, 24])
def test_slot_arithmetic_does_not_overflow_int32(impl, block_size):
    """compute_slot_mapping returns exact int64 slots when ``block_id × block_size`` passes
    2**31 (a pool of hundreds of millions of tokens: the block table is int32, slots are not)."""
    big = [2**27, 2**28 + 3, 2**31 - 2]  # valid int32 block ids
    tables = torch.tensor([[5] + big, [-1] * 4], dtype=torch.int32)  # [max_num_seqs, 4]
    positions = torch.tensor([1, block_size + 2, 2 * block_size, 3 * block_size + block_size - 1])
    rows = torch.zeros(4, dtype=torch.int64)
    got = impl.compute_slot_mapping(tables, rows, positions, block_size)
    want = [5 * block_size + 1] + [b * block_size + int(p) % block_size
                                   for b, p in zip(big, positions[1:].tolist())]
    assert got.dtype == torch.int64, f"slots must be int64, got {got.dtype}"
    assert got.tolist() == want, (
        f"slots {got.tolist()}, expected {want} — likely cause: block_id × block_size computed "
        f"in the table's int32, which wraps past 2**31 (widen to int64 before multiplying)"
    )


@pytest.mark.points(1)
def test_empty_slot_mapping_is_int64(impl, device):
    """A batch with no new token (no sequences, or zero new tokens each) gives an empty int64
    slot mapping on the pool's device, which write_kv accepts as a no-op."""
    pool = new_pool(impl, device)
    pool.add_sequence(1, 5)
    for seq_ids, counts in (([], []), ([1], [0])):
        slots = pool.slot_mapping(seq_ids, counts)
        assert slots.dtype == torch.int64 and tuple(slots.shape) == (0,), (
            f"slot_mapping({seq_ids}, {counts}) gave {slots.dtype} of shape {tuple(slots.shape)}, "
            f"expected an empty int64 tensor — likely cause: torch.empty(0) without a dtype"
        )
        assert slots.device == pool.device
        empty = torch.empty(0, pool.num_kv_heads, pool.head_size, dtype=pool.dtype,
                            device=pool.device)
        pool.write_kv(slots, empty, empty)
    check_invariants(pool)
