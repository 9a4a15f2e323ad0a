"""Argument checks for the Lab 3 attention functions (plumbing given to you, not lab content).

Both the starter and the solution import these, so every implementation reports bad input the
same way: a ``TypeError``/``ValueError``/``IndexError`` that names the argument, says what was
expected, and is raised before anything is computed. The host-side wrappers of the CUDA kernels
in Labs 4–5 check the same things, because a kernel handed a bad block table does not raise — it
reads whatever memory the bad index points at.

NOTE: the block-table check matters more in NumPy than it seems. ``PAD_BLOCK_ID`` is -1, and
``key_cache[-1]`` is *the last physical block*, not an error. A sequence whose ``context_len``
claims more blocks than its table row holds would silently attend over another sequence's keys.
"""

from __future__ import annotations

import numbers

import numpy as np

from reference.layout import PAD_BLOCK_ID, num_blocks_for


def check_float_array(name: str, value: object, ndim: int, shape_doc: str) -> np.ndarray:
    """Checks that ``value`` is a floating-point NumPy array with ``ndim`` dimensions.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.
        ndim: required number of dimensions.
        shape_doc: the expected shape in words, e.g. ``"[num_seqs, num_q_heads, head_size]"``.

    Returns:
        ``value`` unchanged.

    Raises:
        TypeError: not a NumPy array of floats.
        ValueError: wrong number of dimensions.
    """
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        got = type(value).__name__
        if isinstance(value, np.ndarray):
            got += f" of {value.dtype}"
        raise TypeError(f"{name} must be a floating-point numpy array {shape_doc}, got {got}")
    if value.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {shape_doc}, got shape {value.shape}")
    return value


def check_int_array(name: str, value: object, ndim: int, shape_doc: str) -> np.ndarray:
    """Checks that ``value`` is an integer array (lists of ints are accepted) with ``ndim`` dims.

    Returns:
        ``value`` as an int64 NumPy array.

    Raises:
        TypeError: not integers (floats and bools are refused).
        ValueError: wrong number of dimensions.
    """
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise TypeError(f"{name} must hold integers {shape_doc}, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {shape_doc}, got shape {arr.shape}")
    return arr.astype(np.int64)


def check_scale(scale: object) -> float:
    """Checks that ``scale`` is a finite positive real number and returns it as a float."""
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float, got {type(scale).__name__} {scale!r}")
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be finite and > 0, got {scale}")
    return float(scale)


def check_kv_cache(key_cache: object, value_cache: object) -> tuple[int, int, int, int]:
    """Checks the paged caches and returns ``(num_blocks, num_kv_heads, block_size, head_size)``.

    Args:
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]

    Raises:
        TypeError / ValueError: not 4-D float arrays of the same shape.
    """
    doc = "[num_blocks, num_kv_heads, block_size, head_size]"
    check_float_array("key_cache", key_cache, 4, doc)
    check_float_array("value_cache", value_cache, 4, doc)
    if key_cache.shape != value_cache.shape:
        raise ValueError(f"value_cache shape {value_cache.shape} != key_cache shape "
                         f"{key_cache.shape}")
    return tuple(int(d) for d in key_cache.shape)  # type: ignore[return-value]


def check_heads(num_q_heads: int, num_kv_heads: int) -> int:
    """Checks the GQA head counts and returns the group size ``num_q_heads // num_kv_heads``.

    Raises:
        ValueError: ``num_q_heads`` is not a positive multiple of ``num_kv_heads``.
    """
    if num_kv_heads <= 0 or num_q_heads <= 0 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads={num_q_heads} must be a positive multiple of num_kv_heads={num_kv_heads} "
            f"(GQA: each KV head serves num_q_heads // num_kv_heads query heads)"
        )
    return num_q_heads // num_kv_heads


def check_head_size(name: str, head_size: int, cache_head_size: int) -> None:
    """Raises ValueError when an array's head_size differs from the cache's."""
    if head_size != cache_head_size:
        raise ValueError(f"{name} has head_size {head_size} but the KV cache has {cache_head_size}")


