"""Test helpers for Lab 2: the test device, whole-state snapshots, invariants, op counting."""

from __future__ import annotations

import hashlib
import os

import torch
from torch.overrides import TorchFunctionMode

from reference.grader.proxy import call_each, gather
from reference.layout import PAD_BLOCK_ID, num_blocks_for

DEVICE_ENV = "PAGEDLAB_TEST_DEVICE"


def pick_test_device() -> str:
    """Returns the device named by ``PAGEDLAB_TEST_DEVICE`` (default ``cpu``).

    Raises:
        RuntimeError: CUDA was asked for but torch sees no GPU (a GPU run must not quietly
            turn into a CPU run).
    """
    device = os.environ.get(DEVICE_ENV, "").strip() or "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"{DEVICE_ENV}={device} but torch.cuda.is_available() is False")
    return device


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a tensor: equal bytes == bit-identical (NaN poison included)."""
    return t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()


def digest(t: torch.Tensor) -> str:
    """A short fingerprint of a tensor's raw bytes."""
    return hashlib.sha256(tensor_bytes(t)).hexdigest()[:16]


def poison(pool) -> None:
    """Fills both caches with NaN: reading a slot nobody wrote turns results into NaN."""
    pool.key_cache.fill_(float("nan"))
    pool.value_cache.fill_(float("nan"))


def snapshot(pool) -> tuple:
    """Everything observable about a pool (host shadow, device tables, ref counts, cache bytes)."""
    return gather(_snapshot, pool)


def _snapshot(pool) -> tuple:
    # NOTE: run through gather (where the pool lives: one round trip when graded isolated).
    bm = pool.block_manager
    return (
        tuple((s, pool.get_row(s), tuple(pool.get_block_table(s)), pool.get_context_len(s))
              for s in pool.seq_ids),
        pool.num_free_rows,
        tuple(map(tuple, pool.block_tables.cpu().tolist())),
        tuple(pool.context_lens.cpu().tolist()),
        tuple(call_each(bm.get_ref_count, [(b,) for b in range(pool.num_blocks)])),
        bm.num_free_blocks,
        digest(pool.key_cache),
        digest(pool.value_cache),
    )


def tables_and_counts(pool) -> tuple[list, int, dict]:
    """``(pool.seq_ids, pool.num_free_blocks, {seq: pool.get_block_table(seq)})``."""
    return gather(_tables_and_counts, pool)


def _tables_and_counts(pool) -> tuple[list, int, dict]:
    seq_ids = list(pool.seq_ids)
    return seq_ids, pool.num_free_blocks, {s: pool.get_block_table(s) for s in seq_ids}


def gather_kv_each(pool, seq_ids: list[int]) -> list:
    """``[pool.gather_kv(s) for s in seq_ids]``."""
    return gather(_gather_kv_each, pool, seq_ids)


def _gather_kv_each(pool, seq_ids: list[int]) -> list:
    return [pool.gather_kv(s) for s in seq_ids]


def _observe(pool) -> dict:
    """What :func:`check_invariants` checks, read in one go (run through gather)."""
    bm = pool.block_manager
    return {
        "tables": pool.block_tables.cpu().tolist(),
        "lens": pool.context_lens.cpu().tolist(),
        "seqs": [(s, pool.get_row(s), pool.get_block_table(s), pool.get_context_len(s))
                 for s in pool.seq_ids],
        "num_free_rows": pool.num_free_rows,
        "refs": call_each(bm.get_ref_count, [(b,) for b in range(pool.num_blocks)]),
        "num_free_blocks": bm.num_free_blocks,
        "block_size": pool.block_size,
        "max_blocks_per_seq": pool.max_blocks_per_seq,
        "max_num_seqs": pool.max_num_seqs,
        "num_blocks": pool.num_blocks,
    }


