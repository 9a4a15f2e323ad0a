"""What Lab 4's launchers accept (plumbing given to you, not lab content).

Both ``starter.py`` and the solution import this file, so every implementation describes a batch
and converts its arguments the same way; like the tests, it is protected (grading reports an
edit). The checks themselves are yours to order in ``check_decode_args``: they use these helpers
and the shared ones in ``reference/checks.py`` (``check_array``, ``check_scale``,
``check_on_cuda``, ``debug_enabled``), which Lab 5 uses too.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference import cuda as rcuda

#: What the kernels have code for (anything else is an UnsupportedConfigError before launch).
SUPPORTED_HEAD_SIZES = (64, 128, 256)
SUPPORTED_BLOCK_SIZES = (8, 16, 32)
SUPPORTED_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class DecodeShape:
    """Sizes of one decode batch, read off the input shapes (no device memory is read).

    Attributes:
        num_seqs: sequences (one query token each).
        num_q_heads: query heads.
        num_kv_heads: KV heads; ``num_q_heads`` is a multiple of it.
        head_size: elements per head vector.
        num_blocks: physical blocks in the cache.
        block_size: tokens per block.
        max_blocks_per_seq: block-table width.
        dtype: ``"float16"`` or ``"bfloat16"``.
        scale: the softmax scale actually used.
    """

    num_seqs: int
    num_q_heads: int
    num_kv_heads: int
    head_size: int
    num_blocks: int
    block_size: int
    max_blocks_per_seq: int
    dtype: str
    scale: float

    @property
    def group(self) -> int:
        """Query heads per KV head (1: multi-head attention)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def table_tokens(self) -> int:
        """Tokens a block-table row can address: ``max_blocks_per_seq * block_size``."""
        return self.max_blocks_per_seq * self.block_size


def as_tensor(name: str, x):
    """Returns a torch view of a torch tensor or CuPy array (no copy).

    Args:
        name: the argument's name, used in the message.
        x: what the caller passed.

    Returns:
        A torch tensor sharing ``x``'s memory.

    Raises:
        TypeError: ``x`` is neither, naming ``name``.
    """
    try:
        return rcuda.as_torch(x)
    except TypeError:
        raise TypeError(f"{name} must be a torch tensor or a CuPy array, got {type(x).__name__}") from None
