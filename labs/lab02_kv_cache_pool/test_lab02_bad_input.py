"""Lab 2, Part B: bad input gets a typed error, and a refused call changes nothing, leaks nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from labs.lab02_kv_cache_pool._state import (
    check_invariants,
    new_pool,
    poison,
    random_kv,
    refused,
    snapshot,
)
from reference.errors import (
    DeviceMismatchError,
    DuplicateSequenceError,
    OutOfBlocksError,
    SequenceTooLongError,
    TooManySequencesError,
    UnknownSequenceError,
)



@pytest.mark.points(1)
def test_unknown_sequence_ids_raise_and_change_nothing(impl, device):
    """Every call on an id that is not live (never added, or freed) raises UnknownSequenceError
    naming it, and changes nothing."""
    pool = new_pool(impl, device)
    pool.add_sequence(1, 5)
    pool.add_sequence(2, 3)
    pool.free_sequence(2)
    calls = {
        "append_tokens": lambda: pool.append_tokens(2, 1),
        "free_sequence (double free)": lambda: pool.free_sequence(2),
        "fork": lambda: pool.fork(2, 9),
        "slot_mapping": lambda: pool.slot_mapping([1, 2], [1, 1]),
        "gather_kv": lambda: pool.gather_kv(2),
        "get_block_table": lambda: pool.get_block_table(2),
        "get_context_len": lambda: pool.get_context_len(2),
        "get_row": lambda: pool.get_row(2),
    }
    for what, call in calls.items():
        before = snapshot(pool)
        with pytest.raises(UnknownSequenceError, match="2") as info:
            call()
        assert isinstance(info.value, LookupError), what
        assert snapshot(pool) == before, f"refused {what} changed the pool"
    check_invariants(pool)


@pytest.mark.points(1)
@pytest.mark.parametrize("call, error, name", [
    (lambda p: p.add_sequence(1.0, 3), TypeError, "seq_id"),
    (lambda p: p.add_sequence(True, 3), TypeError, "seq_id"),
    (lambda p: p.add_sequence("4", 3), TypeError, "seq_id"),
    (lambda p: p.add_sequence(4, -1), ValueError, "num_prompt_tokens"),
    (lambda p: p.add_sequence(4, 2.5), TypeError, "num_prompt_tokens"),
    (lambda p: p.append_tokens(0, -1), ValueError, "num_new_tokens"),
    (lambda p: p.append_tokens(0, 1.0), TypeError, "num_new_tokens"),
    (lambda p: p.fork(0, None), TypeError, "child_seq_id"),
    (lambda p: p.fork("0", 5), TypeError, "parent_seq_id"),
], ids=["add seq_id 1.0", "add seq_id True", "add seq_id '4'", "add -1 tokens", "add 2.5 tokens",
        "append -1", "append 1.0", "fork child None", "fork parent '0'"])
def test_bad_argument_types_raise_typed_errors(impl, device, call, error, name):
    """Ids and counts must be ints (bools and floats refused) and counts >= 0; the error is
    typed, names the argument, and changes nothing."""
    pool = new_pool(impl, device)
    pool.add_sequence(0, 5)
    refused(pool, lambda: call(pool), error, name)


@pytest.mark.points(1)
def test_duplicate_ids_are_refused(impl, device):
    """Adding a live id, or forking into one, raises DuplicateSequenceError naming it and
    changes nothing."""
    pool = new_pool(impl, device)
    pool.add_sequence(0, 5)
    pool.add_sequence(1, 2)
    refused(pool, lambda: pool.add_sequence(0, 1), DuplicateSequenceError, "seq_id=0")
    refused(pool, lambda: pool.fork(0, 1), DuplicateSequenceError, "child_seq_id=1")
    refused(pool, lambda: pool.fork(0, 0), DuplicateSequenceError, "child_seq_id=0")


@pytest.mark.points(1)
def test_sequences_longer_than_max_model_len_are_refused(impl, device):
    """A prompt longer than max_model_len, or an append past it, raises SequenceTooLongError
    naming max_model_len before anything is allocated; growing to exactly max_model_len works
    (the limit is in tokens, even where the last block has room to spare)."""
    pool = new_pool(impl, device, max_model_len=10)  # 3 blocks of 4 = 12 slots; limit 10
    assert pool.max_blocks_per_seq == 3
    refused(pool, lambda: pool.add_sequence(0, 11), SequenceTooLongError, "max_model_len")
    pool.add_sequence(0, 10)
    refused(pool, lambda: pool.append_tokens(0, 1), SequenceTooLongError, "max_model_len")
    pool.add_sequence(1, 8)
    refused(pool, lambda: pool.append_tokens(1, 3), SequenceTooLongError, "max_model_len")
    pool.append_tokens(1, 2)
    assert pool.get_context_len(1) == 10 and len(pool.get_block_table(1)) == 3
    check_invariants(pool)


@pytest.mark.points(1)
def test_more_sequences_than_rows_are_refused(impl, device):
    """With max_num_seqs sequences live, add and fork raise TooManySequencesError and change
    nothing; freeing one makes room again."""
    pool = new_pool(impl, device, max_num_seqs=2)
    pool.add_sequence(0, 4)
    pool.add_sequence(1, 0)
    refused(pool, lambda: pool.add_sequence(2, 1), TooManySequencesError, "max_num_seqs")
    refused(pool, lambda: pool.fork(0, 2), TooManySequencesError, "max_num_seqs")
    pool.free_sequence(1)
    pool.fork(0, 2)
    assert pool.get_row(2) == 1
    check_invariants(pool)


@pytest.mark.points(3)
def test_out_of_blocks_mid_add_or_append_changes_nothing(impl, device):
    """When a multi-block add or append, or an append that must copy a shared block first,
    needs more blocks than are free, OutOfBlocksError is raised before anything changes: no
    block leaks, no row is taken, and the free blocks stay usable."""
    pool = new_pool(impl, device, num_blocks=5, max_model_len=24)
    pool.add_sequence(0, 8)  # 2 blocks, 3 free
    # The pool checks before it asks the manager: its error names the refused call.
    refused(pool, lambda: pool.add_sequence(1, 13), OutOfBlocksError, "add_sequence")  # needs 4
    refused(pool, lambda: pool.append_tokens(0, 13), OutOfBlocksError, "append_tokens")  # 4 more
    assert pool.num_free_blocks == 3 and pool.num_free_rows == 3, "a refused call leaked"
    pool.add_sequence(2, 5)  # 2 blocks, 1 free; its last block is half full
    pool.fork(2, 3)
    pool.add_sequence(4, 4)  # takes the last free block
    # seq 3's next token goes into a block it shares with seq 2: it needs a copy, and no block
    refused(pool, lambda: pool.append_tokens(3, 1), OutOfBlocksError, "append_tokens.* needs 1")
    pool.free_sequence(4)
    pool.append_tokens(3, 1)  # now the copy can be made
    assert pool.get_block_table(3)[0] == pool.get_block_table(2)[0]
    assert pool.get_block_table(3)[1] != pool.get_block_table(2)[1]
    check_invariants(pool)
    for s in list(pool.seq_ids):
        pool.free_sequence(s)
    assert pool.num_free_blocks == 5, "blocks leaked"


@pytest.mark.points(1)
def test_appends_that_need_no_block_work_in_a_full_pool(impl, device):
    """With no block free, appending into the room left in a private last block works (it
    needs no block), and so does appending zero tokens; one token past the last block is
    refused with OutOfBlocksError naming append_tokens."""
    pool = new_pool(impl, device, num_blocks=3, max_model_len=12)
    pool.add_sequence(0, 5)  # 2 blocks of 4 tokens: 3 slots left in the last one
    pool.add_sequence(1, 4)  # the last free block
    assert pool.num_free_blocks == 0
    pool.append_tokens(0, 3)
    pool.append_tokens(1, 0)
    assert pool.get_context_len(0) == 8 and pool.num_free_blocks == 0, (
        "an append that fits in the last block was refused in a full pool — likely cause: "
        "the free-block check asks for a block (or a copy) that the append does not need"
    )
    refused(pool, lambda: pool.append_tokens(0, 1), OutOfBlocksError, "append_tokens")
    check_invariants(pool)


@pytest.mark.points(1)
@pytest.mark.parametrize("num_new_tokens, num_needed", [(3, 2), (7, 3)])
def test_an_append_that_copies_and_grows_needs_both_blocks(impl, device, num_new_tokens,
                                                           num_needed):
    """A forked sequence appending past its shared partial last block needs the copy *and*
    every new block: with one block fewer free it is refused (OutOfBlocksError naming
    append_tokens, nothing changed); with exactly enough free it succeeds and takes them all."""
    pool = new_pool(impl, device, num_blocks=2 + num_needed, max_model_len=16)
    pool.add_sequence(0, 6)  # 2 blocks of 4; the last holds 2 tokens
    pool.fork(0, 1)
    pool.add_sequence(2, 1)  # holds one block back: one fewer free than needed
    assert pool.num_free_blocks == num_needed - 1
    refused(pool, lambda: pool.append_tokens(1, num_new_tokens), OutOfBlocksError,
             f"append_tokens.* needs {num_needed}")
    pool.free_sequence(2)
    pool.append_tokens(1, num_new_tokens)
    assert pool.num_free_blocks == 0 and len(pool.get_block_table(1)) == 1 + num_needed, (
        f"appending {num_new_tokens} tokens to a fork of 6 copies its shared last block and "
        f"takes {num_needed - 1} new ones — likely cause: the copy left out of the count"
    )
    check_invariants(pool)


def _write_case(pool, case):
    """Returns (slot_mapping, key, value) for one bad-write case."""
    sm = pool.slot_mapping([0], [3])
    k, v = random_kv(0, 3, pool)
    other = torch.device("meta") if pool.device.type == "cpu" else torch.device("cpu")
    num_slots = pool.num_blocks * pool.block_size
    return {
        "key shape [3, 2, 7]": lambda: (sm, k[..., :7], v),
        "value shape [2, 2, 8]": lambda: (sm, k, v[:2]),
        "key 2-D": lambda: (sm, k.reshape(3, -1), v),
        "key dtype float32": lambda: (sm, k.float(), v),
        "value dtype bfloat16": lambda: (sm, k, v.to(torch.bfloat16)),
        "key on another device": lambda: (sm, k.to(other), v),
        "value on another device": lambda: (sm, k, v.to(other)),
        "key as numpy": lambda: (sm, k.cpu().numpy(), v),
        "slot_mapping float": lambda: (sm.float(), k, v),
        "slot_mapping 2-D": lambda: (sm.view(3, 1), k, v),
        "slot_mapping as list": lambda: (sm.tolist(), k, v),
        "slot_mapping on another device": lambda: (sm.to(other), k, v),
        "slot -1 (a PAD entry)": lambda: (torch.tensor([0, -1, 2], device=pool.device), k, v),
        "slot past the pool": lambda: (torch.tensor([0, 1, num_slots], device=pool.device), k, v),
    }[case]()


WRITE_CASES = {
    "key shape [3, 2, 7]": (ValueError, "key"),
    "value shape [2, 2, 8]": (ValueError, "value"),
    "key 2-D": (ValueError, "key"),
    "key dtype float32": (TypeError, "key"),
    "value dtype bfloat16": (TypeError, "value"),
    "key on another device": (DeviceMismatchError, "key"),
    "value on another device": (DeviceMismatchError, "value"),
    "key as numpy": (TypeError, "key"),
    "slot_mapping float": (TypeError, "slot_mapping"),
    "slot_mapping 2-D": (ValueError, "slot_mapping"),
    "slot_mapping as list": (TypeError, "slot_mapping"),
    "slot_mapping on another device": (DeviceMismatchError, "slot_mapping"),
    "slot -1 (a PAD entry)": (IndexError, "slot"),
    "slot past the pool": (IndexError, "slot"),
}


@pytest.mark.points(2)
@pytest.mark.parametrize("case", list(WRITE_CASES))
def test_write_kv_rejects_bad_tensors_and_slots(impl, device, case):
    """write_kv refuses K/V of the wrong shape (ValueError), dtype (TypeError: no silent cast)
    or device (DeviceMismatchError), a slot_mapping that is not a 1-D int tensor, and any slot
    outside [0, num_blocks × block_size) — a negative slot from a PAD entry would wrap into the
    last block — and leaves the cache bit-identical."""
    pool = new_pool(impl, device, dtype=torch.float16)
    poison(pool)
    pool.add_sequence(0, 3)
    args = _write_case(pool, case)
    error, name = WRITE_CASES[case]
    refused(pool, lambda: pool.write_kv(*args), error, name)


@pytest.mark.points(1)
def test_slot_mapping_rejects_bad_batches(impl, device):
    """slot_mapping refuses mismatched lengths (either list longer), a repeated sequence, more new tokens than the
    sequence holds, and new tokens that would land in a block shared after a fork (ValueError);
    zero new tokens of a fork land nowhere and are accepted."""
    pool = new_pool(impl, device)
    pool.add_sequence(0, 5)
    pool.add_sequence(1, 6)
    pool.fork(1, 2)
    refused(pool, lambda: pool.slot_mapping([0, 1], [1]), ValueError, "num_new_tokens")
    # and the other way round: zip() would silently drop the extra count
    refused(pool, lambda: pool.slot_mapping([0], [1, 1]), ValueError, "num_new_tokens")
    refused(pool, lambda: pool.slot_mapping([0, 0], [1, 1]), ValueError, "repeats")
    refused(pool, lambda: pool.slot_mapping([0], [6]), ValueError, "num_new_tokens")
    refused(pool, lambda: pool.slot_mapping([0], [-1]), ValueError, "num_new_tokens")
    refused(pool, lambda: pool.slot_mapping([2], [1]), ValueError, "shared")
    assert pool.slot_mapping([0], [0]).numel() == 0
    # zero new tokens land nowhere, so a fork whose last block is shared and partial is fine
    assert pool.slot_mapping([1, 2], [0, 0]).numel() == 0
    assert np.array_equal(pool.slot_mapping([0], [1]).cpu().numpy(), [4])


@pytest.mark.points(2)
def test_write_kv_guards_memory_whatever_the_slots(impl, device):
    """write_kv guards memory even for a hand-made slot_mapping: a slot listed twice, a slot in a
    free block, a slot in a block shared after a fork, and K or V that shares memory with the
    caches each raise ValueError before anything is written (the cache stays bit-identical);
    a private block's slots are accepted."""
    pool = new_pool(impl, device, dtype=torch.float16)  # block_size 4
    poison(pool)
    pool.add_sequence(0, 3)  # block 0, private
    pool.add_sequence(1, 6)  # blocks 1, 2
    pool.fork(1, 2)  # blocks 1 and 2 now shared
    k, v = random_kv(0, 3, pool)
    private = torch.tensor([0, 1, 2], device=pool.device)
    pool.write_kv(private, k, v)
    free_block = next(b for b in range(pool.num_blocks)
                      if pool.block_manager.get_ref_count(b) == 0)
    bs = pool.block_size
    cases = {
        "a slot listed twice": (torch.tensor([0, 1, 1], device=pool.device), k, v, "twice"),
        "a slot in a free block": (torch.tensor([0, 1, free_block * bs], device=pool.device),
                                   k, v, "free"),
        "a slot in a fork-shared block": (torch.tensor([0, 1, 2 * bs + 2], device=pool.device),
                                          k, v, "shared"),
        "value aliasing value_cache": (private, k, pool.value_cache[0, :, :3].transpose(0, 1),
                                       "value"),
        "key aliasing key_cache": (private, pool.key_cache[0, :, :3].transpose(0, 1), v, "key"),
    }
    for what, (slots, key, value, name) in cases.items():
        before = snapshot(pool)
        try:
            pool.write_kv(slots, key, value)
        except ValueError as exc:
            assert name in str(exc), f"write_kv with {what}: the ValueError must say {name!r}: {exc}"
        else:
            pytest.fail(f"write_kv accepted {what}: check every slot (distinct, in a block with "
                        f"ref_count 1) and that K/V do not alias the caches, before writing")
        assert snapshot(pool) == before, (
            f"write_kv with {what} raised but changed the pool: check everything, then write")
    check_invariants(pool)


@pytest.mark.points(1)
def test_list_arguments_and_block_managers_are_type_checked(impl, device):
    """slot_mapping refuses non-lists and non-integer ids with TypeError naming ``seq_ids``,
    ``seq_ids[i]`` or ``num_new_tokens`` (an unhashable id included), and the pool refuses a
    block manager without Lab 1's interface with TypeError naming ``block_manager``."""
    pool = new_pool(impl, device)
    pool.add_sequence(0, 5)
    refused(pool, lambda: pool.slot_mapping(None, [1]), TypeError, "seq_ids")
    refused(pool, lambda: pool.slot_mapping("0", [1]), TypeError, "seq_ids")
    refused(pool, lambda: pool.slot_mapping([0], None), TypeError, "num_new_tokens")
    refused(pool, lambda: pool.slot_mapping([[0]], [1]), TypeError, r"seq_ids\[0\]")
    refused(pool, lambda: pool.slot_mapping([0, 1.0], [1, 1]), TypeError, r"seq_ids\[1\]")
    assert pool.slot_mapping([np.int64(0)], [np.int32(2)]).tolist() == [3, 4]
    with pytest.raises(TypeError, match="block_manager"):
        new_pool(impl, device, num_blocks=6, block_manager=object())
