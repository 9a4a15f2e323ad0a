"""Lab 2 — the KV-cache pool: paged K/V tensors, block tables, and the sequences that use them.

The pool owns the memory Labs 3–5 read: ``key_cache`` and ``value_cache`` in the workbook's one
layout ``[num_blocks, num_kv_heads, block_size, head_size]`` (``reference/layout.py``), a
``block_tables`` row per live sequence, and ``context_lens``. A block manager (Lab 1's
interface) decides which physical blocks are free; the pool decides which blocks each sequence
holds, where each new token's K/V goes (its *slot*), and copies a shared block before anyone
writes into it (copy-on-write).

Invariants, true after every public call (the tests check them):
  * a live sequence with ``n`` tokens holds exactly ``ceil(n / block_size)`` blocks; its row of
    ``block_tables`` lists them in logical order and is padded with ``PAD_BLOCK_ID``;
  * rows of no live sequence are all ``PAD_BLOCK_ID`` with ``context_lens == 0``;
  * every block's ref_count equals the number of live sequences whose table holds it;
  * a partial (not full) block is written only by a sequence that holds it alone;
  * a failed call (any exception) changed nothing.

NOTE: the host keeps a shadow of every table (``_Sequence``) and makes every decision from it.
The device tensors are written, never read back, so no call waits for the GPU — except
``write_kv``'s checks, which read the slots back once (documented there).

Your tasks are marked ``TODO(lab2.k)``; ``LAB_IMPL=starter pagedlab grade 2`` lists the ones left.
What is given lives once in ``_pool.py`` (protected, imported below; read it): the host record
``_Sequence``, the argument checks (``_check_seq_id``, ``_check_dtype``, ``_check_device``,
``_check_block_manager``, ``_check_tensor``) and ``KVCachePoolBase``, which ``KVCachePool``
subclasses — the queries (``num_free_blocks``, ``get_row``, ``get_block_table``, ...) and the
private checks your methods call before they change anything (``_get``, ``_check_length``,
``_check_free_blocks``, ``_check_private_tail``, ``_check_slots_private``, ...).
"""

from __future__ import annotations

import heapq
from typing import Sequence

import torch

from labs.lab02_kv_cache_pool._pool import (  # noqa: F401  (SUPPORTED_DTYPES: re-exported)
    SUPPORTED_DTYPES,
    KVCachePoolBase,
    _check_block_manager,
    _check_device,
    _check_dtype,
    _check_seq_id,
    _check_tensor,
    _Sequence,
)
from reference.block_allocator import TrustedBlockAllocator
from reference.checks import check_int, check_sequence
from reference.errors import DuplicateSequenceError
from reference.layout import PAD_BLOCK_ID, num_blocks_for


def kv_cache_bytes_per_block(block_size: int, num_kv_heads: int, head_size: int,
                             dtype: torch.dtype) -> int:
    """Returns the bytes one block takes in the pool, keys and values together.

    Args:
        block_size: tokens per block.
        num_kv_heads: KV heads.
        head_size: elements per head vector.
        dtype: cache element type.

    Returns:
        ``2 * block_size * num_kv_heads * head_size * dtype.itemsize``.

    Raises:
        TypeError / ValueError: a size is not an int >= 1, or ``dtype`` is not supported.
    """
    # TODO(lab2.1): validate the three sizes (check_int, min 1) and the dtype (_check_dtype), then
    # return the bytes of one block of keys plus one block of values.
    raise NotImplementedError("TODO(lab2.1): kv_cache_bytes_per_block — K+V bytes per block")


