"""Bad-input fuzz of Lab 1 (the block manager, the free queue, the block hashes): every public
call with bad arguments raises a documented error naming the argument and changes nothing;
NumPy/torch integer ids behave exactly like Python ints."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _fuzz_harness import NON_INTEGERS, accepted, fuzz_settings, huge_ints, integer_like, refused
from labs.lab01_block_manager._state import check_invariants, snapshot
from reference.loader import load_impl

pytestmark = pytest.mark.fuzz
LAB = "lab01_block_manager"


@pytest.fixture(scope="module")
def impl():
    return load_impl(LAB)


@st.composite
def managers(draw, impl):
    """A BlockManager after a random valid history (allocations, frees, caching, hits)."""
    bm = impl.BlockManager(draw(st.integers(1, 8)))
    held: list[int] = []
    for step in draw(st.lists(st.integers(0, 4), max_size=12)):
        if step == 0 and bm.num_free_blocks:
            held.append(bm.allocate())
        elif step == 1 and held:
            bm.free(held.pop(draw(st.integers(0, len(held) - 1))))
        elif step == 2 and held:
            block_id = held[draw(st.integers(0, len(held) - 1))]
            bm.cache_block(block_id, impl.hash_block_tokens(None, [block_id, 7]))
        elif step == 3:
            hit = bm.get_cached_block(impl.hash_block_tokens(None, [draw(st.integers(0, 7)), 7]))
            if hit is not None:
                held.append(hit)
        elif step == 4 and held:
            block_id = held[draw(st.integers(0, len(held) - 1))]
            bm.increase_ref_count(block_id)
            held.append(block_id)
    return bm


def bad_block_ids(bm):
    return st.one_of(NON_INTEGERS, st.integers(-3, -1), st.integers(bm.num_blocks, bm.num_blocks + 3),
                     huge_ints())


BLOCK_ID_CALLS = {
    "get_ref_count": lambda bm, b: bm.get_ref_count(b),
    "free": lambda bm, b: bm.free(b),
    "increase_ref_count": lambda bm, b: bm.increase_ref_count(b),
    "cache_block": lambda bm, b: bm.cache_block(b, 12345),
    "free_blocks (one bad id)": lambda bm, b: bm.free_blocks([b]),
}


@fuzz_settings()
@given(data=st.data())
def test_bad_block_ids_are_refused_and_change_nothing(impl, data):
    bm = data.draw(managers(impl))
    name = data.draw(st.sampled_from(sorted(BLOCK_ID_CALLS)))
    bad = data.draw(bad_block_ids(bm))
    refused(lambda: BLOCK_ID_CALLS[name](bm, bad), names=("block_id",),
            snapshot=lambda: snapshot(bm), what=f"{name}({bad!r})")
    check_invariants(bm)


@fuzz_settings()
@given(data=st.data())
def test_bad_counts_hashes_and_lists_are_refused(impl, data):
    bm = data.draw(managers(impl))
    good_hash = impl.hash_block_tokens(None, [1, 2])
    bad_hash = data.draw(st.one_of(NON_INTEGERS, st.integers(-5, -1), st.just(2**64), huge_ints()
                                   .filter(lambda h: not 0 <= h < 2**64)))
    bad_list = data.draw(st.sampled_from([None, "12", b"12", 7, 1.5, {1, 2}, {"a": 1},
                                          np.zeros((2, 2), np.int64), object()]))
    pos = data.draw(st.integers(0, 2))
    cases = [
        (lambda: bm.allocate_n(data.draw(st.one_of(NON_INTEGERS, st.integers(-9, -1)))),
         ("n must", "n=")),
        (lambda: bm.allocate_n(bm.num_free_blocks + data.draw(st.integers(1, 10**9))), ("n=",)),
        (lambda: bm.cache_block(0, bad_hash), ("block_hash",)),
        (lambda: bm.get_cached_block(bad_hash), ("block_hash",)),
        (lambda: bm.get_computed_blocks([good_hash] * pos + [bad_hash]),
         (f"block_hashes[{pos}]",)),
        (lambda: bm.get_computed_blocks(bad_list), ("block_hashes",)),
        (lambda: bm.free_blocks(bad_list), ("block_ids",)),
        (lambda: impl.BlockManager(data.draw(st.one_of(NON_INTEGERS, st.integers(-5, 0)))),
         ("num_blocks",)),
    ]
    call, names = data.draw(st.sampled_from(cases))
    refused(call, names=names, snapshot=lambda: snapshot(bm), what="a bad count/hash/list")
    check_invariants(bm)


@fuzz_settings()
@given(data=st.data())
def test_id_validity_and_call_order_are_checked(impl, data):
    """Valid types, invalid state: free of a free block, sharing a free block, too many frees
    in one list, allocation past the pool, a hash on a free block or a second hash."""
    bm = data.draw(managers(impl))
    free_ids = bm.free_block_queue.block_ids()
    used_ids = [b for b in range(bm.num_blocks) if bm.get_ref_count(b) > 0]
    cases = []
    if free_ids:
        f = data.draw(st.sampled_from(free_ids))
        cases += [(lambda: bm.free(f), ("block_id",)),
                  (lambda: bm.increase_ref_count(f), ("block_id",)),
                  (lambda: bm.cache_block(f, 99), ("block_id",))]
    if used_ids:
        u = data.draw(st.sampled_from(used_ids))
        cases.append((lambda: bm.free_blocks([u] * (bm.get_ref_count(u) + 1)), (f"block_id={u}",)))
        cached = bm.blocks[u].block_hash
        if cached is not None:
            cases.append((lambda: bm.cache_block(u, cached ^ 1), ("block_hash",)))
    if not free_ids:
        cases.append((bm.allocate, ()))
    cases.append((lambda: bm.allocate_n(len(free_ids) + 1), ("n=",)))
    call, names = data.draw(st.sampled_from(cases))
    refused(call, names=names, snapshot=lambda: snapshot(bm), what="a call in the wrong state")
    check_invariants(bm)


@fuzz_settings(0.5)
@given(data=st.data())
def test_integer_like_ids_behave_like_python_ints(impl, data):
    """NumPy/torch integer ids are accepted, normalised once, and give Python-int results."""
    n = data.draw(st.integers(3, 6))
    a, b = impl.BlockManager(n), impl.BlockManager(n)
    for bm in (a, b):
        bm.allocate_n(2)
    block_id = data.draw(st.integers(0, 1))
    like = data.draw(integer_like(block_id))
    h = impl.hash_block_tokens(None, [block_id])
    for name, call in [
        ("increase_ref_count", lambda bm, x: bm.increase_ref_count(x)),
        ("get_ref_count", lambda bm, x: bm.get_ref_count(x)),
        ("cache_block", lambda bm, x: bm.cache_block(x, h)),
        ("free", lambda bm, x: bm.free(x)),
    ]:
        want = call(a, block_id)
        got = accepted(lambda: call(b, like), what=f"{name}({like!r})")
        assert got == want and type(got) is type(want), f"{name}({like!r}) gave {got!r}"
        assert snapshot(a) == snapshot(b), f"{name}({like!r}) did not act like {name}({block_id})"
    ids = accepted(lambda: b.allocate_n(data.draw(integer_like(1))), what="allocate_n(like 1)")
    assert all(type(i) is int for i in ids), "allocate_n must return Python ints"
    tokens = data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=6))
    assert impl.hash_block_tokens(None, np.array(tokens)) == impl.hash_block_tokens(None, tokens)


@fuzz_settings()
@given(data=st.data())
def test_hashes_refuse_non_integer_tokens_and_parents(impl, data):
    tokens = data.draw(st.lists(st.integers(0, 1000), min_size=1, max_size=6))
    i = data.draw(st.integers(0, len(tokens) - 1))
    bad_tokens = list(tokens)
    bad_tokens[i] = data.draw(NON_INTEGERS)
    block_size = data.draw(st.integers(1, 4))
    cases = [
        (lambda: impl.hash_block_tokens(None, bad_tokens), (f"token_ids[{i}]",)),
        (lambda: impl.hash_block_tokens(data.draw(st.one_of(
            NON_INTEGERS.filter(lambda v: v is not None), st.integers(-9, -1),
            st.just(2**64))), tokens), ("parent_block_hash",)),
        (lambda: impl.hash_block_tokens(None, data.draw(st.sampled_from(
            ["12", None, 5, {1, 2}, np.zeros((2, 2), np.int64)]))), ("token_ids",)),
        (lambda: impl.hash_prompt_blocks(bad_tokens, block_size), (f"token_ids[{i}]",)),
        (lambda: impl.hash_prompt_blocks(tokens, data.draw(st.one_of(
            NON_INTEGERS, st.integers(-3, 0)))), ("block_size",)),
    ]
    call, names = data.draw(st.sampled_from(cases))
    refused(call, names=names, what="a bad hash input")


@fuzz_settings(0.5)
@given(data=st.data())
def test_free_queue_refuses_misuse_without_relinking(impl, data):
    blocks = [impl.KVCacheBlock(block_id=i) for i in range(6)]
    q1, q2 = impl.FreeBlockQueue(blocks[:3]), impl.FreeBlockQueue(blocks[3:5])
    loose = blocks[5]

    def state():
        return (q1.block_ids(), len(q1), q2.block_ids(), len(q2),
                [(b.prev_free is None, b.next_free is None) for b in blocks])

    cases = [
        (lambda: q1.remove(data.draw(st.sampled_from(blocks[3:6]))), ("block",)),
        (lambda: q1.append(data.draw(st.sampled_from(blocks[:5]))), ("block",)),
        (lambda: q1.remove(data.draw(st.sampled_from([None, 3, "b", object()]))), ("block",)),
        (lambda: impl.FreeBlockQueue([loose, loose]), ("blocks",)),
        (lambda: impl.FreeBlockQueue([loose, data.draw(st.sampled_from(blocks[:5]))]),
         ("blocks",)),
        (lambda: impl.FreeBlockQueue([loose, data.draw(st.sampled_from([None, 1, "x"]))]),
         ("blocks",)),
        (lambda: impl.FreeBlockQueue(data.draw(st.sampled_from([None, 3, "ab"]))), ("blocks",)),
    ]
    call, names = data.draw(st.sampled_from(cases))
    refused(call, names=names, snapshot=state, what="free-queue misuse")