def check_alibi_slopes(alibi_slopes: object, num_q_heads: int) -> np.ndarray | None:
    """Checks optional ALiBi slopes: None, or ``[num_q_heads]`` finite floats.

    Returns:
        The slopes as float64, or None.
    """
    if alibi_slopes is None:
        return None
    arr = np.asarray(alibi_slopes)
    if arr.dtype.kind != "f" or arr.shape != (num_q_heads,) or not np.isfinite(arr).all():
        raise ValueError(
            f"alibi_slopes must be None or {num_q_heads} finite floats [num_q_heads], "
            f"got dtype {arr.dtype} shape {arr.shape}"
        )
    return arr.astype(np.float64)


def check_block_tables(block_tables: object, context_lens: object, num_blocks: int,
                       block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Checks block tables against the context lengths they must cover.

    Args:
        block_tables: [num_seqs, max_blocks_per_seq] int, padded with PAD_BLOCK_ID.
        context_lens: [num_seqs] int >= 0.
        num_blocks: physical blocks in the cache.
        block_size: tokens per block.

    Returns:
        ``(block_tables, context_lens)`` as int64 arrays.

    Raises:
        TypeError: not integer arrays.
        ValueError: shapes disagree, a length is negative, or a row is too short.
        IndexError: an entry a sequence needs is not a physical block id (PAD_BLOCK_ID included).
    """
    tables = check_int_array("block_tables", block_tables, 2, "[num_seqs, max_blocks_per_seq]")
    lens = check_int_array("context_lens", context_lens, 1, "[num_seqs]")
    if lens.shape[0] != tables.shape[0]:
        raise ValueError(f"context_lens has {lens.shape[0]} entries but block_tables has "
                         f"{tables.shape[0]} rows (one per sequence)")
    if (lens < 0).any():
        s = int(np.argmax(lens < 0))
        raise ValueError(f"context_lens[{s}]={int(lens[s])} is negative")
    capacity = tables.shape[1] * block_size
    if (lens > capacity).any():
        s = int(np.argmax(lens > capacity))
        needs = num_blocks_for(int(lens[s]), block_size)
        raise ValueError(f"context_lens[{s}]={int(lens[s])} needs {needs} blocks but block_tables "
                         f"rows hold {tables.shape[1]}")
    needed = -(-lens // block_size)  # [num_seqs]
    in_use = np.arange(tables.shape[1])[None, :] < needed[:, None]
    bad = in_use & ((tables < 0) | (tables >= num_blocks))
    if bad.any():
        s, j = (int(x) for x in np.argwhere(bad)[0])
        what = " (PAD_BLOCK_ID)" if tables[s, j] == PAD_BLOCK_ID else ""
        raise IndexError(
            f"block_tables[{s}, {j}]={int(tables[s, j])}{what} is not a block id in "
            f"[0, {num_blocks}), but sequence {s} with context_len={int(lens[s])} needs logical "
            f"block {j}"
        )
    return tables, lens


def check_cu_seqlens(cu_seqlens_q: object, num_seqs: int, total_tokens: int,
                     context_lens: np.ndarray) -> np.ndarray:
    """Checks varlen query offsets against the packed query and the context lengths.

    Args:
        cu_seqlens_q: [num_seqs + 1] int, starts at 0, non-decreasing, ends at total_tokens.
        num_seqs: sequences in the batch.
        total_tokens: rows of the packed query.
        context_lens: [num_seqs] keys per sequence (history + new tokens).

    Returns:
        ``cu_seqlens_q`` as int64.

    Raises:
        ValueError: bad offsets, or a sequence with more query tokens than keys.
    """
    cu = check_int_array("cu_seqlens_q", cu_seqlens_q, 1, "[num_seqs + 1]")
    if cu.shape[0] != num_seqs + 1:
        raise ValueError(f"cu_seqlens_q must have num_seqs + 1 = {num_seqs + 1} entries, "
                         f"got {cu.shape[0]}")
    if cu[0] != 0 or cu[-1] != total_tokens or (np.diff(cu) < 0).any():
        raise ValueError(f"cu_seqlens_q must start at 0, never decrease and end at the query's "
                         f"{total_tokens} tokens, got {cu.tolist()}")
    q_lens = np.diff(cu)
    if (q_lens > context_lens).any():
        s = int(np.argmax(q_lens > context_lens))
        raise ValueError(f"sequence {s} has {int(q_lens[s])} query tokens but context_lens[{s}]="
                         f"{int(context_lens[s])}: the new tokens' K/V must already be cached")
    return cu
