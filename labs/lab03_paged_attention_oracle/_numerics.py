"""Numerics helpers for Lab 3 (given code, not lab content): imported by ``starter.py``.

Two small pieces of floating-point plumbing that are not what the lab teaches but that every
implementation needs in exactly the same form:

* :func:`round_to` — what a kernel sees after loading fp16/bf16 data (Task 5 uses it to round
  the inputs and the output of ``paged_decode_lowp``). NumPy has no bfloat16, so it is built
  here from the float32 bit pattern. It is public: the tests call ``impl.round_to``, which is
  this function, re-exported by your module's import.
* :func:`_data_neg_inf_to_nan` — the first step of every score computation (Tasks 1–3), part of
  the module's NaN/inf contract.

Both the starter and the reference solution import them from here, so they are kept once.
"""

from __future__ import annotations

import numpy as np

from labs.lab03_paged_attention_oracle._checks import check_values_array

#: The storage precisions of Task 5 (``paged_decode_lowp``'s ``dtype``).
LOW_PRECISION_DTYPES = ("float16", "bfloat16")

__all__ = ["LOW_PRECISION_DTYPES", "round_to", "_data_neg_inf_to_nan"]


def _data_neg_inf_to_nan(scores):
    """Returns ``scores`` with every -inf made NaN, *before* any mask is applied.

    NOTE: -inf means "masked key" to the recurrence. A -inf computed from data (an infinite key)
    would be silently dropped like a masked key; as NaN it propagates, as the contract says.

    Args:
        scores: float array of q·k scores, any shape, not yet masked.

    Returns:
        The same scores (a new array) with NaN wherever they were -inf.
    """
    return np.where(np.isneginf(scores), np.nan, scores)


def round_to(x, dtype: str):
    """Rounds to the nearest ``dtype`` value (round-to-nearest-even), returned as float32.

    NumPy has float16 but no bfloat16, so both are returned as float32 arrays holding exactly
    representable values — what a kernel sees after loading fp16/bf16 data into fp32 registers.
    NaN stays NaN.

    Args:
        x: array of floats.
        dtype: ``"float16"`` or ``"bfloat16"``.

    Returns:
        float32 array of the same shape.

    Raises:
        ValueError: ``dtype`` is not one of the two.
        TypeError: ``x`` is not an array of real numbers.
    """
    if dtype not in LOW_PRECISION_DTYPES:
        raise ValueError(f"dtype must be one of {LOW_PRECISION_DTYPES}, got {dtype!r}")
    with np.errstate(over="ignore"):  # beyond float32's range is inf, as a cast on a GPU
        x32 = check_values_array("x", x).astype(np.float32)
    if dtype == "float16":
        return x32.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = x32.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # keep the top 16 bits, RNE
        out = rounded.astype(np.uint32).view(np.float32)
        return np.where(np.isnan(x32), np.float32(np.nan), out)
