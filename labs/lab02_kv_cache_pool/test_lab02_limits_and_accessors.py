"""Lab 2, Part F: both sides of every limit, every documented default, and accessors that hand
out copies — the edges the worked example never reaches."""

from __future__ import annotations

import pytest
import torch

from labs.lab02_kv_cache_pool._state import check_invariants, new_pool, snapshot
from reference.errors import SequenceTooLongError
from reference.expect import raises_naming


@pytest.mark.points(1)
def test_accessors_return_copies_not_live_state(impl, device):
    """Editing what add_sequence, get_block_table or seq_ids returned changes nothing in the
    pool: they return copies, never the pool's own lists."""
    pool = new_pool(impl, device)
    got = pool.add_sequence(3, 6)
    pool.add_sequence(4, 2)
    before = snapshot(pool)
    got.append(11)
    got[0] = 9
    table = pool.get_block_table(3)
    table.append(10)
    table[1] = 8
    ids = pool.seq_ids
    ids.append(99)
    assert snapshot(pool) == before, (
        "editing a list the pool returned changed the pool — likely cause: add_sequence or "
        "get_block_table returning the sequence's own block list (return a copy: list(...))"
    )
    assert 99 not in pool.seq_ids
    pool.append_tokens(3, 3)  # grows from the real table, not the edited one
    check_invariants(pool)


@pytest.mark.points(1)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_budget_of_exactly_one_block_builds_a_one_block_pool(impl, dtype):
    """A budget of exactly one block's bytes buys one block (one byte less buys none and is
    refused naming budget_bytes; one block less a byte of two buys one), for a block size of 3."""
    per_block = impl.kv_cache_bytes_per_block(3, 2, 5, dtype)
    assert per_block == 2 * 3 * 2 * 5 * dtype.itemsize
    assert impl.num_blocks_from_budget(per_block, 3, 2, 5, dtype) == 1, (
        "a budget of exactly one block must buy one block — likely cause: an off-by-one "
        "(<= 1 where < 1 is meant) in the 'holds no block' check"
    )
    assert impl.num_blocks_from_budget(2 * per_block - 1, 3, 2, 5, dtype) == 1
    assert impl.num_blocks_from_budget(2 * per_block, 3, 2, 5, dtype) == 2
    with pytest.raises(ValueError, match="budget_bytes"):
        impl.num_blocks_from_budget(per_block - 1, 3, 2, 5, dtype)
    pool = impl.KVCachePool.from_memory_budget(per_block, 3, 2, 5, max_num_seqs=1,
                                               max_model_len=3, dtype=dtype)
    assert pool.num_blocks == 1 and pool.add_sequence(0, 3) == [0]


@pytest.mark.points(1)
def test_from_memory_budget_honours_every_argument(impl):
    """from_memory_budget passes every argument through (block size 3, 2 heads of 5, 3 rows,
    max_model_len 10, float32), and omitting dtype and device gives float16 on the CPU."""
    per_block = 2 * 3 * 2 * 5 * 4
    pool = impl.KVCachePool.from_memory_budget(7 * per_block + 5, 3, 2, 5, max_num_seqs=3,
                                               max_model_len=10, dtype=torch.float32)
    got = (pool.num_blocks, pool.dtype, tuple(pool.key_cache.shape), tuple(pool.block_tables.shape))
    want = (7, torch.float32, (7, 2, 3, 5), (3, 4))
    assert got == want, (
        f"from_memory_budget built (num_blocks, dtype, cache shape, table shape) = {got}, "
        f"expected {want} — likely cause: an argument not passed on to the constructor"
    )
    assert pool.value_cache.dtype == torch.float32 and pool.max_model_len == 10
    default = impl.KVCachePool.from_memory_budget(per_block, 3, 2, 5, max_num_seqs=1,
                                                  max_model_len=3)
    assert default.dtype == torch.float16 and default.key_cache.dtype == torch.float16, (
        "the documented default dtype is torch.float16")
    assert default.num_blocks == 2, "fp16 blocks are half the size of fp32 ones"
    assert default.key_cache.device.type == "cpu", "the documented default device is the CPU"


@pytest.mark.points(1)
@pytest.mark.parametrize("max_model_len", [10, 12])
def test_a_sequence_of_exactly_max_model_len_tokens_fits(impl, device, max_model_len):
    """A sequence may hold exactly max_model_len tokens — by add_sequence, or by appends up to
    it — and one token more is refused with nothing changed (block size 4; 10 is not a
    multiple of it)."""
    pool = new_pool(impl, device, max_model_len=max_model_len)
    pool.add_sequence(0, max_model_len)
    pool.add_sequence(1, max_model_len - 3)
    pool.append_tokens(1, 2)
    pool.append_tokens(1, 1)
    assert pool.get_context_len(1) == max_model_len
    before = snapshot(pool)
    for call in (lambda: pool.append_tokens(0, 1), lambda: pool.append_tokens(1, 1),
                 lambda: pool.add_sequence(2, max_model_len + 1)):
        with pytest.raises(SequenceTooLongError):
            call()
        assert snapshot(pool) == before
    pool.append_tokens(0, 0)  # zero tokens at the limit is still fine
    check_invariants(pool)


SIZE_ARGS = ("num_blocks", "block_size", "num_kv_heads", "head_size", "max_num_seqs",
             "max_model_len")


