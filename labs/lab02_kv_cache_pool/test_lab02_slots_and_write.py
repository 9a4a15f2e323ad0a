"""Lab 2, Part C: slot mapping, the vectorized K/V write, and gathering pages back."""

from __future__ import annotations

import pytest
import torch

from labs.lab02_kv_cache_pool._state import (
    check_invariants,
    count_torch_calls,
    digest,
    new_pool,
    poison,
    random_kv,
    scramble,
    tensor_bytes,
)
from reference.oracle import gather_kv as oracle_gather_kv

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _first_diff(got: torch.Tensor, want: torch.Tensor) -> str:
    """Names the first token whose bytes differ, for failure messages."""
    for t in range(min(got.shape[0], want.shape[0])):
        if tensor_bytes(got[t]) != tensor_bytes(want[t]):
            return f"first differing token {t}: got {got[t].flatten()[:4].tolist()}…, want " \
                   f"{want[t].flatten()[:4].tolist()}…"
    return f"shapes {tuple(got.shape)} vs {tuple(want.shape)}"


@pytest.mark.points(3)
def test_slot_mapping_is_block_id_times_block_size_plus_offset(impl, device):
    """For a mixed batch (a whole prompt, then one decode token) the slots are
    block_tables[row, pos // block_size] × block_size + pos % block_size, sequences back to
    back, int64 on the pool's device — checked with physical blocks out of logical order."""
    pool = new_pool(impl, device)
    scramble(pool)  # free queue now 7 6 5 4 3 2 1 0 11 10 9 8
    assert pool.add_sequence(5, 6) == [7, 6]
    assert pool.add_sequence(6, 3) == [5]
    pool.append_tokens(6, 1)
    pool.append_tokens(5, 1)
    got = pool.slot_mapping([6, 5], [4, 1])
    assert got.dtype == torch.int64 and got.device == pool.device
    want = [20, 21, 22, 23, 26]  # seq 6: block 5, offsets 0-3; seq 5: token 6 -> block 6, offset 2
    assert got.cpu().tolist() == want, (
        f"slot_mapping([6, 5], [4, 1]) = {got.cpu().tolist()}, want {want}: slot = "
        f"block_tables[row, pos // 4] * 4 + pos % 4 with seq 5 in blocks [7, 6], seq 6 in [5]"
    )
    got = pool.slot_mapping([5], [7]).cpu().tolist()
    assert got == [28, 29, 30, 31, 24, 25, 26], f"all of seq 5 (blocks [7, 6]): {got}"
    assert pool.slot_mapping([5, 6], [0, 0]).numel() == 0


@pytest.mark.points(2)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_written_kv_sits_in_the_workbook_layout_and_gathers_back(impl, device, dtype):
    """K/V written through slot_mapping + write_kv sit at key_cache[block, head, offset, :] —
    the layout Labs 3–5 read, so the float64 oracle reference.oracle.gather_kv recovers them —
    and gather_kv returns them bit-identical as [context_len, num_kv_heads, head_size]."""
    pool = new_pool(impl, device, num_kv_heads=3, dtype=dtype)
    poison(pool)
    scramble(pool)
    lens = {11: 6, 12: 1, 13: 9}
    for s, n in lens.items():
        pool.add_sequence(s, n)
    k, v = random_kv(1, sum(lens.values()), pool)
    pool.write_kv(pool.slot_mapping(list(lens), list(lens.values())), k, v)
    start = 0
    tables = pool.block_tables.cpu().numpy()
    caches = [c.float().cpu().numpy() for c in (pool.key_cache, pool.value_cache)]
    for s, n in lens.items():
        want_k, want_v = k[start : start + n], v[start : start + n]
        start += n
        got_k, got_v = pool.gather_kv(s)
        assert tuple(got_k.shape) == (n, 3, 8) and got_k.dtype == dtype
        assert got_k.device == pool.device and got_v.device == pool.device, (
            f"gather_kv({s}) returned K on {got_k.device}, V on {got_v.device}: both belong on the pool's device")
        assert tensor_bytes(got_k) == tensor_bytes(want_k), f"seq {s} keys: {_first_diff(got_k, want_k)}"
        assert tensor_bytes(got_v) == tensor_bytes(want_v), f"seq {s} values: {_first_diff(got_v, want_v)}"
        ok, ov = oracle_gather_kv(caches[0], caches[1], tables[pool.get_row(s)], n)
        assert (ok == want_k.double().cpu().numpy()).all(), (
            f"seq {s}: the oracle, reading key_cache as [num_blocks, num_kv_heads, block_size, "
            f"head_size], does not find the keys that were written — the write uses another layout"
        )
        assert (ov == want_v.double().cpu().numpy()).all()
    # one element by hand: seq 11's token 5 is logical block 1, offset 1
    block = pool.get_block_table(11)[1]
    assert tensor_bytes(pool.key_cache[block, 2, 1]) == tensor_bytes(k[5, 2])


