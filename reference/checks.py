"""Small argument checks that raise typed errors naming the argument.

They are plumbing, not lab content: every lab validates its inputs with them so that error
messages read the same across the workbook. The second half holds the checks every kernel
launcher of Labs 4 and 5 runs on torch tensors / CuPy arrays, kept here once so that both labs
report the same mistake the same way.
"""

from __future__ import annotations

import math
import numbers
import os

from reference.errors import DeviceMismatchError


def check_int(name: str, value: object, *, min_value: int | None = None) -> int:
    """Checks that ``value`` is an integer (not a bool) and at least ``min_value``.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.
        min_value: smallest allowed value, or None for no bound.

    Returns:
        ``value`` as a Python int.

    Raises:
        TypeError: ``value`` is not an integer (bools and floats are refused).
        ValueError: ``value`` is below ``min_value``.
    """
    # NOTE: bool is a subclass of int; True as a block id is almost always a bug.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if min_value is not None and value < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {value}")
    return value


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
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if not 0 <= value < size:
        raise IndexError(f"{name}={value} is out of range [0, {size})")
    return value


# ----------------------------------------------------------------------------- kernel launchers

#: ``PAGEDLAB_DEBUG=1`` (or a launcher's ``debug=True``) turns on the checks that read device
#: memory (block ids, context lengths): they cost a synchronisation, so they are off by default.
DEBUG_ENV = "PAGEDLAB_DEBUG"


def debug_enabled(debug: bool | None = None) -> bool:
    """Whether the value checks that read device memory run.

    Args:
        debug: the caller's choice; None defers to ``PAGEDLAB_DEBUG`` (unset, "" or "0": off).

    Returns:
        True when the checks should run.
    """
    if debug is not None:
        return bool(debug)
    return os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def dtype_name(x) -> str:
    """Returns the element type of a torch tensor or CuPy array as a NumPy-style name
    (``"float16"``, ``"int32"``, ...)."""
    return str(x.dtype).removeprefix("torch.")


def _is_array(x) -> bool:
    # NOTE: checked by duck type, so CuPy (and torch) need not be imported to refuse a list.
    return hasattr(x, "data_ptr") or type(x).__module__.startswith("cupy")


def check_array(name: str, x, ndim: int, dtypes: tuple[str, ...]) -> None:
    """Checks one launcher argument: a torch tensor or CuPy array of ``ndim`` dimensions, one of
    ``dtypes``, contiguous (the kernels compute addresses from the shape alone).

    Args:
        name: the argument's name, used in every message.
        x: what the caller passed.
        ndim: required number of dimensions.
        dtypes: accepted element type names.

    Raises:
        TypeError: not a torch tensor / CuPy array, or a dtype not in ``dtypes``.
        ValueError: the wrong number of dimensions, or a strided (non-contiguous) view.
    """
    if not _is_array(x):
        raise TypeError(f"{name} must be a torch tensor or a CuPy array, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if dtype_name(x) not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(dtypes)}, got {dtype_name(x)}")
    if hasattr(x, "is_contiguous"):  # torch: strides in elements
        contiguous, strides = x.is_contiguous(), tuple(x.stride())
    else:  # CuPy: strides in bytes
        contiguous, strides = bool(x.flags.c_contiguous), tuple(x.strides)
    if not contiguous:
        raise ValueError(f"{name} must be contiguous, got strides {strides} (call .contiguous() "
                         "first: the kernels compute addresses from the shape)")


def check_scale(scale: object) -> float:
    """Checks a softmax scale: a real number (not a bool), finite and > 0.

    Args:
        scale: what the caller passed.

    Returns:
        ``scale`` as a float.

    Raises:
        TypeError: not a real number.
        ValueError: not finite, or <= 0.
    """
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float, got {type(scale).__name__}")
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and > 0, got {scale}")
    return scale


def _device(x) -> tuple[str, int | None]:
    if hasattr(x, "device") and hasattr(x, "data_ptr"):  # torch
        return x.device.type, x.device.index
    return "cuda", int(x.device.id)  # CuPy arrays always live on a GPU


def check_on_cuda(**arrays) -> None:
    """The last check of every launcher: each array (None skipped) on one CUDA device.

    It comes last so that every other mistake is reported on a machine without a GPU too.

    Args:
        **arrays: argument name -> torch tensor or CuPy array (or None), in the caller's order.

    Raises:
        DeviceMismatchError: naming the first array on the CPU, or the first one on another GPU
            than the first array's.
    """
    first = None
    for name, x in arrays.items():
        if x is None:
            continue
        kind, index = _device(x)
        if kind != "cuda":
            raise DeviceMismatchError(f"{name} is on {kind}: the kernels need CUDA tensors (or CuPy "
                                      "arrays), all on one GPU (every check before this one passed)")
        if first is None:
            first = (name, index)
        elif index != first[1]:
            raise DeviceMismatchError(f"{name} is on cuda:{index} but {first[0]} is on "
                                      f"cuda:{first[1]}: every tensor must be on one GPU")
