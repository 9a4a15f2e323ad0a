"""Error types shared by the labs, so tests, starters and solutions name the same classes.

Every error names the argument at fault and what was expected; an operation that raises one of
these leaves the object it was called on unchanged.
"""

from __future__ import annotations


class OutOfBlocksError(MemoryError):
    """No free physical block is left for the request (nothing was allocated)."""


class BlockNotAllocatedError(ValueError):
    """The operation needs an allocated block (ref_count > 0), and this block is free."""


class DoubleFreeError(BlockNotAllocatedError):
    """``free`` of a block whose ref_count is already 0."""
