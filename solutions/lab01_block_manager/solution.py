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
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Sequence

from reference.checks import (
    check_block_hash,
    check_index,
    check_int,
    check_int_list,
    check_sequence,
)
from reference.errors import BlockNotAllocatedError, DoubleFreeError, OutOfBlocksError


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
    parent = None if parent_block_hash is None else check_block_hash("parent_block_hash",
                                                                      parent_block_hash)
    tokens = check_int_list("token_ids", token_ids)  # NumPy/torch ints become Python ints here
    payload = f"{parent}|{','.join(map(str, tokens))}".encode()
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "little")


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
    tokens = check_int_list("token_ids", token_ids)
    block_size = check_int("block_size", block_size, min_value=1)
    hashes: list[int] = []
    parent = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, tokens[start : start + block_size])
        hashes.append(parent)
    return hashes


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
        blocks = check_sequence("blocks", blocks)
        seen: set[int] = set()
        for i, block in enumerate(blocks):
            _check_block(f"blocks[{i}]", block)
            if id(block) in seen or block.prev_free is not None or block.next_free is not None:
                raise ValueError(f"blocks[{i}] (block {block.block_id}) is listed twice or "
                                 f"already queued")
            seen.add(id(block))
        # Sentinels remove every "is this the first/last node?" branch from the hot paths.
        self._head = KVCacheBlock(block_id=-1)
        self._tail = KVCacheBlock(block_id=-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        # NOTE: a block's links say *that* it is queued, not *where*: removing another queue's
        # block would relink that queue's nodes and miscount both. This set answers "is it in
        # this queue?" in O(1) (blocks hash by identity: the dataclass has eq=False).
        self._members: set[KVCacheBlock] = set()
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free_blocks

    def popleft(self) -> KVCacheBlock:
        """Removes and returns the head (least recently freed) block.

        Returns:
            The block that was at the head.

        Raises:
            IndexError: the queue is empty.
        """
        first = self._head.next_free
        if first is self._tail:
            raise IndexError("popleft from an empty FreeBlockQueue")
        self.remove(first)
        return first

    def remove(self, block: KVCacheBlock) -> None:
        """Unlinks ``block`` from wherever it is in the queue, in O(1).

        Args:
            block: a block currently in the queue.

        Raises:
            TypeError: ``block`` is not a KVCacheBlock.
            ValueError: the block is not in this queue.
        """
        _check_block("block", block)
        if block not in self._members:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        self._members.remove(block)
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Adds ``block`` at the tail (most recently freed).

        Args:
            block: a block not currently in the queue.

        Raises:
            TypeError: ``block`` is not a KVCacheBlock.
            ValueError: the block is already queued (here or in another queue).
        """
        _check_block("block", block)
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        self._members.add(block)
        last = self._tail.prev_free
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def block_ids(self) -> list[int]:
        """Returns the queued block ids, head first (O(n); for tests and pictures)."""
        ids = []
        node = self._head.next_free
        while node is not self._tail:
            ids.append(node.block_id)
            node = node.next_free
        return ids


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
        self.num_blocks = check_int("num_blocks", num_blocks, min_value=1)
        self.blocks = [KVCacheBlock(block_id=i) for i in range(self.num_blocks)]
        # A fresh manager hands out 0, 1, 2, ... because the queue starts in id order.
        self.free_block_queue = FreeBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[int, KVCacheBlock] = {}
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- queries

    @property
    def num_free_blocks(self) -> int:
        """Number of blocks with ref_count 0 (cached-but-free blocks included)."""
        with self._lock:
            return self.free_block_queue.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Number of blocks (free or in use) registered under a content hash."""
        with self._lock:
            return len(self.cached_block_hash_to_block)

    def get_ref_count(self, block_id: int) -> int:
        """Returns how many sequences use ``block_id`` (0 when free).

        Args:
            block_id: a physical block id.

        Raises:
            TypeError / IndexError: ``block_id`` is not a valid id.
        """
        with self._lock:
            return self._block(block_id).ref_count

    # ------------------------------------------------------------- allocation

    def allocate(self) -> int:
        """Takes the least recently freed block, evicting its cached content if it had any.

        Returns:
            The block id, now with ref_count 1.

        Raises:
            OutOfBlocksError: every block is in use.
        """
        with self._lock:
            if self.free_block_queue.num_free_blocks == 0:
                raise OutOfBlocksError(f"allocate(): all {self.num_blocks} blocks are in use")
            return self._allocate_one()

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
        n = check_int("n", n, min_value=0)
        with self._lock:
            # Check first, then take: a failure half-way would leak the blocks already taken.
            free = self.free_block_queue.num_free_blocks
            if n > free:
                raise OutOfBlocksError(f"allocate_n(n={n}): only {free} blocks are free")
            return [self._allocate_one() for _ in range(n)]

    def _allocate_one(self) -> int:
        block = self.free_block_queue.popleft()
        self._evict(block)
        block.ref_count = 1
        return block.block_id

    def _evict(self, block: KVCacheBlock) -> None:
        """Forgets a block's cached content (it is about to be overwritten)."""
        if block.block_hash is not None:
            if self.cached_block_hash_to_block.get(block.block_hash) is block:
                del self.cached_block_hash_to_block[block.block_hash]
            block.block_hash = None

    # --------------------------------------------------------- ref counting

    def free(self, block_id: int) -> None:
        """Drops one reference; at zero the block joins the tail of the free queue.

        A freed block keeps its hash: it stays reusable by a cache hit until it is evicted.

        Args:
            block_id: a block in use.

        Raises:
            TypeError / IndexError: ``block_id`` is not a valid id.
            DoubleFreeError: the block is already free.
        """
        with self._lock:
            block = self._block(block_id)
            if block.ref_count == 0:
                raise DoubleFreeError(f"free(block_id={block.block_id}): block is already free")
            self._decref(block)

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
        block_ids = check_sequence("block_ids", block_ids)
        with self._lock:
            blocks = [self._block(b, f"block_ids[{i}]") for i, b in enumerate(block_ids)]
            drops: dict[int, int] = {}
            for block in blocks:
                drops[block.block_id] = drops.get(block.block_id, 0) + 1
            for block_id, count in drops.items():
                if count > self.blocks[block_id].ref_count:
                    raise DoubleFreeError(
                        f"free_blocks(): block_id={block_id} listed {count} times but its "
                        f"ref_count is {self.blocks[block_id].ref_count}"
                    )
            for block in reversed(blocks):
                self._decref(block)

    def _decref(self, block: KVCacheBlock) -> None:
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_block_queue.append(block)

    def increase_ref_count(self, block_id: int) -> None:
        """Adds a reference to a block in use (another sequence now shares it).

        Args:
            block_id: a block in use.

        Raises:
            TypeError / IndexError: ``block_id`` is not a valid id.
            BlockNotAllocatedError: the block is free; sharing it would resurrect garbage.
        """
        with self._lock:
            block = self._block(block_id)
            if block.ref_count == 0:
                raise BlockNotAllocatedError(
                    f"increase_ref_count(block_id={block.block_id}): block is free"
                )
            block.ref_count += 1

    # ------------------------------------------------------- prefix caching

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
        block_hash = check_block_hash("block_hash", block_hash)
        with self._lock:
            block = self._block(block_id)
            if block.ref_count == 0:
                raise BlockNotAllocatedError(f"cache_block(block_id={block.block_id}): block is free")
            if block.block_hash is not None:
                if block.block_hash != block_hash:
                    raise ValueError(
                        f"cache_block(block_id={block.block_id}): already cached under hash "
                        f"{block.block_hash}, got block_hash={block_hash}"
                    )
                return True
            if block_hash in self.cached_block_hash_to_block:
                return False
            block.block_hash = block_hash
            self.cached_block_hash_to_block[block_hash] = block
            return True

    def get_cached_block(self, block_hash: int) -> int | None:
        """Looks a hash up; on a hit, takes a reference to the cached block (reviving it if free).

        Args:
            block_hash: a chained block hash.

        Returns:
            The block id (its ref_count went up by one), or None on a miss.

        Raises:
            TypeError / ValueError: ``block_hash`` is not an int in ``[0, 2**64)``.
        """
        block_hash = check_block_hash("block_hash", block_hash)
        with self._lock:
            return self._touch(block_hash)

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
        hashes = [check_block_hash(f"block_hashes[{i}]", h)
                  for i, h in enumerate(check_sequence("block_hashes", block_hashes))]
        with self._lock:
            hits = []
            for h in hashes:
                block_id = self._touch(h)
                if block_id is None:
                    break
                hits.append(block_id)
            return hits

    def _touch(self, block_hash: int) -> int | None:
        block = self.cached_block_hash_to_block.get(block_hash)
        if block is None:
            return None
        if block.ref_count == 0:
            # Revive: it must leave the free queue, or allocate() could hand it out again.
            self.free_block_queue.remove(block)
        block.ref_count += 1
        return block.block_id

    # ------------------------------------------------------------ helpers

    def _block(self, block_id: object, name: str = "block_id") -> KVCacheBlock:
        return self.blocks[check_index(name, block_id, self.num_blocks)]


def _check_block(name: str, block: object) -> None:
    if not isinstance(block, KVCacheBlock):
        raise TypeError(f"{name} must be a KVCacheBlock, got {type(block).__name__}")
