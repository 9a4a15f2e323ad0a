"""Lab 2, Part A: sizing the pool, its layout, and the sequence life cycle (add, append, free)."""

from __future__ import annotations

import pytest
import torch

from labs.lab02_kv_cache_pool._state import check_invariants, new_pool
from reference.block_allocator import TrustedBlockAllocator
from reference.errors import UnknownSequenceError
from reference.layout import PAD_BLOCK_ID, num_blocks_for

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.points(2)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pool_is_sized_from_a_block_count_or_a_memory_budget(impl, device, dtype):
    """One block holds K and V: 2 × block_size × num_kv_heads × head_size × itemsize bytes; a
    memory budget buys floor(budget / that) blocks, and a budget below one block is refused."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    per_block = impl.kv_cache_bytes_per_block(16, 8, 128, dtype)
    assert per_block == 2 * 16 * 8 * 128 * itemsize, (
        f"{dtype}: one block of 16 tokens × 8 heads × 128 takes {2 * 16 * 8 * 128 * itemsize} "
        f"bytes for K and V together, got {per_block}"
    )
    assert impl.num_blocks_from_budget(11 * per_block - 1, 16, 8, 128, dtype) == 10, (
        "a partial block is of no use: the budget must be rounded down"
    )
    small = impl.kv_cache_bytes_per_block(4, 2, 8, dtype)
    pool = impl.KVCachePool.from_memory_budget(7 * small + 5, 4, 2, 8, max_num_seqs=2,
                                               max_model_len=16, dtype=dtype, device=device)
    assert pool.num_blocks == 7 and pool.num_free_blocks == 7
    assert tuple(pool.key_cache.shape) == (7, 2, 4, 8) and pool.key_cache.dtype == dtype
    assert pool.key_cache.nbytes + pool.value_cache.nbytes == 7 * small
    with pytest.raises(ValueError, match="budget_bytes"):
        impl.num_blocks_from_budget(small - 1, 4, 2, 8, dtype)


@pytest.mark.points(2)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fresh_pool_has_the_workbook_layout_and_an_all_pad_table(impl, device, dtype):
    """key_cache / value_cache are [num_blocks, num_kv_heads, block_size, head_size] in the
    requested dtype on the requested device; block_tables is [max_num_seqs,
    ceil(max_model_len / block_size)] int32 filled with PAD_BLOCK_ID (never 0, a real block);
    context_lens is [max_num_seqs] int32 zeros."""
    pool = impl.KVCachePool(10, 4, 2, 8, max_num_seqs=3, max_model_len=18, dtype=dtype,
                            device=device)
    want_device = torch.device(device).type
    for name in ("key_cache", "value_cache"):
        cache = getattr(pool, name)
        assert tuple(cache.shape) == (10, 2, 4, 8), (
            f"{name} has shape {tuple(cache.shape)}; the workbook's layout is "
            f"[num_blocks, num_kv_heads, block_size, head_size] = (10, 2, 4, 8)"
        )
        assert cache.dtype == dtype and cache.device.type == want_device
    assert pool.max_blocks_per_seq == 5, (
        f"max_blocks_per_seq = {pool.max_blocks_per_seq}: a sequence of max_model_len=18 tokens "
        f"needs ceil(18 / 4) = 5 blocks (the seed used num_blocks, a row as wide as the pool)"
    )
    assert tuple(pool.block_tables.shape) == (3, 5) and pool.block_tables.dtype == torch.int32
    assert pool.block_tables.device.type == want_device
    assert bool((pool.block_tables == PAD_BLOCK_ID).all()), (
        f"a fresh block table must be all PAD_BLOCK_ID={PAD_BLOCK_ID}, got "
        f"{pool.block_tables.cpu().tolist()} — padding with 0 points every unused entry at block 0"
    )
    assert pool.context_lens.dtype == torch.int32 and pool.context_lens.device.type == want_device
    assert pool.context_lens.cpu().tolist() == [0, 0, 0]
    assert pool.num_free_blocks == 10 and pool.num_free_rows == 3 and pool.seq_ids == []


def _other_manager():
    return TrustedBlockAllocator(5)


def _used_manager():
    bm = TrustedBlockAllocator(6)
    bm.allocate()
    return bm


@pytest.mark.points(1)
@pytest.mark.parametrize("kwargs, error, name", [
    (dict(num_blocks=0), ValueError, "num_blocks"),
    (dict(block_size=2.0), TypeError, "block_size"),
    (dict(num_kv_heads=-1), ValueError, "num_kv_heads"),
    (dict(head_size="8"), TypeError, "head_size"),
    (dict(max_num_seqs=True), TypeError, "max_num_seqs"),
    (dict(max_model_len=0), ValueError, "max_model_len"),
    (dict(dtype=torch.int32), TypeError, "dtype"),
    (dict(dtype=torch.float64), TypeError, "dtype"),
    (dict(block_manager=_other_manager), ValueError, "block_manager"),
    (dict(block_manager=_used_manager), ValueError, "block_manager"),
    (dict(device="nonsense"), ValueError, "device="),
    (dict(device=3.5), ValueError, "device="),
], ids=lambda v: "-".join(v) if isinstance(v, dict) else None)
def test_constructor_rejects_bad_arguments(impl, device, kwargs, error, name):
    """Bad sizes, an unsupported dtype, a device torch cannot use (``device=`` and the value,
    as ``_check_device`` says it), or a block manager that does not manage exactly num_blocks
    free blocks raise a typed error naming the argument."""
    kwargs = {k: v() if callable(v) else v for k, v in kwargs.items()}
    base = dict(num_blocks=6, block_size=4, num_kv_heads=2, head_size=8, max_num_seqs=2,
                max_model_len=16, dtype=torch.float32, device=device)
    base.update(kwargs)
    with pytest.raises(error, match=name):
        impl.KVCachePool(base.pop("num_blocks"), base.pop("block_size"),
                         base.pop("num_kv_heads"), base.pop("head_size"), **base)


@pytest.mark.points(2)
def test_add_sequence_fills_its_row_and_takes_ceil_blocks(impl, device):
    """add_sequence takes ceil(n / block_size) blocks (none for an empty prompt), writes them
    into the lowest free row padded with PAD_BLOCK_ID, and sets context_lens; any int is a
    valid seq_id."""
    pool = new_pool(impl, device, num_blocks=8, max_model_len=16)
    assert pool.add_sequence(1000, 5) == [0, 1]
    assert pool.add_sequence(-7, 4) == [2]
    assert pool.add_sequence(3, 0) == []
    assert [pool.get_row(s) for s in (1000, -7, 3)] == [0, 1, 2]
    assert pool.seq_ids == [1000, -7, 3]
    assert [pool.get_block_table(s) for s in (1000, -7, 3)] == [[0, 1], [2], []]
    assert [pool.get_context_len(s) for s in (1000, -7, 3)] == [5, 4, 0]
    P = PAD_BLOCK_ID
    assert pool.block_tables.cpu().tolist() == [[0, 1, P, P], [2, P, P, P], [P] * 4, [P] * 4]
    assert pool.context_lens.cpu().tolist() == [5, 4, 0, 0]
    assert pool.num_free_blocks == 5 and pool.num_free_rows == 1
    assert 1000 in pool and 4 not in pool
    check_invariants(pool)


@pytest.mark.points(3)
@pytest.mark.parametrize("prompt_len", [0, 3])
def test_append_allocates_a_block_exactly_when_the_last_is_full(impl, device, prompt_len):
    """Grown one token at a time, a sequence holds exactly ceil(n / block_size) blocks after
    every append: token n gets a new block exactly when n % block_size == 0, never one token
    early or late, and its table row and context_len follow."""
    pool = new_pool(impl, device, num_blocks=8, max_model_len=24)
    pool.add_sequence(5, prompt_len)
    for n in range(prompt_len + 1, 21):
        pool.append_tokens(5, 1)
        blocks = pool.get_block_table(5)
        want = num_blocks_for(n, pool.block_size)
        assert len(blocks) == want, (
            f"after appending token {n - 1} (now {n} tokens, block_size 4) the sequence holds "
            f"{len(blocks)} blocks, expected ceil({n}/4) = {want} — a new block is needed exactly "
            f"when the last one is full (likely an off-by-one in the block count)"
        )
        assert pool.get_context_len(5) == n
        check_invariants(pool)
    assert pool.get_block_table(5) == [0, 1, 2, 3, 4]


@pytest.mark.points(1)
def test_append_many_tokens_takes_all_the_blocks_they_need(impl, device):
    """One append may cross several block boundaries (3 + 10 tokens → 4 blocks, in allocation
    order); an append that exactly fills the last block takes none."""
    pool = new_pool(impl, device, num_blocks=8, max_model_len=24)
    pool.add_sequence(1, 3)
    pool.append_tokens(1, 10)
    assert pool.get_block_table(1) == [0, 1, 2, 3] and pool.get_context_len(1) == 13
    pool.append_tokens(1, 3)
    assert pool.get_block_table(1) == [0, 1, 2, 3], "16 tokens fit 4 blocks of 4 exactly"
    pool.append_tokens(1, 0)
    assert pool.get_context_len(1) == 16 and pool.num_free_blocks == 4
    check_invariants(pool)


@pytest.mark.points(2)
def test_free_sequence_returns_blocks_and_resets_the_row(impl, device):
    """free_sequence gives every block back (ref_count 0), resets its block_tables row to
    PAD_BLOCK_ID and its context_len to 0, forgets the id, and the next add reuses the row."""
    pool = new_pool(impl, device, num_blocks=8, max_model_len=16)
    pool.add_sequence(10, 6)
    pool.add_sequence(11, 3)
    pool.free_sequence(10)
    P = PAD_BLOCK_ID
    assert pool.block_tables[0].cpu().tolist() == [P] * 4 and int(pool.context_lens[0]) == 0, (
        f"row 0 after free_sequence: {pool.block_tables[0].cpu().tolist()}, context_len "
        f"{int(pool.context_lens[0])} — a freed row must be reset to PAD_BLOCK_ID and 0, or a "
        f"kernel can still read blocks that now belong to somebody else"
    )
    assert 10 not in pool and pool.seq_ids == [11]
    with pytest.raises(UnknownSequenceError):
        pool.get_block_table(10)
    assert pool.num_free_blocks == 7
    assert [pool.block_manager.get_ref_count(b) for b in (0, 1, 2)] == [0, 0, 1]
    assert pool.add_sequence(12, 4) == [3] and pool.get_row(12) == 0
    check_invariants(pool)


@pytest.mark.points(1)
def test_pool_uses_the_block_manager_it_is_given(impl, device):
    """A block manager passed in (Lab 1's interface) is the one the pool draws from: its
    counts move with add and free."""
    bm = TrustedBlockAllocator(6)
    pool = new_pool(impl, device, num_blocks=6, block_manager=bm)
    assert pool.block_manager is bm
    pool.add_sequence(0, 9)
    assert bm.num_free_blocks == 3 and [bm.get_ref_count(b) for b in range(3)] == [1, 1, 1]
    pool.free_sequence(0)
    assert bm.num_free_blocks == 6


@pytest.mark.points(1)
def test_freed_rows_are_reused_lowest_first(impl, device):
    """A new sequence takes the lowest free table row, whatever order rows were freed in (the
    given ``_free_rows`` is a heap: push a freed row, pop the lowest)."""
    pool = new_pool(impl, device, max_num_seqs=5, num_blocks=12)
    for seq_id in range(5):
        pool.add_sequence(seq_id, 1)
    for seq_id in (4, 3, 0):
        pool.free_sequence(seq_id)
    pool.add_sequence(10, 1)
    pool.fork(1, 11)
    pool.add_sequence(12, 1)
    rows = [pool.get_row(s) for s in (10, 11, 12)]
    assert rows == [0, 3, 4], (
        f"after freeing rows 4, 3, 0 the next three sequences took rows {rows}, not [0, 3, 4]: "
        "take the lowest free row (heapq.heappop), and give a freed row back with heappush")
    pool.free_sequence(10)  # row 0
    pool.free_sequence(11)  # row 3, freed last
    pool.add_sequence(13, 1)
    assert pool.get_row(13) == 0, (
        f"with rows 0 and 3 free (3 freed last) the next sequence took row {pool.get_row(13)}, "
        "not 0: the lowest free row, not the most recently freed one")
    check_invariants(pool)
