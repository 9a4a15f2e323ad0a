"""Lab 1 — the block manager: ref-counted physical KV blocks, with vLLM-style prefix caching.

The manager never touches K/V data (that is Lab 2's pool). It only decides which physical block
ids are free, how many sequences share each block, and which freed blocks still hold reusable
content (prefix caching).

Invariants, true after every public call (the tests check them):
  * every block is either in the free queue (ref_count == 0) or in use (ref_count > 0);
  * num_free_blocks + (blocks in use) == num_blocks;
  * ``cached_block_hash_to_block[h].block_hash == h`` for every entry, and every block with a
    hash is the entry for that hash;
  * a failed call (any exception) changed nothing.

Your tasks are marked ``TODO(lab1.k)``; ``LAB_IMPL=starter pagedlab grade`` lists the ones left.
"""

from __future__ import annotations

import hashlib  # noqa: F401  (you will want it in lab1.5)
import threading  # noqa: F401  (you will want it in lab1.1)
from dataclasses import dataclass, field
from typing import Sequence

from reference.checks import (  # noqa: F401  (typed argument checks)
    check_block_hash,
    check_index,
    check_int,
    check_int_list,
    check_sequence,
)
from reference.errors import BlockNotAllocatedError, DoubleFreeError, OutOfBlocksError  # noqa: F401


@dataclass(eq=False)
class KVCacheBlock:
    """Bookkeeping for one physical block.

    Attributes:
        block_id: index of the physical block in the KV pool, ``0 <= block_id < num_blocks``.
        ref_count: how many sequences use the block; 0 means it sits in the free queue.
        block_hash: chained hash of the block's tokens once it is full and cached, else None.
        prev_free: previous block in the free queue (None when not queued).
        next_free: next block in the free queue (None when not queued).
    """

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    prev_free: KVCacheBlock | None = field(default=None, repr=False)
    next_free: KVCacheBlock | None = field(default=None, repr=False)


def hash_block_tokens(parent_block_hash: int | None, token_ids: Sequence[int]) -> int:
    """Hashes one full block of tokens, chained to the hash of the block before it.

    Chaining makes a block's hash identify the whole prefix up to and including the block, so
    the same 16 tokens after a different prefix never match (their K/V differ).

    Args:
        parent_block_hash: hash of the previous block of the sequence, None for the first block.
        token_ids: the block's token ids.

    Returns:
        A non-negative 64-bit integer, identical across processes and runs.

    Raises:
        TypeError: ``parent_block_hash`` is neither None nor an int, ``token_ids`` is not a list
            of ints, or a token is not an int (floats, bools, strings and NumPy floats are
            refused: ``[1.9, 2]``, ``[True, 2]`` and ``"12"`` must never hash like ``[1, 2]``).
        ValueError: ``parent_block_hash`` is outside ``[0, 2**64)``.
    """
    # TODO(lab1.5): hash the parent hash and the token ids together with hashlib (Python's
    # hash() of a str changes between processes), and keep 8 bytes of the digest as an int.
    # Check first: the parent with check_block_hash (None allowed), the tokens with
    # check_int_list — a float, bool or string token must raise, never hash like an int.
    raise NotImplementedError("TODO(lab1.5): hash_block_tokens — chained, process-independent hash")


