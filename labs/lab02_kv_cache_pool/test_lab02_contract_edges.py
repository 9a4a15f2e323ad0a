"""Lab 2, the contract's edges: zero-token calls, integer scalars, the sizing functions, the
budget constructor and the pool's device — each a mistake that passes the everyday tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from labs.lab02_kv_cache_pool._state import from_memory_budget_of_a_subclass, new_pool, refused
from reference.errors import DuplicateSequenceError, UnknownSequenceError
from reference.grader.proxy import given



@pytest.mark.points(1)
def test_zero_token_calls_still_check_every_argument(impl, device):
    """A call with nothing to do is still checked in full: ``append_tokens(seq, 0)`` on an id
    that is not live, ``slot_mapping`` with a count of 0 for an unknown id or a count of
    ``0.0`` / ``False``, and ``write_kv`` of zero tokens with a key of the wrong dtype or shape
    raise their documented errors and change nothing."""
    pool = new_pool(impl, device)
    pool.add_sequence(0, 5)
    pool.add_sequence(1, 3)
    likely = " — likely cause: returning early when there is nothing to do, before the checks"
    for call, error, match in [
        (lambda: pool.append_tokens(99, 0), UnknownSequenceError, "99"),
        (lambda: pool.append_tokens(0, 0.0), TypeError, "num_new_tokens"),
        (lambda: pool.append_tokens(0, False), TypeError, "num_new_tokens"),
        (lambda: pool.slot_mapping([0, 99], [1, 0]), UnknownSequenceError, "99"),
        (lambda: pool.slot_mapping([0, 1], [1, 0.0]), TypeError, r"num_new_tokens\[1\]"),
        (lambda: pool.slot_mapping([0, 1], [1, False]), TypeError, r"num_new_tokens\[1\]"),
    ]:
        try:
            refused(pool, call, error, match)
        except pytest.fail.Exception as exc:
            raise AssertionError(f"{exc}{likely}") from None
    empty = pool.slot_mapping([0], [0])
    kv = dict(dtype=torch.float32, device=pool.device)
    good = torch.empty(0, pool.num_kv_heads, pool.head_size, **kv)
    for key, error, match in [
        (torch.empty(0, pool.num_kv_heads, pool.head_size, dtype=torch.float16,
                     device=pool.device), TypeError, "key"),
        ("not a tensor", TypeError, "key"),
        (torch.empty(0, pool.num_kv_heads + 1, pool.head_size, **kv), ValueError, "key"),
    ]:
        with pytest.raises(error, match=match):
            pool.write_kv(empty, key, good)


@pytest.mark.points(1)
@pytest.mark.parametrize("make", [lambda v: torch.tensor(v), lambda v: np.int64(v)],
                         ids=["torch scalar", "numpy scalar"])
def test_integer_scalars_become_python_ints(impl, device, make):
    """NumPy and torch integer scalars are accepted as ids and counts and turned into Python
    ints once: the pool then finds the id (``in``, ``get_row``, a second fork into it is a
    duplicate) and reports lengths and ids as ``int``."""
    pool = new_pool(impl, device)
    pool.add_sequence(make(7), make(5))
    pool.append_tokens(7, make(2))
    hint = " — likely cause: the converted value returned by the check was not kept"
    assert 7 in pool and pool.get_row(7) == 0, f"a sequence added as {make(7)!r} is not found as 7{hint}"
    assert [type(s) for s in pool.seq_ids] == [int], f"seq_ids holds {pool.seq_ids!r}{hint}"
    length = pool.get_context_len(7)
    assert type(length) is int and length == 7, f"get_context_len(7) is {length!r}{hint}"
    pool.fork(7, make(8))
    assert 8 in pool and [type(s) for s in pool.seq_ids] == [int, int], (
        f"after fork(7, {make(8)!r}) seq_ids is {pool.seq_ids!r}{hint}")
    try:
        refused(pool, lambda: pool.fork(7, make(8)), DuplicateSequenceError, "8")
    except pytest.fail.Exception:
        raise AssertionError(f"forking into {make(8)!r} again was accepted: it is live as "
                             f"8{hint}") from None


@pytest.mark.points(1)
def test_slot_mapping_checks_each_id_before_repeats(impl, device):
    """``slot_mapping`` checks every id with ``_check_seq_id`` before it tests for repeats, so
    ``[0, 0.0]`` and ``[1, True]`` (equal to an earlier id) are a ``TypeError`` naming
    ``seq_ids[1]``, not a "repeats" ``ValueError``."""
    pool = new_pool(impl, device)
    pool.add_sequence(0, 5)
    pool.add_sequence(1, 3)
    for ids in ([0, 0.0], [1, True]):
        try:
            refused(pool, lambda: pool.slot_mapping(ids, [1, 1]), TypeError, r"seq_ids\[1\]")
        except (pytest.fail.Exception, ValueError) as exc:
            raise AssertionError(
                f"slot_mapping({ids}, [1, 1]): {exc!r} — likely cause: the repeat test ran "
                "before each id was checked (0.0 == 0 and True == 1 look like repeats)") from None


@pytest.mark.points(1)
def test_sizing_functions_refuse_non_integers_and_bad_dtypes(impl):
    """``num_blocks_from_budget`` and ``from_memory_budget`` refuse a budget that is not an
    integer (``4096.0``, ``"4096"``, ``np.float64``) with a ``TypeError`` naming
    ``budget_bytes`` (nothing is rounded or parsed), and ``kv_cache_bytes_per_block`` /
    ``num_blocks_from_budget`` refuse a dtype that is not fp16, bf16 or fp32 naming ``dtype``."""
    for budget in (4096.0, "4096", np.float64(4096)):
        with pytest.raises(TypeError, match="budget_bytes"):
            impl.num_blocks_from_budget(budget, 4, 2, 8, torch.float16)
        with pytest.raises(TypeError, match="budget_bytes"):
            impl.KVCachePool.from_memory_budget(budget, 4, 2, 8, max_num_seqs=2, max_model_len=16)
    for dtype in (torch.float64, torch.int8):
        with pytest.raises(TypeError, match="dtype"):
            impl.kv_cache_bytes_per_block(4, 2, 8, dtype)
        with pytest.raises(TypeError, match="dtype"):
            impl.num_blocks_from_budget(4096, 4, 2, 8, dtype)


@pytest.mark.points(1)
def test_from_memory_budget_builds_the_subclass_with_every_argument(impl, device):
    """``from_memory_budget`` builds with ``cls(...)`` (a subclass gets a subclass) and passes
    every argument on, ``device`` included, as the handout says."""
    budget = 3 * impl.kv_cache_bytes_per_block(4, 2, 8, torch.float32)
    built_subclass, passed = given(impl, from_memory_budget_of_a_subclass)(
        budget, 4, 2, 8, max_num_seqs=2, max_model_len=16, dtype=torch.float32, device=device)
    assert built_subclass, (
        "a subclass's from_memory_budget built the base class — likely cause: KVCachePool(...) "
        "named instead of cls(...)")
    want = dict(num_blocks=3, block_size=4, num_kv_heads=2, head_size=8, max_num_seqs=2,
                max_model_len=16, dtype=str(torch.float32), device=str(torch.device(device)))
    got = {k: passed.get(k) for k in want}
    assert got == want, (
        f"from_memory_budget called the constructor with {got}, expected {want} — likely "
        "cause: an argument (device?) not passed on")


@pytest.mark.points(1)
def test_pool_device_is_the_concrete_device_of_its_tensors(impl, device):
    """``pool.device`` is the concrete device of the caches (``cuda`` becomes ``cuda:0``;
    ``cpu:0`` is ``cpu``), not the argument as given, so the pool's own slot mappings pass its
    device check."""
    asked = "cpu:0" if device == "cpu" else "cuda"
    pool = new_pool(impl, asked)
    assert pool.device == pool.key_cache.device, (
        f"pool.device is {pool.device!r} for device={asked!r}, the caches are on "
        f"{pool.key_cache.device} — likely cause: the argument kept instead of the tensors' device")
    pool.add_sequence(0, 2)
    k = torch.ones(2, pool.num_kv_heads, pool.head_size, dtype=pool.dtype, device=pool.device)
    pool.write_kv(pool.slot_mapping([0], [2]), k, k)