def check_invariants(pool) -> None:
    """Asserts the pool's invariants, with a message that says which one broke."""
    state = gather(_observe, pool)
    tables, lens, block_size = state["tables"], state["lens"], state["block_size"]
    used_rows = set()
    holders = [0] * state["num_blocks"]
    for s, row, blocks, n in state["seqs"]:
        assert row not in used_rows, f"seq {s} shares row {row} with another sequence"
        used_rows.add(row)
        want = num_blocks_for(n, block_size)
        assert len(blocks) == want, (
            f"seq {s} holds {n} tokens in {len(blocks)} blocks; ceil({n}/{block_size}) = {want}"
        )
        assert len(set(blocks)) == len(blocks), f"seq {s} lists a block twice: {blocks}"
        padded = blocks + [PAD_BLOCK_ID] * (state["max_blocks_per_seq"] - len(blocks))
        assert tables[row] == padded, (
            f"seq {s}: device block_tables[{row}] = {tables[row]}, host table {blocks} padded "
            f"with {PAD_BLOCK_ID} = {padded}"
        )
        assert lens[row] == n, f"seq {s}: context_lens[{row}] = {lens[row]}, expected {n}"
        for b in blocks:
            holders[b] += 1
    for row in range(state["max_num_seqs"]):
        if row not in used_rows:
            assert all(b == PAD_BLOCK_ID for b in tables[row]) and lens[row] == 0, (
                f"row {row} belongs to no sequence but holds {tables[row]}, context_len "
                f"{lens[row]} — a freed row must be all PAD_BLOCK_ID with length 0"
            )
    assert state["num_free_rows"] == state["max_num_seqs"] - len(used_rows)
    refs = state["refs"]
    for b in range(state["num_blocks"]):
        assert refs[b] == holders[b], (
            f"block {b}: ref_count {refs[b]} but {holders[b]} live sequences hold it "
            f"(a leaked block, or a shared block freed too early)"
        )
    assert state["num_free_blocks"] == holders.count(0), (
        f"num_free_blocks = {state['num_free_blocks']}, but {holders.count(0)} blocks are held "
        f"by nobody"
    )


class CountTorchCalls(TorchFunctionMode):
    """Counts the torch functions and tensor methods called inside a ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_torch_calls(impl):
    """A :class:`CountTorchCalls` where ``impl``'s code runs: here, or in the grading worker
    when grading isolated (whose ``impl`` is a proxy)."""
    from reference.grader.proxy import Remote

    if isinstance(impl, Remote):
        return object.__getattribute__(impl, "_client").count_torch_calls()
    return CountTorchCalls()


def new_pool(impl, device: str, **overrides):
    """A small pool for tests: 12 blocks of 4 tokens, 2 KV heads of 8, fp32, 4 rows, 24 tokens."""
    kwargs = dict(num_blocks=12, block_size=4, num_kv_heads=2, head_size=8, max_num_seqs=4,
                  max_model_len=24, dtype=torch.float32, device=device)
    kwargs.update(overrides)
    pos = [kwargs.pop(k) for k in ("num_blocks", "block_size", "num_kv_heads", "head_size")]
    return impl.KVCachePool(*pos, **kwargs)


def scramble(pool) -> None:
    """Leaves the pool empty but with its free blocks out of id order.

    Three helper sequences take a third of the pool each and are freed middle, first, last; a
    fresh block manager's ``0, 1, 2, ...`` order is gone, so logical order != physical order.
    """
    third = pool.num_blocks // 3
    for junk in (-1, -2, -3):
        pool.add_sequence(junk, third * pool.block_size)
    for junk in (-2, -1, -3):
        pool.free_sequence(junk)


def random_kv(seed: int, num_tokens: int, pool) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random K and V ``[num_tokens, num_kv_heads, head_size]`` in the pool's dtype/device.

    Drawn on the CPU, so the values are the same whatever the test device.
    """
    gen = torch.Generator().manual_seed(seed)
    shape = (2, num_tokens, pool.num_kv_heads, pool.head_size)
    kv = torch.randn(shape, generator=gen).to(pool.dtype).to(pool.device)
    return kv[0], kv[1]


def from_memory_budget_of_a_subclass(*args, **kwargs) -> tuple[bool, dict]:
    """Calls ``from_memory_budget`` on a subclass of the implementation's ``KVCachePool`` whose
    constructor records the arguments it gets.

    NOTE: tests call it through ``reference.grader.proxy.given``, so it runs where the student's
    code runs (grading isolated, a subclass defined in the test's process could not be sent).

    Returns:
        ``(built the subclass, the constructor's arguments by name)``, dtype and device as
        strings.
    """
    import inspect

    from reference.loader import load_impl

    base = load_impl("lab02_kv_cache_pool").KVCachePool
    signature = inspect.signature(base.__init__)
    seen: dict = {}

    class Recording(base):
        def __init__(self, *a, **kw):
            seen.update(signature.bind(self, *a, **kw).arguments)
            super().__init__(*a, **kw)

    pool = Recording.from_memory_budget(*args, **kwargs)
    seen.pop("self", None)
    for name in ("dtype", "device"):
        if seen.get(name) is not None:
            seen[name] = str(torch.device(seen[name]) if name == "device" else seen[name])
    return type(pool) is Recording, seen


def refused(pool, call, error, match=None) -> None:
    """Runs ``call``, expects ``error`` (matching ``match``), and checks the pool did not change."""
    import pytest

    before = snapshot(pool)
    with pytest.raises(error, match=match):
        call()
    assert snapshot(pool) == before, "a refused call changed the pool (check first, then change)"