def hash_prompt_blocks(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Returns the chained hashes of a prompt's full blocks.

    Args:
        token_ids: the prompt.  # [num_tokens]
        block_size: tokens per block.

    Returns:
        One hash per full block; a partial last block gets none (its content can still change).

    Raises:
        TypeError / ValueError: ``block_size`` is not an int >= 1, or ``token_ids`` is not a
            list of ints (every token is checked, the partial last block's too).
    """
    # TODO(lab1.5): check token_ids (check_int_list) and block_size, then walk the full blocks,
    # feeding each block's hash in as the next one's parent.
    raise NotImplementedError("TODO(lab1.5): hash_prompt_blocks — one chained hash per full block")


class FreeBlockQueue:
    """Free blocks in a doubly linked list: least recently freed at the head.

    Unlike a ``collections.deque``, a block can leave from the middle in O(1) — which prefix
    caching needs when a cached, freed block is revived by a hash hit.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Builds the queue holding ``blocks`` in the given order.

        Args:
            blocks: blocks to enqueue, head first.

        Raises:
            TypeError: ``blocks`` is not a list of KVCacheBlock.
            ValueError: a block is listed twice or is already in a queue (nothing is linked).
        """
        # TODO(lab1.2): link the blocks through prev_free/next_free. Two sentinel nodes (a fake
        # head and a fake tail) remove the "first/last node?" special cases. Keep a counter
        # self.num_free_blocks.
        # Check every block first (a KVCacheBlock, listed once, not queued anywhere): a bad list
        # must link nothing. Links say *that* a block is queued, not in *which* queue, so keep
        # a set of this queue's blocks for remove() to consult.
        raise NotImplementedError("TODO(lab1.2): FreeBlockQueue.__init__ — link blocks in order")

    def __len__(self) -> int:
        raise NotImplementedError("TODO(lab1.2): FreeBlockQueue.__len__")

    def popleft(self) -> KVCacheBlock:
        """Removes and returns the head (least recently freed) block.

        Returns:
            The block that was at the head.

        Raises:
            IndexError: the queue is empty.
        """
        raise NotImplementedError("TODO(lab1.2): FreeBlockQueue.popleft")

    def remove(self, block: KVCacheBlock) -> None:
        """Unlinks ``block`` from wherever it is in the queue, in O(1).

        Args:
            block: a block currently in the queue.

        Raises:
            TypeError: ``block`` is not a KVCacheBlock.
            ValueError: the block is not in this queue.
        """
        # TODO(lab1.2): refuse a block that is not in *this* queue, then relink its neighbours to
        # each other and clear its links — no scanning.
        raise NotImplementedError("TODO(lab1.2): FreeBlockQueue.remove — O(1) unlink")

    def append(self, block: KVCacheBlock) -> None:
        """Adds ``block`` at the tail (most recently freed).

        Args:
            block: a block not currently in the queue.

        Raises:
            TypeError: ``block`` is not a KVCacheBlock.
            ValueError: the block is already queued (here or in another queue).
        """
        raise NotImplementedError("TODO(lab1.2): FreeBlockQueue.append")

    def block_ids(self) -> list[int]:
        """Returns the queued block ids, head first (O(n); for tests and pictures)."""
        raise NotImplementedError("TODO(lab1.2): FreeBlockQueue.block_ids")


class BlockManager:
    """Hands out physical block ids, counts references, and caches full blocks by hash.

    Thread-safe: every public method holds one lock, so a call is atomic.

    Attributes:
        num_blocks: number of physical blocks.
        blocks: one ``KVCacheBlock`` per block id.
        free_block_queue: the ``FreeBlockQueue`` of free blocks (the tests walk it).
        cached_block_hash_to_block: block hash -> the block caching that content.
    """

    def __init__(self, num_blocks: int) -> None:
        """Creates a manager whose blocks ``0 .. num_blocks - 1`` are all free.

        Args:
            num_blocks: number of physical blocks in the pool.

        Raises:
            TypeError: ``num_blocks`` is not an int.
            ValueError: ``num_blocks <= 0``.
        """
        # TODO(lab1.1): validate num_blocks (check_int), create self.blocks (one KVCacheBlock per
        # id), self.free_block_queue (in id order, so a fresh manager hands out 0, 1, 2, ...),
        # self.cached_block_hash_to_block = {} and one threading.Lock, self._lock, that every
        # public method holds for its whole body (a test holds bm._lock and checks each waits).
        raise NotImplementedError("TODO(lab1.1): BlockManager.__init__ — blocks, free queue, lock")

    @property
    def num_free_blocks(self) -> int:
        """Number of blocks with ref_count 0 (cached-but-free blocks included)."""
        raise NotImplementedError("TODO(lab1.1): BlockManager.num_free_blocks")

    @property
    def num_cached_blocks(self) -> int:
        """Number of blocks (free or in use) registered under a content hash."""
        raise NotImplementedError("TODO(lab1.6): BlockManager.num_cached_blocks")

    def get_ref_count(self, block_id: int) -> int:
        """Returns how many sequences use ``block_id`` (0 when free).

        Args:
            block_id: a physical block id.

        Raises:
            TypeError / IndexError: ``block_id`` is not a valid id.
        """
        raise NotImplementedError("TODO(lab1.1): BlockManager.get_ref_count — validate block_id")

    def allocate(self) -> int:
        """Takes the least recently freed block, evicting its cached content if it had any.

        Returns:
            The block id, now with ref_count 1.

        Raises:
            OutOfBlocksError: every block is in use.
        """
        # TODO(lab1.3): pop the head of the free queue; if it still holds cached content, drop
        # its hash from cached_block_hash_to_block (evict); set ref_count to 1.
        raise NotImplementedError("TODO(lab1.3): BlockManager.allocate — pop head, evict, ref 1")

    def allocate_n(self, n: int) -> list[int]:
        """Allocates ``n`` blocks, all or nothing.

        Args:
            n: number of blocks wanted (0 gives an empty list).

        Returns:
            ``n`` distinct block ids, in allocation order.

        Raises:
            TypeError / ValueError: ``n`` is not an int >= 0.
            OutOfBlocksError: fewer than ``n`` blocks are free; nothing was allocated.
        """
        # TODO(lab1.3): check that n blocks are free *before* taking any.
        raise NotImplementedError("TODO(lab1.3): BlockManager.allocate_n — all or nothing")

    def free(self, block_id: int) -> None:
        """Drops one reference; at zero the block joins the tail of the free queue.

        A freed block keeps its hash: it stays reusable by a cache hit until it is evicted.

        Args:
            block_id: a block in use.

        Raises:
            TypeError / IndexError: ``block_id`` is not a valid id.
            DoubleFreeError: the block is already free.
        """
        # TODO(lab1.4): validate, refuse a double free, decrement, enqueue at the tail at zero.
        raise NotImplementedError("TODO(lab1.4): BlockManager.free — ref counts, double free")

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """Frees a sequence's blocks, all or nothing, tail block first.

        Freeing the tail first puts it nearer the head of the free queue, so the end of a
        prompt is evicted before its (more shareable) beginning.

        Args:
            block_ids: blocks in logical order; a block may appear several times if the
                caller holds several references to it.

        Raises:
            TypeError / IndexError: ``block_ids`` is not a list, or an id is invalid.
            DoubleFreeError: some block would be freed more times than it is referenced.
        """
        # TODO(lab1.4): validate every id and count repeats first; then free in reverse order.
        raise NotImplementedError("TODO(lab1.4): BlockManager.free_blocks — validate all, then free")

    def increase_ref_count(self, block_id: int) -> None:
        """Adds a reference to a block in use (another sequence now shares it).

        Args:
            block_id: a block in use.

        Raises:
            TypeError / IndexError: ``block_id`` is not a valid id.
            BlockNotAllocatedError: the block is free; sharing it would resurrect garbage.
        """
        raise NotImplementedError("TODO(lab1.4): BlockManager.increase_ref_count")

    def cache_block(self, block_id: int, block_hash: int) -> bool:
        """Registers a full block in use under its content hash, so later prompts can reuse it.

        Args:
            block_id: a block in use whose tokens are final.
            block_hash: the block's chained hash (:func:`hash_block_tokens`).

        Returns:
            True if the block is now the cache entry for ``block_hash``; False if another block
            already holds that content (the first one stays the entry, this one is not cached).
            The refusals below come first: a free block, or one cached under a different hash,
            raises even when another block holds ``block_hash``.

        Raises:
            TypeError / IndexError: bad ``block_id``; TypeError / ValueError: ``block_hash`` is
                not an int in ``[0, 2**64)``.
            BlockNotAllocatedError: the block is free.
            ValueError: the block is already cached under a different hash.
        """
        # TODO(lab1.6): set block.block_hash and the map entry; mind the refusals above (a bad
        # argument, a free block, another hash) and the False case (another block has the hash).
        raise NotImplementedError("TODO(lab1.6): BlockManager.cache_block — register by hash")

    def get_cached_block(self, block_hash: int) -> int | None:
        """Looks a hash up; on a hit, takes a reference to the cached block (reviving it if free).

        Args:
            block_hash: a chained block hash.

        Returns:
            The block id (its ref_count went up by one), or None on a miss.

        Raises:
            TypeError / ValueError: ``block_hash`` is not an int in ``[0, 2**64)``.
        """
        # TODO(lab1.6): a hit on a free block must take it out of the free queue (O(1) remove).
        raise NotImplementedError("TODO(lab1.6): BlockManager.get_cached_block — revive on hit")

    def get_computed_blocks(self, block_hashes: Sequence[int]) -> list[int]:
        """Returns the longest cached prefix of a prompt, taking a reference to each block.

        Args:
            block_hashes: the prompt's chained block hashes (:func:`hash_prompt_blocks`).

        Returns:
            Block ids of the cached prefix; stops at the first miss, since a later block's hash
            includes the missing one.

        Raises:
            TypeError / ValueError: ``block_hashes`` is not a list of ints in ``[0, 2**64)``;
                the message names the bad entry (``block_hashes[i]``).
        """
        raise NotImplementedError("TODO(lab1.6): BlockManager.get_computed_blocks — longest prefix")
