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
    block_size = check_int("block_size", block_size, min_value=1)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, min_value=1)
    head_size = check_int("head_size", head_size, min_value=1)
    _check_dtype(dtype)
    return 2 * block_size * num_kv_heads * head_size * dtype.itemsize


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
    budget_bytes = check_int("budget_bytes", budget_bytes, min_value=0)
    per_block = kv_cache_bytes_per_block(block_size, num_kv_heads, head_size, dtype)
    num_blocks = budget_bytes // per_block
    if num_blocks < 1:
        raise ValueError(
            f"budget_bytes={budget_bytes} holds no block: one block of {block_size} tokens × "
            f"{num_kv_heads} heads × {head_size} × {dtype} takes {per_block} bytes (K and V)"
        )
    return num_blocks


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
    logical_block_idx = positions // block_size
    block_ids = block_tables[seq_rows, logical_block_idx].to(torch.int64)
    offsets = positions % block_size
    return block_ids * block_size + offsets


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
    block_size = key_cache.shape[2]
    block_ids = slot_mapping // block_size
    offsets = slot_mapping % block_size
    # NOTE: two index tensors split by a slice: torch (like NumPy) puts the indexed dimension
    # first, so key_cache[block_ids, :, offsets] is [num_tokens, num_kv_heads, head_size] —
    # exactly key's shape. One index_put_ per cache, no Python loop over tokens.
    key_cache[block_ids, :, offsets] = key
    value_cache[block_ids, :, offsets] = value


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
        self.num_blocks = check_int("num_blocks", num_blocks, min_value=1)
        self.block_size = check_int("block_size", block_size, min_value=1)
        self.num_kv_heads = check_int("num_kv_heads", num_kv_heads, min_value=1)
        self.head_size = check_int("head_size", head_size, min_value=1)
        self.max_num_seqs = check_int("max_num_seqs", max_num_seqs, min_value=1)
        self.max_model_len = check_int("max_model_len", max_model_len, min_value=1)
        self.dtype = _check_dtype(dtype)
        device = _check_device(device)
        if block_manager is not None:
            _check_block_manager(block_manager, self.num_blocks)
        # The seed used num_blocks here: a table as wide as the whole pool, for every row.
        # The width a sequence can ever need is set by the longest sequence allowed.
        self.max_blocks_per_seq = num_blocks_for(self.max_model_len, self.block_size)

        shape = (self.num_blocks, self.num_kv_heads, self.block_size, self.head_size)
        try:
            # NOTE: empty, not zeros: like a real engine, never pay to clear memory that every
            # reader reaches only through a block table and context_lens.
            self.key_cache = torch.empty(shape, dtype=self.dtype, device=device)
            self.value_cache = torch.empty(shape, dtype=self.dtype, device=device)
            # PAD (-1), never 0: 0 is a real block, so a kernel reading a padded entry would
            # silently attend to another sequence's tokens.
            self.block_tables = torch.full((self.max_num_seqs, self.max_blocks_per_seq),
                                           PAD_BLOCK_ID, dtype=torch.int32, device=device)
            self.context_lens = torch.zeros(self.max_num_seqs, dtype=torch.int32, device=device)
        except (RuntimeError, TypeError) as exc:  # torch: out of memory; a size past int64
            raise ValueError(
                f"a pool of num_blocks={self.num_blocks} × block_size={self.block_size} × "
                f"num_kv_heads={self.num_kv_heads} × head_size={self.head_size} with a "
                f"max_num_seqs={self.max_num_seqs} × {self.max_blocks_per_seq} block table "
                f"(max_model_len={self.max_model_len}) cannot be allocated on {device}: {exc}"
            ) from None
        self.device = self.key_cache.device  # concrete: "cuda" becomes "cuda:0"
        # Built after the tensors: a pool too large for memory fails above, cheaply.
        self.block_manager = (TrustedBlockAllocator(self.num_blocks) if block_manager is None
                              else block_manager)
        self._seqs: dict[int, _Sequence] = {}
        self._free_rows = list(range(self.max_num_seqs))  # a heap: the lowest free row first

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
        num_blocks = num_blocks_from_budget(budget_bytes, block_size, num_kv_heads, head_size,
                                            dtype)
        return cls(num_blocks, block_size, num_kv_heads, head_size, max_num_seqs=max_num_seqs,
                   max_model_len=max_model_len, dtype=dtype, device=device)

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
        seq_id = _check_seq_id("seq_id", seq_id)
        num_tokens = check_int("num_prompt_tokens", num_prompt_tokens, min_value=0)
        if seq_id in self._seqs:
            raise DuplicateSequenceError(f"add_sequence(seq_id={seq_id}): seq_id is already live")
        self._check_length("add_sequence", seq_id, num_tokens)
        self._check_free_row("add_sequence", seq_id)
        num_needed = num_blocks_for(num_tokens, self.block_size)
        self._check_free_blocks(f"add_sequence(seq_id={seq_id}, num_prompt_tokens={num_tokens})",
                                num_needed)
        block_ids = self.block_manager.allocate_n(num_needed)
        row = heapq.heappop(self._free_rows)
        self._seqs[seq_id] = _Sequence(row, block_ids, num_tokens)
        self._write_row(row, 0, block_ids)
        self.context_lens[row] = num_tokens
        return list(block_ids)

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
        seq = self._get(seq_id)
        num_new = check_int("num_new_tokens", num_new_tokens, min_value=0)
        new_len = seq.num_tokens + num_new
        self._check_length("append_tokens", seq_id, new_len)
        cow = num_new > 0 and self._last_block_is_shared_and_partial(seq)
        num_blocks_needed = num_blocks_for(new_len, self.block_size)
        num_new_blocks = num_blocks_needed - len(seq.block_ids)
        self._check_free_blocks(f"append_tokens(seq_id={seq_id}, num_new_tokens={num_new})",
                                num_new_blocks + int(cow))
        new_ids = self.block_manager.allocate_n(num_new_blocks + int(cow))
        if cow:
            self._copy_on_write(seq, new_ids.pop(0))
        self._write_row(seq.row, len(seq.block_ids), new_ids)
        seq.block_ids.extend(new_ids)
        seq.num_tokens = new_len
        self.context_lens[seq.row] = new_len

    def free_sequence(self, seq_id: int) -> None:
        """Drops a sequence: its block references go back to the manager, its row is cleared.

        Args:
            seq_id: a live sequence.

        Raises:
            UnknownSequenceError: ``seq_id`` is not live.
        """
        seq = self._get(seq_id)
        self.block_manager.free_blocks(seq.block_ids)
        del self._seqs[seq_id]
        # Clear the row: a stale row would let a kernel (or a later bug) read blocks that now
        # belong to somebody else.
        self.block_tables[seq.row] = PAD_BLOCK_ID
        self.context_lens[seq.row] = 0
        heapq.heappush(self._free_rows, seq.row)

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
        parent = self._get(parent_seq_id, "parent_seq_id")
        child_seq_id = _check_seq_id("child_seq_id", child_seq_id)
        if child_seq_id in self._seqs:
            raise DuplicateSequenceError(
                f"fork(child_seq_id={child_seq_id}): seq_id is already live")
        self._check_free_row("fork", child_seq_id)
        for block_id in parent.block_ids:
            self.block_manager.increase_ref_count(block_id)
        row = heapq.heappop(self._free_rows)
        self._seqs[child_seq_id] = _Sequence(row, list(parent.block_ids), parent.num_tokens)
        self.block_tables[row] = self.block_tables[parent.row]  # device to device, no sync
        self.context_lens[row] = parent.num_tokens

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
        seq_ids = [_check_seq_id(f"seq_ids[{i}]", s)
                   for i, s in enumerate(check_sequence("seq_ids", seq_ids))]
        counts = check_sequence("num_new_tokens", num_new_tokens)
        if len(seq_ids) != len(counts):
            raise ValueError(f"seq_ids has {len(seq_ids)} entries but num_new_tokens has "
                             f"{len(counts)}")
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"seq_ids repeats a sequence: {seq_ids}")
        rows, shifts, total = [], [], 0
        for i, (seq_id, n) in enumerate(zip(seq_ids, counts)):
            seq = self._get(seq_id)
            n = counts[i] = check_int(f"num_new_tokens[{i}]", n, min_value=0)
            if n > seq.num_tokens:
                raise ValueError(f"num_new_tokens[{i}]={n} but seq_id={seq_id} holds only "
                                 f"{seq.num_tokens} tokens")
            self._check_private_tail(seq_id, seq, n)
            rows.append(seq.row)
            # token j of the batch sits at position j + (start of its sequence's new tokens
            # - index of its first token in the batch)
            shifts.append(seq.num_tokens - n - total)
            total += n
        if total == 0:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        counts_t = torch.tensor(counts, dtype=torch.int64, device=self.device)
        batch_idx = torch.repeat_interleave(
            torch.arange(len(counts), device=self.device), counts_t, output_size=total
        )  # [num_tokens]: which sequence each token belongs to; output_size avoids a sync
        shift_t = torch.tensor(shifts, dtype=torch.int64, device=self.device)
        row_t = torch.tensor(rows, dtype=torch.int64, device=self.device)
        positions = torch.arange(total, device=self.device) + shift_t[batch_idx]
        return compute_slot_mapping(self.block_tables, row_t[batch_idx], positions, self.block_size)

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
        num_tokens = self._check_slot_mapping(slot_mapping)
        want = (num_tokens, self.num_kv_heads, self.head_size)
        for name, t in (("key", key), ("value", value)):
            _check_tensor(name, t, self.device)
            if t.dtype != self.dtype:
                raise TypeError(f"{name} must have the pool's dtype {self.dtype}, got {t.dtype} "
                                f"(no silent cast: convert it yourself)")
            if tuple(t.shape) != want:
                raise ValueError(f"{name} must have shape [num_tokens, num_kv_heads, head_size] = "
                                 f"{list(want)}, got {list(t.shape)}")
            self._check_not_aliased(name, t)
        # NOTE: one device-to-host copy of the slots (a sync on CUDA). An engine trusts its own
        # slot mapping and skips this; a workbook refuses a slot that would wrap around (a
        # negative index silently writes into the *last* blocks of the pool) or land in a
        # block this write does not own.
        slots = slot_mapping.tolist()
        num_slots = self.num_blocks * self.block_size
        bad = next((s for s in slots if not 0 <= s < num_slots), None)
        if bad is not None:
            raise IndexError(f"slot_mapping holds slot {bad}, outside [0, {num_slots}) "
                             f"(num_blocks × block_size); a negative slot comes from a "
                             f"PAD_BLOCK_ID entry of the block table")
        self._check_slots_private(slots)
        slot_mapping = slot_mapping.to(torch.int64)
        reshape_and_cache(key, value, self.key_cache, self.value_cache, slot_mapping)

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
        seq = self._get(seq_id)
        num_blocks = len(seq.block_ids)
        block_ids = self.block_tables[seq.row, :num_blocks].to(torch.int64)
        out = []
        for cache in (self.key_cache, self.value_cache):
            pages = cache[block_ids]  # [num_blocks, num_kv_heads, block_size, head_size]
            # tokens are the block's *third* axis: bring them next to the block axis first.
            tokens = pages.transpose(1, 2).reshape(num_blocks * self.block_size,
                                                   self.num_kv_heads, self.head_size)
            out.append(tokens[: seq.num_tokens])
        return out[0], out[1]

    # ----------------------------------------------------- copy-on-write

    def _copy_on_write(self, seq: _Sequence, new_block_id: int) -> None:
        """Replaces ``seq``'s shared last block by a private copy in ``new_block_id``.

        Args:
            seq: the sequence about to write into its last block.
            new_block_id: a freshly allocated block (ref_count 1).
        """
        old_block_id = seq.block_ids[-1]
        self.key_cache[new_block_id] = self.key_cache[old_block_id]
        self.value_cache[new_block_id] = self.value_cache[old_block_id]
        seq.block_ids[-1] = new_block_id
        self.block_tables[seq.row, len(seq.block_ids) - 1] = new_block_id
        self.block_manager.free(old_block_id)  # drops our reference; the others keep it
