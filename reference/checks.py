"""Small argument checks that raise typed errors naming the argument.

They are plumbing, not lab content: every lab validates its inputs with them so that error
messages read the same across the workbook.
"""

from __future__ import annotations

import numbers


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
