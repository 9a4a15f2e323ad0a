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

import numpy as np

from reference.checks import as_array, check_float_array, check_int, check_int_array, check_int_list
from reference.checks import check_scale as _check_scale
from reference.layout import PAD_BLOCK_ID, num_blocks_for

__all__ = [  # the float/int array checks live in reference/checks.py, shared with the oracle
    "check_float_array", "check_int_array", "check_scale", "check_kv_cache", "check_heads",
    "check_head_size", "check_alibi_slopes", "check_block_tables", "check_cu_seqlens",
    "check_dense_inputs", "check_state", "check_block_scores", "check_partitions",
    "check_out_lse", "check_lead_shape", "check_float_dtype", "check_values_array",
]


def check_scale(scale: object, dtype=np.float64) -> float:
    """Checks that ``scale`` is a real number, finite and > 0 in ``dtype``; returns it as a float.

    ``dtype=np.float32`` for code that multiplies in float32, as the kernels do: ``1e39`` is inf
    there and ``1e-50`` is 0, so both are refused (ValueError naming ``scale``).
    """
    return _check_scale(scale, name="scale", dtype=dtype)


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
    if 0 in key_cache.shape[1:]:
        # NOTE: a block_size of 0 would divide by zero later; 0 heads or head_size is no cache.
        raise ValueError(f"key_cache {doc} needs num_kv_heads, block_size and head_size >= 1, "
                         f"got shape {key_cache.shape}")
    return tuple(int(d) for d in key_cache.shape)  # type: ignore[return-value]


def check_heads(num_q_heads: int, num_kv_heads: int) -> int:
    """Checks the GQA head counts and returns the group size ``num_q_heads // num_kv_heads``.

    Raises:
        TypeError: a count is not an int.
        ValueError: ``num_q_heads`` is not a positive multiple of ``num_kv_heads``.
    """
    num_q_heads = check_int("num_q_heads", num_q_heads)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads)
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


def check_alibi_slopes(alibi_slopes: object, num_q_heads: int,
                       dtype=np.float64) -> np.ndarray | None:
    """Checks optional ALiBi slopes: None, or ``[num_q_heads]`` floats, finite in ``dtype``.

    Args:
        alibi_slopes: what the caller passed.
        num_q_heads: query heads.
        dtype: the float type the slopes are used in (float32 for kernel-like code: a slope of
            1e39 is inf there).

    Returns:
        The slopes as ``dtype``, or None.

    Raises:
        TypeError: not an array of floats.
        ValueError: wrong shape, or a slope that is not finite in ``dtype``.
    """
    if alibi_slopes is None:
        return None
    arr = as_array("alibi_slopes", alibi_slopes)
    if arr.dtype.kind != "f":
        raise TypeError(f"alibi_slopes must be None or floats [num_q_heads], got dtype {arr.dtype}")
    with np.errstate(over="ignore"):
        cast = arr.astype(dtype)
    if arr.shape != (num_q_heads,) or not np.isfinite(cast).all():
        raise ValueError(
            f"alibi_slopes must be None or {num_q_heads} floats [num_q_heads], finite as "
            f"{np.dtype(dtype).name}; got dtype {arr.dtype} shape {arr.shape}"
        )
    return cast


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


def check_dense_inputs(q: object, k: object, v: object, causal: object):
    """Checks :func:`dense_attention`'s arrays and returns them as float64.

    Args:
        q: [q_len, num_q_heads, head_size] floats.
        k: [kv_len, num_kv_heads, head_size] floats.
        v: [kv_len, num_kv_heads, head_size] floats.
        causal: a bool.

    Returns:
        (q, k, v) as float64 arrays.

    Raises:
        TypeError: not float arrays (lists of floats are fine), or ``causal`` is not a bool.
        ValueError: wrong dimensions, k and v of different shapes, or head sizes that differ.
    """
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    out = []
    for name, x, doc in (("q", q, "[q_len, num_q_heads, head_size]"),
                         ("k", k, "[kv_len, num_kv_heads, head_size]"),
                         ("v", v, "[kv_len, num_kv_heads, head_size]")):
        arr = as_array(name, x)
        out.append(check_float_array(name, arr, 3, doc).astype(np.float64))
    q, k, v = out
    if k.shape != v.shape:
        raise ValueError(f"v shape {v.shape} != k shape {k.shape}")
    check_head_size("q", q.shape[2], k.shape[2])
    return q, k, v


