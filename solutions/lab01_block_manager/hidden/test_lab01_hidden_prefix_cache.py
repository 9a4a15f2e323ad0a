"""Lab 1, hidden tests (instructor-only; stripped from the student release, run at grading).

They use the same ``impl`` fixture and points as the public tests, and probe what the public
ones only sample: a long scheduler-like workload with heavy prefix sharing and eviction, and
LRU order after a block is revived from the middle of the free queue.
"""

from __future__ import annotations

import random

import pytest

from labs.lab01_block_manager._state import check_invariants
from reference.errors import OutOfBlocksError

BLOCK_SIZE = 4


@pytest.mark.points(3)
def test_hidden_scheduler_workload_never_serves_stale_blocks(impl):
    """Over 300 requests sharing 5 system prompts, with eviction under memory pressure, every
    prefix-cache hit returns a block that still holds exactly the content of its hash, and the
    manager's invariants hold after every request."""
    rng = random.Random(7)
    num_blocks = 24
    bm = impl.BlockManager(num_blocks)
    system_prompts = [[rng.randrange(1000) for _ in range(rng.choice((8, 12, 16)))] for _ in range(5)]
    content: dict[int, int | None] = {}  # the model: block id -> hash of the tokens it holds
    live: list[list[int]] = []  # block ids of running requests, oldest first
    num_hits = 0
    for step in range(300):
        prompt = rng.choice(system_prompts) + [rng.randrange(1000) for _ in range(rng.randrange(1, 9))]
        hashes = impl.hash_prompt_blocks(prompt, BLOCK_SIZE)
        hits = bm.get_computed_blocks(hashes)
        for i, block in enumerate(hits):
            assert content.get(block) == hashes[i], (
                f"request {step}: cache hit on block {block} for prefix block {i}, but that block "
                f"was reused for other tokens — a stale hash survived the block's eviction"
            )
        num_hits += len(hits)
        need = -(-len(prompt) // BLOCK_SIZE) - len(hits)
        while True:
            try:
                new = bm.allocate_n(need)
                break
            except OutOfBlocksError:
                assert live, f"request {step}: {need} blocks refused with nothing else running"
                bm.free_blocks(live.pop(0))  # preempt the oldest request
        for j, block in enumerate(new):
            idx = len(hits) + j
            content[block] = hashes[idx] if idx < len(hashes) else None
            if idx < len(hashes) and not bm.cache_block(block, hashes[idx]):
                content[block] = None  # duplicate content: not the cache entry, never a hit
        live.append(hits + new)
        if len(live) > 4:
            bm.free_blocks(live.pop(0))
        check_invariants(bm)
    assert num_hits > 100, f"only {num_hits} prefix blocks were reused — prefix caching is off?"
    for blocks in live:
        bm.free_blocks(blocks)
    assert bm.num_free_blocks == num_blocks, (
        f"{num_blocks - bm.num_free_blocks} blocks still in use after every request finished"
    )
    check_invariants(bm)


@pytest.mark.points(1)
def test_hidden_block_revived_from_mid_queue_is_evicted_last(impl):
    """A block revived from the middle of the free queue and freed again moves to the tail: it
    is evicted after every block freed before it, and a prefix lookup stops at the first
    evicted block without taking references past it."""
    bm = impl.BlockManager(4)
    ids = bm.allocate_n(4)
    for block, h in zip(ids, (100, 101, 102, 103)):
        bm.cache_block(block, h)
    for block in ids:
        bm.free(block)  # free queue: ids[0] ids[1] ids[2] ids[3]
    assert bm.get_cached_block(102) == ids[2]  # revived from the middle
    bm.free(ids[2])  # back at the tail: ids[0] ids[1] ids[3] ids[2]
    got = [bm.allocate() for _ in range(3)]
    assert got == [ids[0], ids[1], ids[3]], (
        f"eviction order {got}, expected {[ids[0], ids[1], ids[3]]}: a revived-then-freed block "
        f"must go to the tail of the free queue"
    )
    assert bm.num_cached_blocks == 1, (
        f"num_cached_blocks={bm.num_cached_blocks} after 3 evictions of 4 cached blocks, "
        f"expected 1: an evicted block's hash must leave the cache"
    )
    assert bm.get_ref_count(ids[2]) == 0, "the revived-then-freed block must be free again"
    assert bm.get_computed_blocks([100, 102]) == [], "the lookup must stop at the evicted block"
    assert bm.get_ref_count(ids[2]) == 0, "a block after the first miss must not be referenced"
    check_invariants(bm)
