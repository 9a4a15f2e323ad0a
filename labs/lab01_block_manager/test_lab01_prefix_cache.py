"""Lab 1, Part B: prefix caching — chained block hashes, revival of freed blocks, LRU eviction."""

from __future__ import annotations

import pytest

from labs.lab01_block_manager._state import check_invariants, snapshot
from reference.errors import BlockNotAllocatedError


@pytest.mark.points(2)
def test_block_hash_is_chained_to_its_parent(impl):
    """Equal tokens hash equal only under equal parents; the hash is a 64-bit int >= 0."""
    tokens = list(range(16))
    h1 = impl.hash_block_tokens(None, tokens)
    assert h1 == impl.hash_block_tokens(None, list(tokens)), "the hash must be deterministic"
    assert isinstance(h1, int) and 0 <= h1 < 2**64
    assert impl.hash_block_tokens(h1, tokens) != h1, (
        "the same tokens after a different prefix must hash differently (chain the parent in)"
    )
    assert impl.hash_block_tokens(None, tokens[::-1]) != h1, "token order must matter"
    assert impl.hash_block_tokens(None, [1, 23]) != impl.hash_block_tokens(None, [12, 3])


@pytest.mark.points(1)
def test_prompt_hashes_cover_only_full_blocks(impl):
    """hash_prompt_blocks gives one chained hash per full block and none for a partial tail."""
    prompt = list(range(100, 137))  # 2 full blocks of 16 + 5 tokens
    hashes = impl.hash_prompt_blocks(prompt, 16)
    assert len(hashes) == 2, f"37 tokens with block_size 16 have 2 full blocks, got {len(hashes)}"
    assert hashes[0] == impl.hash_block_tokens(None, prompt[:16])
    assert hashes[1] == impl.hash_block_tokens(hashes[0], prompt[16:32])
    assert impl.hash_prompt_blocks(prompt[:15], 16) == []
    assert impl.hash_prompt_blocks(prompt[:32], 16) == hashes


@pytest.mark.points(2)
def test_freed_cached_block_keeps_its_hash_and_is_revived_by_a_hit(impl):
    """A freed cached block stays findable; a hit takes it out of the free queue with ref 1."""
    bm = impl.BlockManager(4)
    block = bm.allocate()
    assert bm.cache_block(block, 1234) is True
    bm.free(block)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 1
    assert bm.get_cached_block(1234) == block
    assert bm.get_ref_count(block) == 1
    assert bm.num_free_blocks == 3
    assert block not in bm.free_block_queue.block_ids(), (
        "a revived block was left in the free queue — allocate() would hand it out while in use"
    )
    others = [bm.allocate() for _ in range(3)]
    assert block not in others
    check_invariants(bm)
    assert bm.get_cached_block(999) is None


@pytest.mark.points(2)
def test_eviction_takes_the_least_recently_freed_block_first(impl):
    """Allocating from a pool of cached free blocks evicts them in the order they were freed, and
    the head is taken even when an uncached free block stands behind it."""
    bm = impl.BlockManager(3)
    ids = bm.allocate_n(3)
    for block, h in zip(ids, (10, 11, 12)):
        bm.cache_block(block, h)
    bm.free(ids[1])
    bm.free(ids[2])
    bm.free(ids[0])  # free order: 11, 12, 10
    assert bm.allocate() == ids[1], "the least recently freed block must be evicted first"
    assert bm.get_cached_block(11) is None, "an evicted block's hash must leave the cache"
    assert bm.blocks[ids[1]].block_hash is None
    assert bm.num_cached_blocks == 2
    assert bm.get_cached_block(10) == ids[0], "a recently freed block must survive eviction"
    assert bm.allocate() == ids[2]
    assert bm.num_cached_blocks == 1
    check_invariants(bm)
    # the head is taken even when it is cached and an uncached free block stands behind it
    bm = impl.BlockManager(2)
    a, b = bm.allocate_n(2)
    bm.cache_block(a, 1)
    bm.free(a)
    bm.free(b)  # queue: a (cached), b (not)
    got = (bm.allocate(), bm.get_cached_block(1), bm.num_cached_blocks)
    assert got == (a, None, 0), (
        f"(allocate(), get_cached_block(1), num_cached_blocks) = {got}, not ({a}, None, 0): "
        "allocate takes the head of the free queue, evicting its hash, even when an uncached "
        "block waits behind it (skipping cached blocks breaks the least-recently-freed order)")


@pytest.mark.points(2)
def test_computed_blocks_are_the_longest_cached_prefix(impl):
    """get_computed_blocks returns hits up to the first miss and references each hit."""
    bm = impl.BlockManager(8)
    prompt = list(range(64))
    hashes = impl.hash_prompt_blocks(prompt, 16)  # 4 blocks
    ids = bm.allocate_n(4)
    for block, h in zip(ids, hashes):
        bm.cache_block(block, h)
    bm.free_blocks(ids)
    assert bm.num_free_blocks == 8
    hits = bm.get_computed_blocks(hashes[:2] + [424242] + hashes[3:])
    assert hits == ids[:2], f"must stop at the first miss, got {hits}"
    assert [bm.get_ref_count(b) for b in ids] == [1, 1, 0, 0]
    assert bm.num_free_blocks == 6
    assert bm.get_computed_blocks([]) == []
    check_invariants(bm)


@pytest.mark.points(1)
def test_cache_hit_on_a_block_in_use_shares_it(impl):
    """A hit on a block another sequence is using just adds a reference."""
    bm = impl.BlockManager(2)
    block = bm.allocate()
    bm.cache_block(block, 7)
    assert bm.get_cached_block(7) == block
    assert bm.get_ref_count(block) == 2 and bm.num_free_blocks == 1
    check_invariants(bm)


@pytest.mark.points(1)
def test_duplicate_content_keeps_the_first_block_as_cache_entry(impl):
    """Caching a second block under a hash already cached returns False and caches nothing."""
    bm = impl.BlockManager(3)
    a, b = bm.allocate_n(2)
    assert bm.cache_block(a, 5) is True
    assert bm.cache_block(b, 5) is False
    assert bm.cache_block(a, 5) is True, "re-caching a block under its own hash is a no-op"
    assert bm.blocks[b].block_hash is None
    assert bm.cached_block_hash_to_block[5].block_id == a
    check_invariants(bm)


@pytest.mark.points(1)
def test_cache_block_refuses_free_blocks_and_rehashing(impl):
    """cache_block needs a block in use and never changes a cached block's hash; state unchanged."""
    bm = impl.BlockManager(3)
    a = bm.allocate()
    bm.cache_block(a, 1)
    before = snapshot(bm)
    with pytest.raises(BlockNotAllocatedError, match="block_id=2"):
        bm.cache_block(2, 9)
    with pytest.raises(ValueError, match="block_hash"):
        bm.cache_block(a, 2)
    with pytest.raises(TypeError, match="block_hash"):
        bm.cache_block(a, "1")
    with pytest.raises(IndexError, match="block_id"):
        bm.cache_block(3, 9)
    assert snapshot(bm) == before
