"""Lab 1: bad input is refused with a typed error naming the argument, before anything changes.

The hash must never turn a non-integer token into an integer one (that is how two different
prompts end up sharing cached K/V), and a list argument is checked whole before its first item
touches the manager or the queue.
"""

from __future__ import annotations

import numpy as np
import pytest

from labs.lab01_block_manager._state import check_invariants, snapshot
from reference.expect import raises_naming


def _links(blocks) -> list:
    return [(b.prev_free is None, b.next_free is None) for b in blocks]


@pytest.mark.points(2)
def test_block_hash_refuses_non_integer_tokens_and_parents(impl):
    """hash_block_tokens and hash_prompt_blocks take integer tokens and an integer parent only:
    floats, bools, strings and NumPy floats raise TypeError naming the argument (``token_ids``
    or ``parent_block_hash``), so ``[1.9, 2]``, ``[True, 2]`` and ``"12"`` can never share
    ``[1, 2]``'s cached blocks; NumPy integers hash exactly like Python ints."""
    h = impl.hash_block_tokens(None, [1, 2])
    assert impl.hash_block_tokens(None, np.array([1, 2], dtype=np.int32)) == h, (
        "NumPy integer tokens must hash like the same Python ints")
    assert impl.hash_block_tokens(np.uint64(h), [3, 4]) == impl.hash_block_tokens(h, [3, 4])
    bad_tokens = {"[1.9, 2]": [1.9, 2], "[True, 2]": [True, 2], "'12'": "12",
                  "[np.float64(1), 2]": [np.float64(1.0), 2], "None": None}
    for what, tokens in bad_tokens.items():
        try:
            impl.hash_block_tokens(None, tokens)
        except TypeError as exc:
            assert "token_ids" in str(exc), f"the TypeError must name token_ids, got: {exc}"
        else:
            pytest.fail(f"hash_block_tokens(None, {what}) was accepted: a non-integer token must "
                        f"raise TypeError, or two different prompts share cached K/V (check the "
                        f"tokens with check_int_list before hashing)")
    for parent in ("5", 1.5, True, [1]):
        with pytest.raises(TypeError, match="parent_block_hash"):
            impl.hash_block_tokens(parent, [1, 2])
    for parent in (-1, 1 << 64):
        with pytest.raises(ValueError, match="parent_block_hash"):
            impl.hash_block_tokens(parent, [1, 2])
    # the partial last block gets no hash, but its tokens are still checked
    with pytest.raises(TypeError, match="token_ids"):
        impl.hash_prompt_blocks([1, 2, 3, 4, 5.5], 4)


@pytest.mark.points(1)
def test_free_queue_refuses_bad_lists_and_foreign_blocks_without_relinking(impl):
    """A FreeBlockQueue built from a list with a duplicate or a non-block raises and links none
    of the blocks; removing a block that sits in *another* queue raises ValueError and leaves
    both queues as they were."""
    blocks = [impl.KVCacheBlock(block_id=i) for i in range(4)]
    q1 = impl.FreeBlockQueue(blocks[:2])
    q2 = impl.FreeBlockQueue(blocks[2:])
    foreign = ("a block's links say that it is queued, not in which queue — keep track of this "
               "queue's own blocks")
    raises_naming(lambda: q1.remove(blocks[2]), ValueError, None,
                  "remove() of a block that sits in another queue", accepted_hint=f": {foreign}")
    assert q1.block_ids() == [0, 1] and q2.block_ids() == [2, 3] and len(q1) == len(q2) == 2, (
        f"removing another queue's block relinked its neighbours: {foreign}")
    fresh = [impl.KVCacheBlock(block_id=i) for i in range(3)]
    for bad in ([fresh[0], fresh[1], fresh[0]], [fresh[0], "block 1"]):
        with pytest.raises((TypeError, ValueError)):
            impl.FreeBlockQueue(bad)
        assert _links(fresh) == [(True, True)] * 3, (
            "a refused FreeBlockQueue(...) left blocks linked: check the whole list first")


@pytest.mark.points(1)
def test_list_arguments_are_checked_whole_before_anything_changes(impl):
    """free_blocks and get_computed_blocks refuse a non-list (None, a string) with TypeError
    naming ``block_ids`` / ``block_hashes``, and a bad entry anywhere in the list — even after
    cache hits — with an error naming that entry, before taking or dropping any reference."""
    bm = impl.BlockManager(6)
    ids = bm.allocate_n(2)
    hashes = impl.hash_prompt_blocks(list(range(8)), 4)
    assert bm.cache_block(ids[0], hashes[0]) and bm.cache_block(ids[1], hashes[1])
    before = snapshot(bm)
    for call, error, name in [
        (lambda: bm.free_blocks(None), TypeError, "block_ids"),
        (lambda: bm.free_blocks([ids[0], 1.0]), TypeError, r"block_ids\[1\]"),
        (lambda: bm.get_computed_blocks(None), TypeError, "block_hashes"),
        (lambda: bm.get_computed_blocks("12"), TypeError, "block_hashes"),
        (lambda: bm.get_computed_blocks([hashes[0], hashes[1], 2.5]), TypeError,
         r"block_hashes\[2\]"),
        (lambda: bm.get_computed_blocks([hashes[0], -7]), ValueError, r"block_hashes\[1\]"),
    ]:
        with pytest.raises(error, match=name):
            call()
        assert snapshot(bm) == before, (
            "a refused call changed ref counts or the free queue: validate the whole list, then "
            "take references")
    check_invariants(bm)


@pytest.mark.points(1)
def test_half_linked_block_counts_as_queued(impl):
    """A block with *either* link set counts as queued: append() refuses it with ValueError and
    leaves the queue as it was, and FreeBlockQueue([fresh, half_linked]) refuses the list before
    linking ``fresh``."""
    other = impl.KVCacheBlock(block_id=9)
    for links in ({"prev_free": other}, {"next_free": other}):
        q = impl.FreeBlockQueue([impl.KVCacheBlock(block_id=0)])
        half = impl.KVCacheBlock(block_id=1, **links)
        why = (": test each link on its own (`or`, not `and`) — a block with one link is still "
               "in some queue")
        raises_naming(lambda: q.append(half), ValueError, None,
                      f"append() of a block with only {next(iter(links))} set", accepted_hint=why)
        assert q.block_ids() == [0] and len(q) == 1, (
            f"append() of a block with only {next(iter(links))} set changed the queue{why}")
        fresh = impl.KVCacheBlock(block_id=2)
        raises_naming(lambda: impl.FreeBlockQueue([fresh, half]), ValueError, None,
                      f"FreeBlockQueue([fresh, block with only {next(iter(links))} set])",
                      accepted_hint=why)
        assert _links([fresh]) == [(True, True)], (
            f"FreeBlockQueue([fresh, block with only {next(iter(links))} set]) linked `fresh` "
            "before refusing: the up-front check must refuse every block append() would refuse")
