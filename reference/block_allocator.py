"""A small, trusted block allocator with Lab 1's interface, for labs graded on their own.

Lab 2's pool needs somebody to hand out block ids and count references. It must not import the
student's Lab 1 (an unfinished Lab 1 would then fail Lab 2's tests), so by default it uses this
allocator instead. It speaks the subset of Lab 1's ``BlockManager`` interface that Lab 2 calls —
``allocate``, ``allocate_n``, ``free``, ``free_blocks``, ``increase_ref_count``,
``get_ref_count``, ``num_free_blocks``, ``num_blocks`` — so a finished Lab 1 manager plugs in
unchanged (the Lab 2 notebook does exactly that).

It is deliberately plain: a NumPy array of reference counts and a FIFO of free ids. No prefix
caching, no lock. Order is deterministic and matches Lab 1 without caching: a fresh allocator
hands out ``0, 1, 2, ...``; a freed block joins the back of the queue; ``free_blocks`` releases a
sequence's blocks last one first.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

from reference.checks import check_index, check_int, check_sequence
from reference.errors import BlockNotAllocatedError, DoubleFreeError, OutOfBlocksError


class TrustedBlockAllocator:
    """Reference-counted block ids ``0 .. num_blocks - 1``; every call is all or nothing."""

    def __init__(self, num_blocks: int) -> None:
        """Creates an allocator whose blocks are all free.

        Args:
            num_blocks: number of physical blocks.

        Raises:
            TypeError / ValueError: ``num_blocks`` is not an int >= 1, or too large to track.
        """
        self.num_blocks = check_int("num_blocks", num_blocks, min_value=1)
        try:
            self._ref_counts = np.zeros(self.num_blocks, dtype=np.int64)  # [num_blocks]
        except (MemoryError, ValueError):
            raise ValueError(f"num_blocks={self.num_blocks} is too many to track in memory") \
                from None
        self._free_ids: deque[int] = deque(range(self.num_blocks))

    @property
    def num_free_blocks(self) -> int:
        """Number of blocks with ref_count 0."""
        return len(self._free_ids)

    def get_ref_count(self, block_id: int) -> int:
        """Returns how many holders share ``block_id`` (0 when free).

        Args:
            block_id: a block id.

        Raises:
            TypeError / IndexError: ``block_id`` is not a valid id.
        """
        return int(self._ref_counts[self._check_id(block_id)])

    def allocate(self) -> int:
        """Takes the block at the front of the free queue.

        Returns:
            Its id, now with ref_count 1.

        Raises:
            OutOfBlocksError: no block is free.
        """
        if not self._free_ids:
            raise OutOfBlocksError(f"allocate(): all {self.num_blocks} blocks are in use")
        block_id = self._free_ids.popleft()
        self._ref_counts[block_id] = 1
        return block_id

    def allocate_n(self, n: int) -> list[int]:
        """Takes ``n`` blocks, or none.

        Args:
            n: how many blocks (0 is allowed).

        Returns:
            ``n`` distinct ids in allocation order.

        Raises:
            TypeError / ValueError: ``n`` is not an int >= 0.
            OutOfBlocksError: fewer than ``n`` blocks are free (nothing was taken).
        """
        n = check_int("n", n, min_value=0)
        if n > len(self._free_ids):
            raise OutOfBlocksError(f"allocate_n(n={n}): only {len(self._free_ids)} blocks are free")
        return [self.allocate() for _ in range(n)]

    def free(self, block_id: int) -> None:
        """Drops one reference; the last one returns the block to the back of the queue.

        Args:
            block_id: a block in use.

        Raises:
            TypeError / IndexError: ``block_id`` is not a valid id.
            DoubleFreeError: the block is already free.
        """
        block_id = self._check_id(block_id)
        if self._ref_counts[block_id] == 0:
            raise DoubleFreeError(f"free(block_id={block_id}): block is already free")
        self._drop(block_id)

    def free_blocks(self, block_ids: Sequence[int]) -> None:
        """Drops one reference per listed id, all or nothing, last id first.

        Args:
            block_ids: ids in logical order; an id may repeat if it is held several times.

        Raises:
            TypeError / IndexError: ``block_ids`` is not a list, or an id is invalid.
            DoubleFreeError: an id is listed more times than it is referenced (nothing freed).
        """
        ids = [check_index(f"block_ids[{i}]", b, self.num_blocks)
               for i, b in enumerate(check_sequence("block_ids", block_ids))]
        wanted = np.bincount(np.asarray(ids, dtype=np.int64), minlength=self.num_blocks)
        over = np.flatnonzero(wanted > self._ref_counts)
        if over.size:
            b = int(over[0])
            raise DoubleFreeError(
                f"free_blocks(): block {b} listed {int(wanted[b])} times but its ref_count is "
                f"{int(self._ref_counts[b])}"
            )
        for block_id in reversed(ids):
            self._drop(block_id)

    def increase_ref_count(self, block_id: int) -> None:
        """Adds a holder to a block in use.

        Args:
            block_id: a block in use.

        Raises:
            TypeError / IndexError: ``block_id`` is not a valid id.
            BlockNotAllocatedError: the block is free.
        """
        block_id = self._check_id(block_id)
        if self._ref_counts[block_id] == 0:
            raise BlockNotAllocatedError(f"increase_ref_count(block_id={block_id}): block is free")
        self._ref_counts[block_id] += 1

    def _drop(self, block_id: int) -> None:
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] == 0:
            self._free_ids.append(block_id)

    def _check_id(self, block_id: object) -> int:
        return check_index("block_id", block_id, self.num_blocks)
