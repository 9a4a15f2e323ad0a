"""Lab 2's given code (plumbing given to you, not lab content): the host shadow of a sequence,
the argument checks, and ``KVCachePoolBase`` — the pool's queries and private checks.

``KVCachePool`` in ``starter.py`` subclasses ``KVCachePoolBase`` and adds everything you write:
``__init__``, the life cycle (add / append / free / fork), slots and K/V, copy-on-write. The
reference solution subclasses the very same base, so the two differ only in the TODOs; like the
tests, this file is protected (grading reports an edit).

What is here, and what you call it for:

* ``_Sequence`` — the host record of one live sequence (``row``, ``block_ids``, ``num_tokens``):
  create one per admitted or forked sequence and keep it in ``self._seqs``.
* Module-level checks, each raising a typed error that names the argument: ``_check_seq_id``
  (an int id), ``_check_dtype`` (one of ``SUPPORTED_DTYPES``), ``_check_device`` (a usable torch
  device), ``_check_block_manager`` (Lab 1's interface and exactly ``num_blocks`` free blocks),
  ``_check_tensor`` (a tensor on the pool's device).
* ``KVCachePoolBase`` — the queries (``num_free_blocks``, ``num_free_rows``, ``seq_ids``, ``in``,
  ``get_row``, ``get_block_table``, ``get_context_len``) and the checks your methods call before
  they change anything (``_get``, ``_check_length``, ``_check_free_row``, ``_check_free_blocks``,
  ``_check_private_tail``, ``_check_slot_mapping``, ``_check_not_aliased``,
  ``_check_slots_private``), plus ``_last_block_is_shared_and_partial`` (does the next token need
  a copy-on-write?) and ``_write_row`` (host list into the device table).

NOTE: every check reads only the host shadow (``self._seqs``, the block manager's ref counts) —
never a device tensor — so none of them waits for the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.checks import check_int
from reference.errors import (
    DeviceMismatchError,
    OutOfBlocksError,
    SequenceTooLongError,
    TooManySequencesError,
    UnknownSequenceError,
)

#: Cache dtypes the pool accepts (the kernels of Labs 4–5 handle these three).
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: What the pool calls on its block manager (Lab 1's interface).
_BLOCK_MANAGER_API = ("allocate_n", "free", "free_blocks", "increase_ref_count", "get_ref_count",
                      "num_free_blocks", "num_blocks")


@dataclass
class _Sequence:
    """Host shadow of one live sequence (the source of truth for every decision)."""

    row: int  # its row in block_tables / context_lens
    block_ids: list[int]  # physical blocks in logical order
    num_tokens: int  # tokens with a slot (== context_lens[row])


class KVCachePoolBase:
    """The given half of ``KVCachePool``: queries and the checks its methods run first.

    It has no constructor: the subclass's ``__init__`` (your ``TODO(lab2.1)``) sets every
    attribute below, and the methods here only read them.

    Attributes:
        num_blocks, block_size, num_kv_heads, head_size, max_num_seqs, max_model_len, dtype:
            the sizes the pool was built with, under the constructor's argument names.
        max_blocks_per_seq: ``ceil(max_model_len / block_size)`` — the table's width.
        key_cache, value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [max_num_seqs, max_blocks_per_seq] int32, PAD_BLOCK_ID where unused
        context_lens: [max_num_seqs] int32, 0 where unused
        device: the concrete device of every tensor above (e.g. ``cuda:0``).
        block_manager: hands out block ids and counts references (Lab 1's interface).
        _seqs: live sequence id -> its ``_Sequence``, in the order added or forked.
        _free_rows: a heap (``heapq``) of the rows no sequence holds: the lowest comes first.
    """

    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    max_num_seqs: int
    max_model_len: int
    max_blocks_per_seq: int
    dtype: torch.dtype
    device: torch.device
    key_cache: torch.Tensor  # [num_blocks, num_kv_heads, block_size, head_size]
    value_cache: torch.Tensor  # [num_blocks, num_kv_heads, block_size, head_size]
    block_tables: torch.Tensor  # [max_num_seqs, max_blocks_per_seq]
    context_lens: torch.Tensor  # [max_num_seqs]
    _seqs: dict[int, _Sequence]
    _free_rows: list[int]

    # ---------------------------------------------------------------- queries

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds.

        Returns:
            The block manager's ``num_free_blocks``.
        """
        return self.block_manager.num_free_blocks

    @property
    def num_free_rows(self) -> int:
        """Block-table rows no sequence holds (``max_num_seqs`` minus live sequences).

        Returns:
            How many more sequences can be added or forked.
        """
        return len(self._free_rows)

    @property
    def seq_ids(self) -> list[int]:
        """Live sequence ids, in the order they were added or forked.

        Returns:
            A fresh list: editing it does not edit the pool.
        """
        return list(self._seqs)

    def __contains__(self, seq_id: object) -> bool:
        """Says whether ``seq_id`` is live (``seq_id in pool``); never raises.

        Args:
            seq_id: anything; a non-integer is simply not live.

        Returns:
            True when a live sequence has ``seq_id``.
        """
        try:
            return seq_id in self._seqs
        except TypeError:  # unhashable: certainly not a live id
            return False

    def get_row(self, seq_id: int) -> int:
        """Returns the ``block_tables`` / ``context_lens`` row of a live sequence.

        Args:
            seq_id: a live sequence.

        Returns:
            Its row index in ``[0, max_num_seqs)``.

        Raises:
            UnknownSequenceError: no live sequence has ``seq_id``.
        """
        return self._get(seq_id).row

    def get_block_table(self, seq_id: int) -> list[int]:
        """Returns a copy of a live sequence's physical block ids, in logical order.

        Args:
            seq_id: a live sequence.

        Returns:
            A fresh list of ``ceil(context_len / block_size)`` block ids (no padding).

        Raises:
            UnknownSequenceError: no live sequence has ``seq_id``.
        """
        return list(self._get(seq_id).block_ids)

    def get_context_len(self, seq_id: int) -> int:
        """Returns how many tokens a live sequence holds slots for.

        Args:
            seq_id: a live sequence.

        Returns:
            Its ``context_lens`` entry, read from the host shadow.

        Raises:
            UnknownSequenceError: no live sequence has ``seq_id``.
        """
        return self._get(seq_id).num_tokens

    # ----------------------------------------------------- copy-on-write

    def _last_block_is_shared_and_partial(self, seq: _Sequence) -> bool:
        """True when the next token would land in a block other sequences also hold."""
        if seq.num_tokens % self.block_size == 0:
            return False  # the last block is full (or absent): the next token opens a new one
        return self.block_manager.get_ref_count(seq.block_ids[-1]) > 1

    # ------------------------------------------------------------ checks

    def _get(self, seq_id: object, name: str = "seq_id") -> _Sequence:
        """Returns the record of a live sequence.

        Raises:
            TypeError: ``seq_id`` is not an int (the message names ``name``).
            UnknownSequenceError: no live sequence has it.
        """
        seq = self._seqs.get(_check_seq_id(name, seq_id))
        if seq is None:
            raise UnknownSequenceError(f"{name}={seq_id} is not a live sequence")
        return seq

    def _check_length(self, op: str, seq_id: int, num_tokens: int) -> None:
        """Refuses (SequenceTooLongError) a sequence of more than ``max_model_len`` tokens."""
        if num_tokens > self.max_model_len:
            raise SequenceTooLongError(
                f"{op}(seq_id={seq_id}): {num_tokens} tokens > max_model_len={self.max_model_len} "
                f"(max_blocks_per_seq={self.max_blocks_per_seq} × block_size={self.block_size})"
            )

    def _check_free_row(self, op: str, seq_id: int) -> None:
        """Refuses (TooManySequencesError) a new sequence when every row is in use."""
        if not self._free_rows:
            raise TooManySequencesError(
                f"{op}(seq_id={seq_id}): all max_num_seqs={self.max_num_seqs} rows are in use"
            )

    def _check_free_blocks(self, call: str, num_needed: int) -> None:
        """Refuses (OutOfBlocksError) a call needing more blocks than are free — before any is
        taken, so a refusal leaks nothing."""
        free = self.block_manager.num_free_blocks
        if num_needed > free:
            raise OutOfBlocksError(f"{call} needs {num_needed} blocks, only {free} are free")

    def _check_private_tail(self, seq_id: int, seq: _Sequence, num_new: int) -> None:
        """Refuses (ValueError "shared") new tokens that would land in a block another sequence
        holds — any of the blocks the last ``num_new`` tokens reach, not just the last one."""
        if num_new == 0:
            return
        first = (seq.num_tokens - num_new) // self.block_size
        last = (seq.num_tokens - 1) // self.block_size
        for block_id in seq.block_ids[first : last + 1]:
            refs = self.block_manager.get_ref_count(block_id)
            if refs > 1:
                raise ValueError(
                    f"seq_id={seq_id}: its last {num_new} tokens would be written into block "
                    f"{block_id}, shared by {refs} sequences; only tokens reserved by "
                    f"add_sequence/append_tokens (which copy a shared block first) may be written"
                )

    def _check_slot_mapping(self, slot_mapping: object) -> int:
        """Checks that ``slot_mapping`` is a 1-D int32/int64 tensor on the pool's device.

        Returns:
            Its length, ``num_tokens``.

        Raises:
            TypeError / DeviceMismatchError / ValueError: as ``write_kv`` documents.
        """
        _check_tensor("slot_mapping", slot_mapping, self.device)
        if slot_mapping.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
        if slot_mapping.dim() != 1:
            raise ValueError(f"slot_mapping must be 1-D [num_tokens], got shape "
                             f"{list(slot_mapping.shape)}")
        return slot_mapping.shape[0]

    def _check_not_aliased(self, name: str, t: torch.Tensor) -> None:
        """Refuses new K/V that shares memory with a cache: writing one cache would change it."""
        for cache_name, cache in (("key_cache", self.key_cache), ("value_cache", self.value_cache)):
            if t.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr():
                raise ValueError(f"{name} shares memory with the pool's {cache_name}; pass a copy "
                                 f"(.clone()) — the write would change it half-way")

    def _check_slots_private(self, slots: list[int]) -> None:
        """Refuses a slot listed twice, and slots in a block that is free or shared.

        Args:
            slots: in-range slots, on the host.  # [num_tokens]
        """
        if len(set(slots)) != len(slots):
            seen: set[int] = set()
            dup = next(s for s in slots if s in seen or seen.add(s))
            raise ValueError(f"slot_mapping lists slot {dup} twice: two tokens would race for "
                             f"one slot, and which one lands is undefined")
        for block_id in sorted({s // self.block_size for s in slots}):
            refs = self.block_manager.get_ref_count(block_id)
            if refs != 1:
                state = "free" if refs == 0 else f"shared by {refs} sequences"
                raise ValueError(
                    f"slot_mapping has a slot in block {block_id}, which is {state}: write_kv "
                    f"writes only into blocks one sequence holds (use slot_mapping(), after "
                    f"add_sequence/append_tokens, which copy a shared block first)")

    # ------------------------------------------------------------ writes

    def _write_row(self, row: int, start: int, block_ids: list[int]) -> None:
        """Writes ``block_ids`` into ``block_tables[row, start:]`` (host to device, no sync)."""
        if block_ids:
            values = torch.tensor(block_ids, dtype=torch.int32, device=self.device)
            self.block_tables[row, start : start + len(block_ids)] = values


def _check_seq_id(name: str, seq_id: object) -> int:
    """Returns ``seq_id`` as a Python int (any int is a valid id; TypeError naming ``name``)."""
    return check_int(name, seq_id)


def _check_dtype(dtype: object) -> torch.dtype:
    """Returns ``dtype`` if it is one of ``SUPPORTED_DTYPES`` (else TypeError naming ``dtype``)."""
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype must be one of {[str(d) for d in SUPPORTED_DTYPES]}, got {dtype!r}")
    return dtype


def _check_device(device: object) -> torch.device:
    """Returns ``device`` as a ``torch.device`` that can hold a tensor here.

    Raises:
        ValueError: not a device, or not usable on this machine (``cuda`` without a GPU); the
            message names ``device``.
    """
    try:
        device = torch.device(device)
        torch.empty(0, device=device)  # is it usable here? (cuda without a GPU is not)
    except (RuntimeError, TypeError, AssertionError) as exc:
        raise ValueError(f"device={device!r} is not a usable torch device: {exc}") from None
    return device


def _check_block_manager(block_manager: object, num_blocks: int) -> None:
    """Refuses a block manager without Lab 1's interface, or not managing ``num_blocks`` free
    blocks.

    Raises:
        TypeError: a method or property of Lab 1's interface is missing (named in the message).
        ValueError: it manages another number of blocks, or some are already taken.
    """
    missing = [a for a in _BLOCK_MANAGER_API if not hasattr(block_manager, a)]
    if missing:
        raise TypeError(f"block_manager must have Lab 1's interface; "
                        f"{type(block_manager).__name__} lacks {missing}")
    if (block_manager.num_blocks != num_blocks
            or block_manager.num_free_blocks != num_blocks):
        raise ValueError(
            f"block_manager must manage exactly num_blocks={num_blocks} blocks, all free; got "
            f"num_blocks={block_manager.num_blocks}, "
            f"num_free_blocks={block_manager.num_free_blocks}"
        )


def _check_tensor(name: str, t: object, device: torch.device) -> None:
    """Refuses (TypeError) a non-tensor and (DeviceMismatchError) a tensor off ``device``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != device:
        raise DeviceMismatchError(f"{name} is on {t.device}, the pool is on {device}")
