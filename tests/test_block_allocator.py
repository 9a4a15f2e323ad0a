"""Infrastructure (no points): the trusted block allocator Lab 2 uses by default.

It must keep Lab 1's contract (all-or-nothing, typed errors, deterministic order), and Lab 1's
BlockManager must be a drop-in replacement for it inside Lab 2's pool.
"""

from __future__ import annotations

import random

import pytest

from reference.block_allocator import TrustedBlockAllocator
from reference.errors import BlockNotAllocatedError, DoubleFreeError, OutOfBlocksError
from reference.paths import SOLUTIONS_DIR


def _state(bm) -> tuple:
    return bm.num_free_blocks, tuple(bm.get_ref_count(b) for b in range(bm.num_blocks))


def test_fresh_allocator_hands_out_ids_in_order_and_fifo_after_frees():
    """0, 1, 2, ... first; freed blocks come back in the order they were freed, last id of a
    free_blocks call first (Lab 1's order without prefix caching)."""
    bm = TrustedBlockAllocator(5)
    assert bm.allocate_n(3) == [0, 1, 2]
    bm.free(1)
    bm.free_blocks([0, 2])
    assert bm.allocate_n(5) == [3, 4, 1, 2, 0]


def test_refused_calls_raise_typed_errors_and_change_nothing():
    """Out of blocks, double free, sharing a free block and bad ids are refused atomically."""
    bm = TrustedBlockAllocator(3)
    a, b = bm.allocate_n(2)
    bm.increase_ref_count(a)
    before = _state(bm)
    for call, error in [(lambda: bm.allocate_n(2), OutOfBlocksError),
                        (lambda: bm.free(2), DoubleFreeError),
                        (lambda: bm.free_blocks([b, b]), DoubleFreeError),
                        (lambda: bm.free_blocks([a, 7]), IndexError),
                        (lambda: bm.increase_ref_count(2), BlockNotAllocatedError),
                        (lambda: bm.get_ref_count(True), TypeError),
                        (lambda: bm.allocate_n(-1), ValueError)]:
        with pytest.raises(error):
            call()
        assert _state(bm) == before
    bm.free_blocks([a, a, b])
    assert _state(bm) == (3, (0, 0, 0))


@pytest.mark.skipif(not SOLUTIONS_DIR.is_dir(), reason="needs solutions/ (not in a student release)")
def test_lab1_block_manager_is_a_drop_in_replacement_in_the_lab2_pool():
    """The Lab 2 solution pool driven by the same random script ends in the same tables and ref
    counts with Lab 1's BlockManager as with the trusted allocator."""
    from reference.loader import load_impl

    lab1 = load_impl("lab01_block_manager", "solution")
    lab2 = load_impl("lab02_kv_cache_pool", "solution")

    def run(block_manager):
        pool = lab2.KVCachePool(16, 4, 1, 2, max_num_seqs=6, max_model_len=32,
                                block_manager=block_manager)
        rng = random.Random(0)
        for _ in range(300):
            live = pool.seq_ids
            op = rng.random()
            try:
                if op < 0.3 or not live:
                    pool.add_sequence(rng.randrange(10), rng.randrange(12))
                elif op < 0.6:
                    pool.append_tokens(rng.choice(live), rng.randrange(1, 6))
                elif op < 0.8:
                    pool.fork(rng.choice(live), rng.randrange(10))
                else:
                    pool.free_sequence(rng.choice(live))
            except (OutOfBlocksError, ValueError, RuntimeError):
                pass  # refusals are part of the script; both managers must refuse alike
        return (pool.block_tables.tolist(), pool.context_lens.tolist(),
                [pool.block_manager.get_ref_count(b) for b in range(16)])

    assert run(lab1.BlockManager(16)) == run(None)