def check_float_dtype(dtype: object, name: str = "dtype") -> np.dtype:
    """Checks that ``dtype`` names a NumPy float type (float16/32/64) and returns it."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.kind != "f":
        raise TypeError(f"{name} must be a numpy float dtype, got {dtype!r}")
    return dt


def check_lead_shape(lead_shape: object) -> tuple[int, ...]:
    """Checks a shape: a sequence of ints >= 0 (``()`` for a scalar state)."""
    return tuple(check_int_list("lead_shape", lead_shape, min_value=0))


def check_state(m: object, l: object, acc: object) -> None:
    """Checks an attention state ``(m, l, acc)``: float arrays ``[...]``, ``[...]``,
    ``[..., head_size]``.

    Raises:
        TypeError: not float NumPy arrays.
        ValueError: shapes that do not fit together.
    """
    for name, x in (("m", m), ("l", l), ("acc", acc)):
        # NOTE: NumPy turns 0-d results into scalars (np.float64), so those count as arrays.
        if not isinstance(x, (np.ndarray, np.floating)) or x.dtype.kind != "f":
            raise TypeError(f"{name} must be a float numpy array, got {type(x).__name__}")
    if l.shape != m.shape or acc.shape[:-1] != m.shape or acc.ndim != m.ndim + 1:
        raise ValueError(f"a state is m [...], l [...], acc [..., head_size]; got m {m.shape}, "
                         f"l {l.shape}, acc {acc.shape}")


def check_block_scores(m: np.ndarray, acc: np.ndarray, scores: object, values: object) -> None:
    """Checks one block for :func:`online_softmax_update`: scores ``[..., n]`` matching the
    state, values ``[..., n, head_size]`` broadcasting against it."""
    for name, x in (("scores", scores), ("values", values)):
        if not isinstance(x, (np.ndarray, np.floating)) or x.dtype.kind != "f":
            raise TypeError(f"{name} must be a float numpy array, got {type(x).__name__}")
    if scores.shape[:-1] != m.shape or scores.ndim != m.ndim + 1:
        raise ValueError(f"scores must be [..., n] with [...] = m's shape {m.shape}, got "
                         f"{scores.shape}")
    n, head_size = scores.shape[-1], acc.shape[-1]
    if values.ndim < 2 or values.shape[-2:] != (n, head_size):
        raise ValueError(f"values must be [..., n={n}, head_size={head_size}], got {values.shape}")
    try:
        np.broadcast_shapes(values.shape[:-2], m.shape)
    except ValueError:
        raise ValueError(f"values' leading shape {values.shape[:-2]} does not broadcast against "
                         f"the state's {m.shape}") from None


def check_partitions(m: object, l: object, acc: object) -> None:
    """Checks partition states for :func:`merge_partitions`: a state with a leading
    ``num_partitions >= 1`` axis."""
    check_state(m, l, acc)
    if m.ndim == 0 or m.shape[0] == 0:
        raise ValueError(f"m must be [num_partitions >= 1, ...], got shape {m.shape}")


def check_out_lse(out_a: object, lse_a: object, out_b: object, lse_b: object):
    """Checks two (out, lse) results for :func:`merge_attn_states`; returns them as float64.

    Raises:
        TypeError: not float arrays.
        ValueError: out is not ``[..., head_size]`` over lse's ``[...]``, or A and B differ.
    """
    arrays = []
    for name, x in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        arr = as_array(name, x)
        if arr.dtype.kind != "f":
            raise TypeError(f"{name} must hold floats, got dtype {arr.dtype}")
        arrays.append(arr.astype(np.float64))
    oa, la, ob, lb = arrays
    if oa.shape[:-1] != la.shape or oa.ndim != la.ndim + 1 or oa.shape != ob.shape \
            or la.shape != lb.shape:
        raise ValueError(f"need out [..., head_size] over lse [...], equal for A and B; got "
                         f"out_a {oa.shape}, lse_a {la.shape}, out_b {ob.shape}, lse_b {lb.shape}")
    return oa, la, ob, lb


def check_values_array(name: str, x: object) -> np.ndarray:
    """Checks an array of real numbers (ints or floats, not bools) and returns it."""
    arr = as_array(name, x)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr
