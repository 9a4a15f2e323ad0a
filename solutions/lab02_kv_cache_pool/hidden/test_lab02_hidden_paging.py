"""Lab 2, hidden tests (instructor-only; stripped from the student release, run at grading).

Drawn from the test-design rules of issue #11 with shapes and seeds the public tests do not use:
a block size of 7 (not a power of two) with 3 KV heads of 5, a long random life cycle whose
every sequence must gather exactly its own tokens, slots past 2**31 with a block size of 5, and
both sides of write_kv's slot limit.
"""

from __future__ import annotations

import random

import pytest
import torch

from labs.lab02_kv_cache_pool._state import (
    check_invariants,
    gather_kv_each,
    new_pool,
    pick_test_device,
    poison,
    snapshot,
)
from reference.errors import OutOfBlocksError, SequenceTooLongError, TooManySequencesError


@pytest.fixture
def device() -> str:
    """The lab's test device (``PAGEDLAB_TEST_DEVICE``): the lab's conftest does not reach here."""
    return pick_test_device()


@pytest.mark.points(3)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_hidden_random_life_cycle_with_block_size_7_gathers_each_sequences_tokens(
        impl, device, dtype):
    """250 random steps (add, append 0–9 tokens, fork, free) on a pool of 7-token blocks: after
    each step every live sequence gathers exactly the K/V written for its own tokens, and the
    pool's invariants hold; refused steps change nothing."""
    rng = random.Random(1234)
    gen = torch.Generator().manual_seed(99)
    pool = new_pool(impl, device, num_blocks=20, block_size=7, num_kv_heads=3, head_size=5,
                    max_num_seqs=5, max_model_len=50, dtype=dtype)
    poison(pool)
    model: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # seq id -> (K, V) it must gather
    next_id = 100

    def write_new(seq_id: int, n: int) -> None:
        if n == 0:
            return
        k, v = torch.randn((2, n, 3, 5), generator=gen).to(dtype).to(pool.device)
        pool.write_kv(pool.slot_mapping([seq_id], [n]), k, v)
        old_k, old_v = model[seq_id]
        model[seq_id] = (torch.cat([old_k, k]), torch.cat([old_v, v]))

    for step in range(250):
        op = rng.random()
        before = snapshot(pool)
        try:
            if op < 0.3 or not model:
                seq_id, n = next_id, rng.randrange(0, 30)
                next_id += 1
                pool.add_sequence(seq_id, n)
                empty = torch.empty(0, 3, 5, dtype=dtype, device=pool.device)
                model[seq_id] = (empty, empty)
                write_new(seq_id, n)
            elif op < 0.7:
                seq_id = rng.choice(sorted(model))
                n = rng.randrange(0, 10)
                pool.append_tokens(seq_id, n)
                write_new(seq_id, n)
            elif op < 0.82:
                parent = rng.choice(sorted(model))
                pool.fork(parent, next_id)
                model[next_id] = tuple(t.clone() for t in model[parent])
                next_id += 1
            else:
                seq_id = rng.choice(sorted(model))
                pool.free_sequence(seq_id)
                del model[seq_id]
        except (OutOfBlocksError, SequenceTooLongError, TooManySequencesError):
            assert snapshot(pool) == before, f"step {step}: a refused call changed the pool"
        gathered = gather_kv_each(pool, list(model))  # one round trip when graded isolated
        for (seq_id, (want_k, want_v)), (got_k, got_v) in zip(model.items(), gathered):
            assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v), (
                f"step {step}: sequence {seq_id} gathers K/V that are not its own — a block "
                f"shared after a fork was written, or a slot computed for block size 7 is wrong"
            )
        check_invariants(pool)


@pytest.mark.points(1)
def test_hidden_slots_past_2_31_with_block_size_5(impl):
    """compute_slot_mapping gives exact int64 slots for block ids whose slots pass 2**31 and
    2**32, with a block size of 5 and tokens of two rows interleaved."""
    tables = torch.tensor([[2**30 + 7, 3, -1], [11, 2**31 - 1, 2**29]], dtype=torch.int32)
    rows = torch.tensor([1, 0, 1, 0, 1])
    positions = torch.tensor([6, 4, 12, 5, 0])
    got = impl.compute_slot_mapping(tables, rows, positions, 5)
    want = [(2**31 - 1) * 5 + 1, (2**30 + 7) * 5 + 4, 2**29 * 5 + 2, 3 * 5 + 0, 11 * 5 + 0]
    assert got.dtype == torch.int64 and got.tolist() == want, (
        f"slots {got.tolist()}, expected {want} (block_id × 5 overflows int32)")


@pytest.mark.points(1)
def test_hidden_write_kv_slot_limit_on_both_sides(impl, device):
    """write_kv accepts the last slot of the pool (num_blocks × block_size − 1) and refuses the
    next one, and one far past the pool, with an IndexError naming the slot, leaving the cache
    unchanged."""
    pool = new_pool(impl, device, num_blocks=5, block_size=3)
    pool.add_sequence(1, 15)  # one sequence holds every block: write_kv writes only into held blocks
    poison(pool)
    k = torch.ones((1, pool.num_kv_heads, pool.head_size), dtype=pool.dtype, device=pool.device)
    pool.write_kv(torch.tensor([14], device=pool.device), k, k)
    assert torch.equal(pool.key_cache[4, :, 2], k[0]), "slot 14 is block 4, row 2"
    before = snapshot(pool)
    for slot in (15, 100):
        with pytest.raises(IndexError, match=str(slot)):
            pool.write_kv(torch.tensor([slot], device=pool.device), k, k)
        assert snapshot(pool) == before