def num_blocks_from_budget(budget_bytes: int, block_size: int, num_kv_heads: int,
                           head_size: int, dtype: torch.dtype) -> int:
    """Returns how many whole blocks fit in a memory budget.

    Args:
        budget_bytes: bytes set aside for this layer's K and V.
        block_size: tokens per block.
        num_kv_heads: KV heads.
        head_size: elements per head vector.
        dtype: cache element type.

    Returns:
        ``budget_bytes // kv_cache_bytes_per_block(...)`` (a partial block is of no use).

    Raises:
        TypeError / ValueError: bad arguments, or the budget holds not even one block.
    """
    # TODO(lab2.1): how many *whole* blocks fit? Refuse (ValueError naming budget_bytes) a budget
    # that holds not even one.
    raise NotImplementedError("TODO(lab2.1): num_blocks_from_budget — whole blocks")


def compute_slot_mapping(block_tables: torch.Tensor, seq_rows: torch.Tensor,
                         positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Returns the cache slot of each token: ``block_id * block_size + position % block_size``.

    Vectorized: one gather from the block table and two integer ops, whatever the token count.

    Args:
        block_tables: int32 table, padded with PAD_BLOCK_ID.  # [max_num_seqs, max_blocks_per_seq]
        seq_rows: each token's row in ``block_tables``.  # [num_tokens] int64
        positions: each token's position in its sequence.  # [num_tokens] int64
        block_size: tokens per block.

    Returns:
        int64 slots on ``block_tables.device``.  # [num_tokens]
    """
    # TODO(lab2.4): look every token's physical block up in block_tables (one advanced-indexing
    # gather: rows and logical block indices), then slot = block_id * block_size + offset.
    # No Python loop over tokens.
    raise NotImplementedError("TODO(lab2.4): compute_slot_mapping — vectorized slots")


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatters new tokens' K/V into their slots of the paged cache, in one vectorized write.

    No checks here (``KVCachePool.write_kv`` does them): this is the hot path an engine runs once
    per layer per step.

    Args:
        key: new keys.  # [num_tokens, num_kv_heads, head_size]
        value: new values.  # [num_tokens, num_kv_heads, head_size]
        key_cache: the pool.  # [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: the pool.  # [num_blocks, num_kv_heads, block_size, head_size]
        slot_mapping: distinct slots in ``[0, num_blocks * block_size)``.  # [num_tokens]
    """
    # TODO(lab2.5): split each slot into (block id, offset) and scatter all tokens at once with
    # one indexed assignment per cache. Hint: key_cache[block_ids, :, offsets] has shape
    # [num_tokens, num_kv_heads, head_size] — work out why (two index tensors split by a slice).
    raise NotImplementedError("TODO(lab2.5): reshape_and_cache — one scatter per cache")


class KVCachePool(KVCachePoolBase):
    """One layer's paged KV cache, its block tables, and the life cycle of its sequences.

    Attributes:
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]
        block_tables: [max_num_seqs, max_blocks_per_seq] int32, PAD_BLOCK_ID where unused
        context_lens: [max_num_seqs] int32, 0 where unused
        block_manager: hands out block ids and counts references (Lab 1's interface).
        max_blocks_per_seq: ``ceil(max_model_len / block_size)`` — the table's width.
        device: the concrete device of every tensor above (e.g. ``cuda:0``).

    Given, inherited from ``KVCachePoolBase`` (``labs/lab02_kv_cache_pool/_pool.py``): the
    queries ``num_free_blocks``, ``num_free_rows``, ``seq_ids``, ``seq_id in pool``,
    ``get_row``, ``get_block_table``, ``get_context_len``, and the private checks and helpers
    the methods below call (``_get``, ``_check_length``, ``_check_free_row``,
    ``_check_free_blocks``, ``_check_private_tail``, ``_check_slot_mapping``,
    ``_check_not_aliased``, ``_check_slots_private``, ``_last_block_is_shared_and_partial``,
    ``_write_row``).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        *,
        max_num_seqs: int,
        max_model_len: int,
        dtype: torch.dtype = torch.float16,
        device: str | torch.device = "cpu",
        block_manager=None,
    ) -> None:
        """Allocates the pool, an all-PAD block table and zero context lengths.

        Args:
            num_blocks: physical blocks in the pool.
            block_size: tokens per block.
            num_kv_heads: KV heads.
            head_size: elements per head vector.
            max_num_seqs: rows of ``block_tables``: most sequences live at once.
            max_model_len: most tokens one sequence may hold; sets the table's width.
            dtype: ``torch.float16``, ``torch.bfloat16`` or ``torch.float32``.
            device: where every tensor lives (``"cpu"``, ``"cuda"``, ...).
            block_manager: an object with Lab 1's interface managing exactly ``num_blocks``
                blocks, all free; default: a fresh ``TrustedBlockAllocator(num_blocks)``.

        Raises:
            TypeError / ValueError: a size is not an int >= 1, ``dtype`` is unsupported,
                ``device`` is unknown, or ``block_manager`` does not fit the pool.
            ValueError: the tensors cannot exist (out of memory, a size past int64): torch's
                ``RuntimeError`` or ``TypeError`` becomes a ValueError whose message says
                ``cannot be allocated`` and names every size. Raised before the default block
                manager is built (which would refuse a huge ``num_blocks`` in its own words).
        """
        # TODO(lab2.1): validate every size (check_int, min 1), dtype (_check_dtype), device
        # (_check_device) and a given block_manager (_check_block_manager: Lab 1's interface,
        # exactly num_blocks free blocks). Then set self.max_blocks_per_seq =
        # ceil(max_model_len / block_size) — not num_blocks —, allocate key_cache/value_cache in
        # the workbook layout, block_tables ([max_num_seqs, max_blocks_per_seq] int32, all
        # PAD_BLOCK_ID) and context_lens (int32 zeros) — torch's RuntimeError/TypeError there
        # becomes the Raises' "cannot be allocated" ValueError —, self.device = key_cache.device;
        # only then the block manager (block_manager or a fresh TrustedBlockAllocator(num_blocks)),
        # self._seqs = {} (seq_id -> _Sequence) and self._free_rows (a heap of rows).
        raise NotImplementedError("TODO(lab2.1): KVCachePool.__init__ — pool, PAD tables")

    @classmethod
    def from_memory_budget(
        cls,
        budget_bytes: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        *,
        max_num_seqs: int,
        max_model_len: int,
        dtype: torch.dtype = torch.float16,
        device: str | torch.device = "cpu",
    ) -> KVCachePool:
        """Builds the largest pool that fits ``budget_bytes`` (see :func:`num_blocks_from_budget`).

        Args:
            budget_bytes: bytes for this layer's K and V.
            block_size, num_kv_heads, head_size, max_num_seqs, max_model_len, dtype, device:
                as in the constructor.

        Returns:
            A pool with the default block manager.
        """
        # TODO(lab2.1): num_blocks_from_budget gives the block count; build the pool with cls(...)
        # (a subclass gets a subclass), passing every other argument on unchanged.
        raise NotImplementedError("TODO(lab2.1): KVCachePool.from_memory_budget — blocks, then cls")

    # ------------------------------------------------------------ life cycle

    def add_sequence(self, seq_id: int, num_prompt_tokens: int) -> list[int]:
        """Admits a sequence: a free row and ``ceil(num_prompt_tokens / block_size)`` blocks.

        Args:
            seq_id: any int not already live.
            num_prompt_tokens: tokens of the prompt (0 allowed: no block yet).

        Returns:
            The sequence's block ids.

        Raises:
            TypeError / ValueError: bad ``seq_id`` or ``num_prompt_tokens``.
            DuplicateSequenceError: ``seq_id`` is live.
            SequenceTooLongError: ``num_prompt_tokens > max_model_len``.
            TooManySequencesError: ``max_num_seqs`` sequences are live.
            OutOfBlocksError: too few free blocks (nothing was taken).
        """
        # TODO(lab2.2): check everything first — seq_id (_check_seq_id), num_prompt_tokens (>= 0),
        # duplicate, _check_length, _check_free_row, _check_free_blocks — then allocate_n the blocks,
        # pop the lowest free row, record a _Sequence, write the row (_write_row) and context_lens.
        raise NotImplementedError("TODO(lab2.2): add_sequence — check, then row + blocks")

    def append_tokens(self, seq_id: int, num_new_tokens: int = 1) -> None:
        """Gives ``num_new_tokens`` more tokens a slot, allocating blocks only as needed.

        A new block is taken exactly when a token falls past the end of the last block. If the
        last block is partial *and shared* (after a fork), it is first copied to a private block
        (copy-on-write), so the other sequences holding it never see this one's tokens.

        Args:
            seq_id: a live sequence.
            num_new_tokens: tokens to add (0 is a no-op).

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
            TypeError / ValueError: bad ``num_new_tokens``.
            SequenceTooLongError: the sequence would exceed ``max_model_len``.
            OutOfBlocksError: too few free blocks for the new tokens and the copy (nothing taken).
        """
        # TODO(lab2.3): after the checks, count the blocks the new length needs beyond those held,
        # plus one for a copy if cow = num_new > 0 and self._last_block_is_shared_and_partial(seq).
        # _check_free_blocks for all of them *before* allocate_n takes any; if cow, hand the first
        # new block to self._copy_on_write (lab2.6); then extend the host list, the table row and
        # context_lens.
        raise NotImplementedError("TODO(lab2.3): append_tokens — blocks only when full")

    def free_sequence(self, seq_id: int) -> None:
        """Drops a sequence: its block references go back to the manager, its row is cleared.

        Args:
            seq_id: a live sequence.

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
        """
        # TODO(lab2.2): free_blocks the sequence's blocks through the block manager (ref counts do
        # the sharing), forget the id, reset its row to PAD_BLOCK_ID and its context_len to 0, and
        # push the row back on the free-row heap.
        raise NotImplementedError("TODO(lab2.2): free_sequence — blocks back, row to PAD")

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """Creates ``child_seq_id`` sharing every block of ``parent_seq_id`` (no K/V copied).

        Each shared block's ref_count goes up by one. The first of them to append into a shared
        partial last block copies it first (see :meth:`append_tokens`).

        Args:
            parent_seq_id: a live sequence.
            child_seq_id: an int that is not live.

        Raises:
            UnknownSequenceError: ``parent_seq_id`` is not live.
            TypeError: bad ``parent_seq_id`` or ``child_seq_id`` (not an int).
            DuplicateSequenceError: ``child_seq_id`` is live.
            TooManySequencesError: no free row.
        """
        # TODO(lab2.6): check parent, child id, duplicate and a free row first; then one
        # increase_ref_count per shared block, a new row holding a copy of the parent's row (copy
        # the device row device-to-device) and the parent's context_len. No K/V is copied here.
        raise NotImplementedError("TODO(lab2.6): fork — share blocks by ref count")

    # ------------------------------------------------------ slots and K/V

    def slot_mapping(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int]) -> torch.Tensor:
        """Returns the slots of a batch's new tokens: the last ``num_new_tokens[i]`` tokens of
        each sequence ``seq_ids[i]``, sequences back to back.

        Call it after :meth:`add_sequence` / :meth:`append_tokens` reserved the tokens. The
        result feeds :meth:`write_kv` (and, in an engine, every layer's cache write).

        Args:
            seq_ids: distinct live sequences.  # [batch]
            num_new_tokens: new tokens per sequence, ``0 <= n <= context_len``.  # [batch]

        Returns:
            int64 slots on the pool's device.  # [sum(num_new_tokens)]

        Raises:
            TypeError / ValueError: not lists, mismatched lengths, repeated ids (the message says
                ``repeats``), bad counts (naming ``num_new_tokens``), or new tokens that would land
                in a block another sequence shares (append first: it copies).
            UnknownSequenceError: an id is not live.
        """
        # TODO(lab2.4): validate on the host (check_sequence for both lists, every id with
        # _check_seq_id *before* the distinctness test, equal lengths, distinct live ids,
        # 0 <= n <= context_len, _check_private_tail), collecting each sequence's row and first new
        # position. Then build per-token rows and positions with tensor ops (torch.repeat_interleave
        # with output_size, torch.arange) — no loop over tokens — and call compute_slot_mapping.
        raise NotImplementedError("TODO(lab2.4): slot_mapping — rows and positions")

    def write_kv(self, slot_mapping: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Writes new tokens' K/V into their slots (checked, then :func:`reshape_and_cache`).

        Who guards what: :meth:`slot_mapping` guards *ownership* — each slot belongs to the
        sequence named, was reserved by add/append, and lies in a private block (copy-on-write
        done). ``write_kv`` guards *memory*, whatever slots it is handed: tensors of the right
        kind, no K/V that aliases the caches, every slot in range, no slot twice, and every
        slot's block held by exactly one sequence (ref_count 1) — so no slot mapping, however
        made, writes into a free (possibly prefix-cached) block or a block shared after a fork.
        It cannot tell *which* sequence holds a private block: that is slot_mapping's promise.
        Everything is checked before the first element is written.

        Args:
            slot_mapping: from :meth:`slot_mapping`; int32 or int64.  # [num_tokens]
            key: in the pool's dtype and device.  # [num_tokens, num_kv_heads, head_size]
            value: in the pool's dtype and device.  # [num_tokens, num_kv_heads, head_size]

        Raises:
            TypeError: not a tensor, or the wrong dtype.
            DeviceMismatchError: a tensor is not on the pool's device.
            ValueError: a wrong shape; ``key``/``value`` sharing memory with the caches; a slot
                listed twice; a slot in a block that is free or shared (ref_count != 1).
            IndexError: a slot outside ``[0, num_blocks * block_size)`` (e.g. from a PAD entry).
        """
        # TODO(lab2.5): _check_slot_mapping, then key and value: tensor on the pool's device
        # (_check_tensor), the pool's dtype exactly (TypeError, no cast), shape [num_tokens,
        # num_kv_heads, head_size] (ValueError). Refuse (IndexError) any slot outside
        # [0, num_blocks * block_size) — read the slots back once (.tolist()). Check the rest
        # before writing anything: _check_not_aliased for key and value, _check_slots_private for
        # the slots (no slot twice; only blocks one sequence holds). Then reshape_and_cache.
        raise NotImplementedError("TODO(lab2.5): write_kv — check, then reshape_and_cache")

    def gather_kv(self, seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies a sequence's pages back into contiguous K and V (what Labs 3–5 test against).

        Reads the device block table, as a kernel would.

        Args:
            seq_id: a live sequence.

        Returns:
            (key, value), each ``[context_len, num_kv_heads, head_size]`` in the pool's dtype
            and on its device.

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
        """
        # TODO(lab2.5): index both caches with the sequence's row of the device block_tables, bring
        # the token axis next to the block axis (tokens are the third axis of a block), flatten to
        # [num_blocks * block_size, num_kv_heads, head_size] and keep the first context_len tokens.
        raise NotImplementedError("TODO(lab2.5): gather_kv — pages back to contiguous")

    # ----------------------------------------------------- copy-on-write

    def _copy_on_write(self, seq: _Sequence, new_block_id: int) -> None:
        """Replaces ``seq``'s shared last block by a private copy in ``new_block_id``.

        Args:
            seq: the sequence about to write into its last block.
            new_block_id: a freshly allocated block (ref_count 1).
        """
        # TODO(lab2.6): copy K and V of the old last block into new_block_id, swap it into the host
        # list and the device table row, then free() one reference to the old block.
        raise NotImplementedError("TODO(lab2.6): _copy_on_write — private copy")
