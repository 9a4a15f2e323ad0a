"""Argument checks for the Lab 3 attention functions (plumbing given to you, not lab content).

Both the starter and the solution import these, so every implementation reports bad input the
same way: a ``TypeError``/``ValueError``/``IndexError`` that names the argument, says what was
expected, and is raised before anything is computed. The host-side wrappers of the CUDA kernels
in Labs 4–5 check the same things, because a kernel handed a bad block table does not raise — it
reads whatever memory the bad index points at.

NOTE: the block-table check matters more in NumPy than it seems. ``PAD_BLOCK_ID`` is -1, and
``key_cache[-1]`` is *the last physical block*, not an error. A sequence whose ``context_len``
claims more blocks than its table row holds would silently attend over another sequence's keys.

The array, block-table and offset checks live in ``reference/checks.py`` (the trusted oracle
uses them too) and are re-exported here; the checks of attention *states* are Lab 3's own.
"""

from __future__ import annotations

import numpy as np

from reference.checks import (
    as_array,
    check_alibi_slopes,
    check_block_tables,
    check_cu_seqlens,
    check_dense_inputs,
    check_float_array,
    check_head_size,
    check_heads,
    check_int,
    check_int_array,
    check_int_list,
    check_kv_cache,
)
from reference.checks import check_scale as _check_scale

__all__ = [  # most checks live in reference/checks.py, shared with the trusted oracle
    "check_float_array", "check_int_array", "check_scale", "check_kv_cache", "check_heads",
    "check_head_size", "check_alibi_slopes", "check_block_tables", "check_cu_seqlens",
    "check_dense_inputs", "check_state", "check_block_scores", "check_partitions",
    "check_out_lse", "check_lead_shape", "check_float_dtype", "check_values_array", "check_int",
]


def check_scale(scale: object, dtype=np.float64) -> float:
    """Checks that ``scale`` is a real number, finite and > 0 in ``dtype``; returns it as a float.

    ``dtype=np.float32`` for code that multiplies in float32, as the kernels do: ``1e39`` is inf
    there and ``1e-50`` is 0, so both are refused (ValueError naming ``scale``).
    """
    return _check_scale(scale, name="scale", dtype=dtype)


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