@pytest.mark.points(1)
def test_every_size_may_be_one_and_none_may_be_zero(impl, device):
    """A pool whose six sizes are all 1 (one block of one token, one head of one element, one
    row) works end to end; each size set to 0 alone raises ValueError naming it. The same
    holds for kv_cache_bytes_per_block's three sizes."""
    sizes = dict.fromkeys(SIZE_ARGS, 1)
    pool = new_pool(impl, device, **sizes)
    assert tuple(pool.key_cache.shape) == (1, 1, 1, 1) and tuple(pool.block_tables.shape) == (1, 1)
    pool.add_sequence(0, 1)
    kv = torch.full((1, 1, 1), 2.5, dtype=pool.dtype, device=pool.device)
    pool.write_kv(pool.slot_mapping([0], [1]), kv, kv)
    assert pool.gather_kv(0)[0].tolist() == [[[2.5]]]
    for name in SIZE_ARGS:
        with pytest.raises(ValueError, match=name):
            new_pool(impl, device, **{**sizes, name: 0})
    assert impl.kv_cache_bytes_per_block(1, 1, 1, torch.float16) == 4, (
        "one token of one head of one fp16 element takes 2 bytes for K and 2 for V — likely "
        "cause: a minimum of more than 1 on a size")
    for i, name in enumerate(("block_size", "num_kv_heads", "head_size")):
        args = [1, 1, 1]
        args[i] = 0
        with pytest.raises(ValueError, match=name):
            impl.kv_cache_bytes_per_block(*args, torch.float16)


@pytest.mark.points(1)
@pytest.mark.parametrize("sizes", [
    dict(num_blocks=2**40, block_size=2**30),  # torch: the byte count overflows (RuntimeError)
    dict(num_blocks=2**63),  # torch: a dimension past int64 (TypeError)
    dict(max_model_len=2**70),  # the block table's width past int64 (TypeError)
], ids=["bytes overflow", "num_blocks past int64", "table width past int64"])
def test_a_pool_too_large_to_allocate_is_refused_with_value_error(impl, sizes):
    """Sizes whose tensors cannot exist (a byte count past int64, a dimension past int64) are
    refused with a ValueError saying "cannot be allocated" and naming the sizes, whatever error
    torch raised underneath (and before the default block manager is built)."""
    # NOTE: each check makes the call again (a refused pool changes nothing).
    call = lambda: new_pool(impl, "cpu", **sizes)  # noqa: E731
    raises_naming(call, ValueError, "cannot be allocated",
                  f"{sizes} (the docstring's Raises: the message says 'cannot be allocated' and "
                  f"names the sizes; likely cause: a check that runs before the tensors are made, "
                  f"e.g. the default block manager built first, refusing num_blocks itself)",
                  crashed_hint=" — likely cause: torch's own RuntimeError or TypeError let "
                               "through instead of a ValueError")
    raises_naming(call, ValueError, "num_blocks",
                  f"{sizes} (the error should name the sizes that were asked for)")


@pytest.mark.points(1)
def test_constructors_take_their_documented_arguments_by_keyword(impl):
    """Every constructor argument can be passed by name (as an engine's config does), and the
    ones after ``*`` only by name: a max_num_seqs passed by position is a TypeError."""
    pool = impl.KVCachePool(num_blocks=3, block_size=2, num_kv_heads=1, head_size=4,
                            max_num_seqs=2, max_model_len=6, dtype=torch.float32, device="cpu")
    assert (pool.num_blocks, pool.block_size, pool.max_blocks_per_seq) == (3, 2, 3)
    budget = impl.KVCachePool.from_memory_budget(
        budget_bytes=3 * 2 * 2 * 4 * 4, block_size=2, num_kv_heads=1, head_size=4,
        max_num_seqs=2, max_model_len=6, dtype=torch.float32, device="cpu")
    assert budget.num_blocks == 3
    with pytest.raises(TypeError):
        impl.KVCachePool(3, 2, 1, 4, 2, 6)
    with pytest.raises(TypeError):
        impl.KVCachePool.from_memory_budget(96, 2, 1, 4, 2, 6)


@pytest.mark.points(1)
def test_a_batch_of_300_sequences_maps_every_slot(impl, device):
    """slot_mapping takes a batch of 300 distinct sequences (more than any small-int cache):
    no false "repeats", and each sequence's one new token gets its own slot."""
    pool = new_pool(impl, device, num_blocks=300, block_size=2, max_num_seqs=300, max_model_len=2)
    for seq_id in range(300):
        pool.add_sequence(seq_id, 1)
    slots = pool.slot_mapping(list(range(300)), [1] * 300).tolist()
    want = [pool.get_block_table(s)[0] * 2 for s in range(300)]
    assert slots == want, (
        "a batch of 300 distinct sequences got wrong slots or was refused — likely cause: "
        "comparing lengths with `is` (true only for small ints) in the repeated-id check"
    )


@pytest.mark.points(1)
def test_a_huge_budget_buys_exactly_the_blocks_it_pays_for(impl):
    """``num_blocks_from_budget`` is ``budget_bytes // bytes_per_block`` in integers: a budget of
    2**60 - 1 bytes at 4 bytes a block buys 2**58 - 1 blocks (a float division rounds it up to
    2**58: one block more than the budget pays for)."""
    got = impl.num_blocks_from_budget(2**60 - 1, 1, 1, 1, torch.float16)
    assert got == 2**58 - 1, (
        f"num_blocks_from_budget(2**60 - 1, 1, 1, 1, float16) = {got}, not 2**58 - 1: divide "
        "with //, never int(a / b) (a float has 53 bits)")
