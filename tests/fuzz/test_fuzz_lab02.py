"""Bad-input fuzz of Lab 2 (the KV-cache pool): bad ids, counts, lists, tensors, slots, devices
and block managers raise a documented error naming the argument and leave the pool (host
shadow, tables, ref counts, cache bytes) unchanged; integer-like ids act like Python ints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from _fuzz_harness import NON_INTEGERS, accepted, fuzz_settings, huge_ints, integer_like, refused
from labs.lab02_kv_cache_pool._state import check_invariants, poison, snapshot
from reference.block_allocator import TrustedBlockAllocator
from reference.loader import load_impl

pytestmark = pytest.mark.fuzz
LAB = "lab02_kv_cache_pool"
SIZES = dict(num_blocks=10, block_size=4, num_kv_heads=2, head_size=4)


@pytest.fixture(scope="module")
def impl():
    return load_impl(LAB)


def new_pool(impl, **kw):
    args = dict(SIZES, max_num_seqs=4, max_model_len=16, dtype=torch.float32, device="cpu")
    args.update(kw)
    pos = [args.pop(k) for k in ("num_blocks", "block_size", "num_kv_heads", "head_size")]
    return impl.KVCachePool(*pos, **args)


def kv(pool, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (n, pool.num_kv_heads, pool.head_size)
    return (torch.randn(shape, generator=g, dtype=pool.dtype),
            torch.randn(shape, generator=g, dtype=pool.dtype))


@st.composite
def pools(draw, impl):
    """A pool (NaN-poisoned) after a random valid history of adds, appends, forks, frees and
    writes."""
    pool = new_pool(impl)
    poison(pool)
    next_id = 0
    for step in draw(st.lists(st.integers(0, 4), max_size=8)):
        live = pool.seq_ids
        try:
            if step == 0:
                pool.add_sequence(next_id, draw(st.integers(0, 9)))
                next_id += 1
            elif step == 1 and live:
                pool.append_tokens(draw(st.sampled_from(live)), draw(st.integers(0, 5)))
            elif step == 2 and live:
                pool.fork(draw(st.sampled_from(live)), next_id)
                next_id += 1
            elif step == 3 and live:
                pool.free_sequence(draw(st.sampled_from(live)))
            elif step == 4 and live:
                s = draw(st.sampled_from(live))
                n = draw(st.integers(0, pool.get_context_len(s)))
                slots = pool.slot_mapping([s], [n])
                pool.write_kv(slots, *kv(pool, n, step))
        except (ValueError, MemoryError, RuntimeError):
            pass  # a valid-typed call refused for state (full pool, shared tail): fine here
    return pool


def bad_seq_id():
    return NON_INTEGERS


@fuzz_settings()
@given(data=st.data())
def test_bad_ids_and_counts_are_refused_and_change_nothing(impl, data):
    pool = data.draw(pools(impl))
    live = pool.seq_ids
    some = data.draw(st.sampled_from(live)) if live else 0
    unknown = data.draw(st.integers(1000, 2000) | huge_ints())
    bad = data.draw(bad_seq_id())
    bad_count = data.draw(st.one_of(NON_INTEGERS, st.integers(-5, -1)))
    cases = [
        (lambda: pool.add_sequence(bad, 1), ("seq_id",)),
        (lambda: pool.add_sequence(unknown, bad_count), ("num_prompt_tokens",)),
        (lambda: pool.add_sequence(unknown, data.draw(st.integers(17, 10**6) | huge_ints()
                                                     .filter(lambda v: v > 0))),
         ("max_model_len",)),
        (lambda: pool.append_tokens(bad, 1), ("seq_id",)),
        (lambda: pool.append_tokens(unknown, 1), ("seq_id",)),
        (lambda: pool.free_sequence(bad), ("seq_id",)),
        (lambda: pool.free_sequence(unknown), ("seq_id",)),
        (lambda: pool.fork(bad, unknown), ("parent_seq_id",)),
        (lambda: pool.fork(unknown, unknown + 1), ("parent_seq_id",)),
        (lambda: pool.get_row(bad), ("seq_id",)),
        (lambda: pool.get_block_table(unknown), ("seq_id",)),
        (lambda: pool.get_context_len(bad), ("seq_id",)),
        (lambda: pool.gather_kv(bad), ("seq_id",)),
    ]
    if live:
        cases += [
            (lambda: pool.append_tokens(some, bad_count), ("num_new_tokens",)),
            (lambda: pool.append_tokens(some, data.draw(st.integers(17, 10**6))),
             ("max_model_len",)),
            (lambda: pool.fork(some, bad), ("child_seq_id",)),
            (lambda: pool.fork(some, some), ("child_seq_id",)),
            (lambda: pool.add_sequence(some, 1), ("seq_id",)),
        ]
    call, names = data.draw(st.sampled_from(cases))
    refused(call, names=names, snapshot=lambda: snapshot(pool), what="a bad id or count")
    check_invariants(pool)


@fuzz_settings()
@given(data=st.data())
def test_bad_slot_mapping_batches_are_refused(impl, data):
    pool = data.draw(pools(impl))
    live = pool.seq_ids
    bad_list = data.draw(st.sampled_from([None, "0", 3, {0}, {"a": 1}, 2.5,
                                          np.zeros((1, 1), np.int64), object()]))
    cases = [
        (lambda: pool.slot_mapping(bad_list, [1]), ("seq_ids",)),
        (lambda: pool.slot_mapping([data.draw(bad_seq_id())], [1]), ("seq_ids[0]",)),
        (lambda: pool.slot_mapping([5000], [1]), ("seq_id",)),
    ]
    if live:
        s = data.draw(st.sampled_from(live))
        n = pool.get_context_len(s)
        cases += [
            (lambda: pool.slot_mapping([s], bad_list), ("num_new_tokens",)),
            (lambda: pool.slot_mapping([s], [data.draw(NON_INTEGERS)]), ("num_new_tokens[0]",)),
            (lambda: pool.slot_mapping([s], [n + data.draw(st.integers(1, 10**6))]),
             ("num_new_tokens[0]",)),
            (lambda: pool.slot_mapping([s], [-1]), ("num_new_tokens[0]",)),
            (lambda: pool.slot_mapping([s, s], [0, 0]), ("seq_ids",)),
            (lambda: pool.slot_mapping([s], [0, 0]), ("num_new_tokens",)),
            (lambda: pool.slot_mapping([s, [s]], [0, 0]), ("seq_ids[1]",)),
        ]
    call, names = data.draw(st.sampled_from(cases))
    refused(call, names=names, snapshot=lambda: snapshot(pool), what="a bad slot_mapping batch")


def _free_or_shared_slot(pool):
    for b in range(pool.num_blocks):
        if pool.block_manager.get_ref_count(b) != 1:
            return b * pool.block_size
    return None


@fuzz_settings()
@given(data=st.data())
def test_bad_writes_are_refused_before_anything_is_written(impl, data):
    pool = data.draw(pools(impl))
    n = data.draw(st.integers(2, 3))
    def private_blocks():
        return [b for b in range(pool.num_blocks) if pool.block_manager.get_ref_count(b) == 1]

    if not private_blocks():
        try:
            pool.add_sequence(999_999, n)  # a private block for the valid slots to live in
        except (ValueError, MemoryError, RuntimeError):
            pass
    private = private_blocks()
    assume(private)
    slots = torch.tensor([private[0] * pool.block_size + i for i in range(n)], dtype=torch.int64)
    k, v = kv(pool, n)
    num_slots = pool.num_blocks * pool.block_size
    wrong_slot = data.draw(st.sampled_from([-1, -num_slots - 1, num_slots, 2**40]))
    bad_slots = slots.clone()
    bad_slots[data.draw(st.integers(0, n - 1))] = wrong_slot
    cases = [
        (lambda: pool.write_kv(bad_slots, k, v), ("slot",)),
        (lambda: pool.write_kv(slots.float(), k, v), ("slot_mapping",)),
        (lambda: pool.write_kv(slots.tolist(), k, v), ("slot_mapping",)),
        (lambda: pool.write_kv(slots.view(n, 1), k, v), ("slot_mapping",)),
        (lambda: pool.write_kv(slots.to("meta"), k, v), ("slot_mapping",)),
        (lambda: pool.write_kv(slots, k.double(), v), ("key",)),
        (lambda: pool.write_kv(slots, k, v.half()), ("value",)),
        (lambda: pool.write_kv(slots, k.numpy(), v), ("key",)),
        (lambda: pool.write_kv(slots, k, None), ("value",)),
        (lambda: pool.write_kv(slots, k[..., :-1], v), ("key",)),
        (lambda: pool.write_kv(slots, k, v[:-1] if n > 1 else v[:, :1]), ("value",)),
        (lambda: pool.write_kv(slots, k, v.to("meta")), ("value",)),
        (lambda: pool.write_kv(slots, k, pool.value_cache[0, :, :n].transpose(0, 1)), ("value",)),
        (lambda: pool.write_kv(slots, pool.key_cache[1, :, :n].transpose(0, 1), v), ("key",)),
    ]
    dup = slots.clone()
    dup[-1] = dup[0]
    cases.append((lambda: pool.write_kv(dup, k, v), ("slot",)))
    other = _free_or_shared_slot(pool)
    if other is not None:
        foreign = slots.clone()
        foreign[-1] = other
        cases.append((lambda: pool.write_kv(foreign, k, v), ("block",)))
    call, names = data.draw(st.sampled_from(cases))
    refused(call, names=names, snapshot=lambda: snapshot(pool), what="a bad write_kv")


@fuzz_settings(0.5)
@given(data=st.data())
def test_bad_constructor_and_sizing_arguments(impl, data):
    arg = data.draw(st.sampled_from(["num_blocks", "block_size", "num_kv_heads", "head_size",
                                     "max_num_seqs", "max_model_len"]))
    bad = data.draw(st.one_of(NON_INTEGERS, st.integers(-3, 0)))
    huge = data.draw(st.sampled_from([2**40, 2**62, 10**30]))
    cases = [
        (lambda: new_pool(impl, **{arg: bad}), (arg,)),
        (lambda: new_pool(impl, dtype=data.draw(st.sampled_from(
            [np.float16, "float16", torch.int32, None, 3]))), ("dtype",)),
        (lambda: new_pool(impl, device=data.draw(st.sampled_from(
            ["nope", 3.5, None, "cuda:99" if torch.cuda.is_available() else "cuda"]))),
         ("device",)),
        (lambda: new_pool(impl, block_manager=data.draw(st.sampled_from(
            [object(), 5, "bm", TrustedBlockAllocator(3)]))), ("block_manager",)),
        (lambda: new_pool(impl, **{data.draw(st.sampled_from(
            ["num_blocks", "head_size", "max_model_len"])): huge}), ("num_blocks", "max_model_len")),
        (lambda: impl.kv_cache_bytes_per_block(bad, 2, 4, torch.float16), ("block_size",)),
        (lambda: impl.kv_cache_bytes_per_block(4, 2, 4, "fp16"), ("dtype",)),
        (lambda: impl.num_blocks_from_budget(bad, 4, 2, 4, torch.float16), ("budget_bytes",)),
        (lambda: impl.num_blocks_from_budget(10, 4, 2, 4, torch.float16), ("budget_bytes",)),
    ]
    used = TrustedBlockAllocator(10)
    used.allocate()
    cases.append((lambda: new_pool(impl, block_manager=used), ("block_manager",)))
    call, names = data.draw(st.sampled_from(cases))
    refused(call, names=names, what="a bad constructor or sizing argument")


@fuzz_settings(0.5)
@given(data=st.data())
def test_integer_like_ids_act_like_python_ints_and_writes_stay_finite(impl, data):
    a, b = new_pool(impl), new_pool(impl)
    poison(a)
    poison(b)  # torch.empty: make the unwritten rows equal
    seq_id = data.draw(st.integers(0, 100))
    n = data.draw(st.integers(1, 9))
    for pool, sid, cnt in ((a, seq_id, n), (b, data.draw(integer_like(seq_id)),
                                            data.draw(integer_like(n)))):
        ids = accepted(lambda: pool.add_sequence(sid, cnt), what=f"add_sequence({sid!r}, {cnt!r})")
        assert all(type(i) is int for i in ids)
        accepted(lambda: pool.append_tokens(sid, data.draw(integer_like(1))), what="append")
        slots = accepted(lambda: pool.slot_mapping([sid], [cnt + 1]), what="slot_mapping")
        pool.write_kv(slots, *kv(pool, n + 1))
        accepted(lambda: pool.fork(sid, data.draw(integer_like(seq_id + 1))), what="fork")
    assert snapshot(a) == snapshot(b), "integer-like ids did not act like Python ints"
    assert all(type(s) is int for s in b.seq_ids), f"seq_ids not normalised: {b.seq_ids}"
    key, value = b.gather_kv(seq_id)
    assert torch.isfinite(key).all() and torch.isfinite(value).all(), (
        "finite K/V written, NaN/inf gathered")