@pytest.mark.points(3)
def test_same_content_at_different_physical_blocks_gathers_identically(impl, device):
    """Paging invariance: the same logical K/V written into a fresh pool (blocks 0, 1, 2, …) and
    into a pool whose free blocks are scrambled gather bit-identically, while the raw caches
    differ — where K/V go is decided by the block table, not by the token's position."""
    fresh, scrambled = new_pool(impl, device), new_pool(impl, device)
    scramble(scrambled)
    lens = {1: 7, 2: 5, 3: 1}
    k, v = random_kv(2, sum(lens.values()), fresh)
    for pool in (fresh, scrambled):
        poison(pool)
        for s, n in lens.items():
            pool.add_sequence(s, n)
        pool.write_kv(pool.slot_mapping(list(lens), list(lens.values())), k, v)
    assert fresh.get_block_table(1) != scrambled.get_block_table(1)  # the premise
    start = 0
    for s, n in lens.items():
        for pool, label in ((fresh, "fresh"), (scrambled, "scrambled")):
            got_k, got_v = pool.gather_kv(s)
            want_k, want_v = k[start : start + n], v[start : start + n]
            assert tensor_bytes(got_k) == tensor_bytes(want_k), (
                f"{label} pool, seq {s} (blocks {pool.get_block_table(s)}): keys differ from what "
                f"was written — {_first_diff(got_k, want_k)}. Likely cause: the write or the "
                f"gather ignores the block table, or mixes up block and offset"
            )
            assert tensor_bytes(got_v) == tensor_bytes(want_v), f"{label} pool, seq {s}: values"
        start += n
    assert digest(fresh.key_cache) != digest(scrambled.key_cache)
    check_invariants(fresh)
    check_invariants(scrambled)


@pytest.mark.points(1)
def test_write_touches_only_the_mapped_slots(impl, device):
    """After a write, every slot outside the batch's slot mapping is still bit-identical NaN
    poison (no stray writes), and every mapped slot holds its token."""
    pool = new_pool(impl, device, dtype=torch.bfloat16)
    poison(pool)
    scramble(pool)
    pool.add_sequence(0, 5)
    pool.add_sequence(1, 2)
    slots = pool.slot_mapping([0, 1], [5, 2])
    k, v = random_kv(3, 7, pool)
    pool.write_kv(slots, k, v)
    written = set(slots.cpu().tolist())
    flat_k = pool.key_cache.transpose(1, 2).reshape(-1, pool.num_kv_heads, pool.head_size).cpu()
    flat_v = pool.value_cache.transpose(1, 2).reshape(-1, pool.num_kv_heads, pool.head_size).cpu()
    for slot in range(pool.num_blocks * pool.block_size):
        if slot not in written:
            assert bool(flat_k[slot].isnan().all() and flat_v[slot].isnan().all()), (
                f"slot {slot} (block {slot // 4}, offset {slot % 4}) was written, but no token maps "
                f"to it — the write ignores the slot mapping / block table"
            )
    for t, slot in enumerate(slots.cpu().tolist()):
        assert tensor_bytes(flat_k[slot]) == tensor_bytes(k[t].cpu()), f"token {t}, slot {slot}"


@pytest.mark.points(2)
def test_slot_mapping_and_write_are_vectorized(impl, device):
    """slot_mapping and write_kv make the same number of torch calls for 1 new token as for 64:
    no Python loop over tokens touches a tensor."""
    counts = {}
    for num_tokens in (1, 64):
        pool = new_pool(impl, device, num_blocks=20, max_model_len=80)
        pool.add_sequence(0, num_tokens)
        k, v = random_kv(4, num_tokens, pool)
        with count_torch_calls(impl) as mapping:
            slots = pool.slot_mapping([0], [num_tokens])
        with count_torch_calls(impl) as write:
            pool.write_kv(slots, k, v)
        counts[num_tokens] = (mapping.count, write.count)
        got_k, _ = pool.gather_kv(0)
        assert tensor_bytes(got_k) == tensor_bytes(k)
    assert counts[1][0] == counts[64][0], (
        f"slot_mapping made {counts[1][0]} torch calls for 1 token and {counts[64][0]} for 64 — "
        f"compute every slot at once with tensor ops, not a Python loop over tokens"
    )
    assert counts[1][1] == counts[64][1], (
        f"write_kv made {counts[1][1]} torch calls for 1 token and {counts[64][1]} for 64 — "
        f"scatter all tokens with one indexed assignment per cache (reshape_and_cache)"
    )
