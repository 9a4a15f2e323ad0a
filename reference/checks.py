"""Small argument checks that raise typed errors naming the argument.

They are plumbing, not lab content: every lab validates its inputs with them so that error
messages read the same across the workbook.

The contract every public function of the workbook keeps (and ``tests/fuzz`` enforces):

  * bad input raises ``TypeError`` (wrong kind of value), ``ValueError`` (right kind, wrong
    value or shape), ``IndexError`` (an id or slot out of range) or one of the typed errors of
    ``reference/errors.py``, and the message names the argument (``block_id``,
    ``token_ids[3]``, ``slot_mapping``);
  * integers are integers: ``bool``, ``float``, ``str`` and NumPy floats are refused, never
    rounded or parsed; NumPy and torch *integer* scalars are accepted and turned into Python
    ints once, here;
  * everything is checked before anything changes, so a call that raises changed nothing.
"""

from __future__ import annotations

import math
import numbers
import sys

import numpy as np


def _as_int(value: object) -> int | None:
    """Returns ``value`` as a Python int if it is an integer scalar, else None.

    Integer scalars: Python ints, NumPy integers, 0-d NumPy integer arrays and 0-d torch
    integer tensors. Bools of every library are not integers here.
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, np.ndarray):
        return int(value) if value.ndim == 0 and value.dtype.kind in "iu" else None
    torch = sys.modules.get("torch")  # NOTE: no import: if torch is not loaded, no tensor exists
    if torch is not None and isinstance(value, torch.Tensor):
        ok = value.ndim == 0 and not value.dtype.is_floating_point \
            and not value.dtype.is_complex and value.dtype != torch.bool
        return int(value.item()) if ok else None
    return None


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def check_int(name: str, value: object, *, min_value: int | None = None) -> int:
    """Checks that ``value`` is an integer (not a bool) and at least ``min_value``.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.
        min_value: smallest allowed value, or None for no bound.

    Returns:
        ``value`` as a Python int (NumPy and torch integer scalars are converted once, here).

    Raises:
        TypeError: ``value`` is not an integer (bools, floats and strings are refused).
        ValueError: ``value`` is below ``min_value``.
    """
    # NOTE: bool is a subclass of int; True as a block id is almost always a bug.
    as_int = _as_int(value)
    if as_int is None:
        raise TypeError(f"{name} must be an int, got {_describe(value)}")
    if min_value is not None and as_int < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {as_int}")
    return as_int


def check_index(name: str, value: object, size: int) -> int:
    """Checks that ``value`` is an integer index in ``[0, size)``.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.
        size: number of valid indices.

    Returns:
        ``value`` as a Python int.

    Raises:
        TypeError: ``value`` is not an integer.
        IndexError: ``value`` is negative or ``>= size``.
    """
    as_int = _as_int(value)
    if as_int is None:
        raise TypeError(f"{name} must be an int, got {_describe(value)}")
    if not 0 <= as_int < size:
        raise IndexError(f"{name}={as_int} is out of range [0, {size})")
    return as_int


def check_block_hash(name: str, value: object) -> int:
    """Checks that ``value`` is a block hash: an int in ``[0, 2**64)``.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.

    Returns:
        ``value`` as a Python int.

    Raises:
        TypeError: not an int (bools and floats are refused).
        ValueError: negative or ``>= 2**64`` (no :func:`hash_block_tokens` result is).
    """
    value = check_int(name, value, min_value=0)
    if value >= 1 << 64:
        raise ValueError(f"{name}={value} is not a 64-bit block hash (must be < 2**64)")
    return value


def check_sequence(name: str, value: object) -> list:
    """Checks that ``value`` is an ordered sequence (list, tuple, range, 1-D array or tensor).

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.

    Returns:
        Its items as a new list (a later change to the caller's list cannot reach us).

    Raises:
        TypeError: ``None``, a string, a set, a dict, a scalar, or an array that is not 1-D.
    """
    if isinstance(value, (list, tuple, range)):
        return list(value)
    torch = sys.modules.get("torch")
    if isinstance(value, np.ndarray) or (torch is not None and isinstance(value, torch.Tensor)):
        if value.ndim == 1:
            return list(value)
        raise TypeError(f"{name} must be 1-D, got an array of shape {tuple(value.shape)}")
    # NOTE: a str is a Sequence too: "12" would read as the tokens "1", "2".
    raise TypeError(f"{name} must be a list of ints, got {_describe(value)}")


def check_int_list(name: str, value: object, *, min_value: int | None = None) -> list[int]:
    """Checks a sequence of integers; items are named ``name[i]`` in messages.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed (see :func:`check_sequence`).
        min_value: smallest allowed item, or None for no bound.

    Returns:
        The items as Python ints.

    Raises:
        TypeError: not a sequence, or an item is not an integer.
        ValueError: an item is below ``min_value``.
    """
    return [check_int(f"{name}[{i}]", v, min_value=min_value)
            for i, v in enumerate(check_sequence(name, value))]


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


def as_array(name: str, value: object) -> np.ndarray:
    """Returns ``np.asarray(value)``, turning NumPy's own refusals into errors naming ``name``.

    Raises:
        TypeError: ``value`` is None, or NumPy cannot make a numeric array of it (ragged lists,
            objects, strings).
    """
    if value is None:
        raise TypeError(f"{name} must be an array, got None")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise TypeError(f"{name} must be a rectangular numeric array: {exc}") from None
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    return arr


def check_int_array(name: str, value: object, ndim: int, shape_doc: str) -> np.ndarray:
    """Checks that ``value`` is an integer array (lists of ints are accepted) with ``ndim`` dims.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.
        ndim: required number of dimensions.
        shape_doc: the expected shape in words.

    Returns:
        ``value`` as an int64 NumPy array.

    Raises:
        TypeError: not integers (floats and bools are refused; an empty list is fine).
        ValueError: wrong number of dimensions, or a uint64 value past int64's range.
    """
    arr = as_array(name, value)
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise TypeError(f"{name} must hold integers {shape_doc}, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {shape_doc}, got shape {arr.shape}")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds {int(arr.max())}, past int64's range")
    return arr.astype(np.int64)


def check_scale(scale: object, *, name: str = "scale", dtype=np.float64) -> float:
    """Checks that ``scale`` is a real number that is finite and > 0 *in* ``dtype``.

    A kernel that takes its scale as float32 sees ``1e39`` as inf and ``1e-50`` as 0, so those
    are refused for ``dtype=np.float32`` even though they are fine Python floats.

    Args:
        scale: what the caller passed.
        name: the argument's name, used in the message.
        dtype: the float type the computation uses (float64 or float32).

    Returns:
        ``scale`` as a Python float.

    Raises:
        TypeError: not a real number (bools and strings are refused).
        ValueError: not finite, not > 0, or not finite and > 0 once rounded to ``dtype``.
    """
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{name} must be a float, got {_describe(scale)}")
    try:
        value = float(scale)
    except OverflowError:
        raise ValueError(f"{name}={scale} overflows a float") from None
    with np.errstate(over="ignore", under="ignore"):
        rounded = float(np.dtype(dtype).type(value))
    if not (math.isfinite(rounded) and rounded > 0):
        raise ValueError(f"{name} must be finite and > 0 as {np.dtype(dtype).name}, got {scale!r}"
                         f" (which is {rounded} in {np.dtype(dtype).name})")
    return value
