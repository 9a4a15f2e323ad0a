"""Shared machinery of the bad-input fuzz suite (``tests/fuzz``): bad values by kind, and the
one assertion every bad call must pass.

The contract (``reference/checks.py``): bad input raises one of the documented error types,
the message names the argument, and the observable state after the error equals the state
before. A bad value that is *accepted* is a failure too ("accepted garbage").
"""

from __future__ import annotations

import inspect
import os
from collections import Counter
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

import reference.errors as ref_errors

#: Examples per fuzz test: small in CI (the whole suite in well under a minute on 2 cores),
#: larger by ``--fuzz-examples N`` or ``PAGEDLAB_FUZZ_EXAMPLES=N`` for a nightly-size run.
EXAMPLES_ENV = "PAGEDLAB_FUZZ_EXAMPLES"
DEFAULT_EXAMPLES = 120


def num_examples(scale: float = 1.0) -> int:
    """The example budget of one fuzz test (``scale`` × the configured count, at least 10)."""
    return max(10, int(int(os.environ.get(EXAMPLES_ENV, DEFAULT_EXAMPLES)) * scale))


def fuzz_settings(scale: float = 1.0) -> settings:
    """Hypothesis settings for a fuzz test: bounded, deterministic, no deadline.

    NOTE: no shrinking, and the first bug only: a fuzz failure prints the drawn values, which
    name the call and the bad argument already; shrinking many distinct bugs took minutes.
    """
    return settings(max_examples=num_examples(scale), deadline=None, derandomize=True,
                    database=None, suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    report_multiple_bugs=False)


#: Calls made by this session's fuzz tests, by outcome (printed at the end of the run).
STATS: Counter = Counter()

#: The error types the workbook documents; anything else is a foreign error.
DOCUMENTED_ERRORS = (TypeError, ValueError, IndexError) + tuple(
    cls for _, cls in inspect.getmembers(ref_errors, inspect.isclass)
    if issubclass(cls, Exception))

# ------------------------------------------------------------------ bad values, by kind

#: Values that are not integers, though some look like one.
NON_INTEGERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, 2.0, 1.9, -0.0]),
    st.booleans(),
    st.sampled_from([np.True_, np.False_, torch.tensor(True)]),
    st.text(alphabet="0123456789 -x", max_size=3),
    st.none(),
    st.builds(np.float64, st.integers(-5, 5)),
    st.builds(np.float32, st.integers(-5, 5)),
    st.builds(np.float16, st.integers(-5, 5)),
    st.builds(lambda v: torch.tensor(float(v)), st.integers(-5, 5)),
    st.builds(lambda v: torch.tensor([v]), st.integers(0, 5)),
    st.builds(lambda v: np.array([v]), st.integers(0, 5)),
    st.sampled_from([[1], (1,), {1}, {"a": 1}, 1 + 2j, Fraction(1, 2), Fraction(4, 1),
                     Decimal("1"), b"1", object()]),
)

#: Integer scalars of other libraries: accepted, and must behave exactly like Python ints.
def integer_like(value: int):
    """Strategy of ``value`` as NumPy / torch integer scalars (kinds that fit ``value``)."""
    kinds = [np.int64, lambda v: np.array(v, dtype=np.int64),
             lambda v: torch.tensor(v, dtype=torch.int64)]
    if -2**31 <= value < 2**31:
        kinds += [np.int32, lambda v: torch.tensor(v, dtype=torch.int32)]
    if 0 <= value < 2**16:
        kinds += [np.uint16]
    return st.sampled_from(kinds).map(lambda kind: kind(value))


def huge_ints() -> st.SearchStrategy[int]:
    """Integers far outside any sensible range, both signs."""
    return st.sampled_from([2**31, 2**32 + 1, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63), -10**30])


# ------------------------------------------------------------------ the one assertion

def refused(call, *, names, snapshot=None, what: str = ""):
    """Runs ``call`` (a bad call) and asserts the bad-input contract.

    Args:
        call: no-argument callable making the bad call.
        names: substrings of which the error message must contain at least one (the argument's
            name); empty to skip the naming check (calls without arguments).
        snapshot: no-argument callable returning the observable state, or None.
        what: describes the call in failure messages.

    Returns:
        The exception raised.
    """
    before = snapshot() if snapshot is not None else None
    STATS["bad calls"] += 1
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 — classifying it is the point
        if not isinstance(exc, DOCUMENTED_ERRORS):
            pytest.fail(f"foreign error from {what}: {type(exc).__name__}: {exc}")
        if names and not any(n in str(exc) for n in names):
            pytest.fail(f"{what} raised {type(exc).__name__} naming none of {list(names)}: {exc}")
        if snapshot is not None:
            after = snapshot()
            assert after == before, f"{what} raised {type(exc).__name__} but changed the state"
        return exc
    pytest.fail(f"accepted garbage: {what} returned {result!r:.200}")


def accepted(call, *, what: str = ""):
    """Runs a call that must be accepted; fails with the error if it is refused."""
    STATS["good calls"] += 1
    try:
        return call()
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"{what} was refused: {type(exc).__name__}: {exc}")


def assert_all_finite(what: str, *arrays) -> None:
    """Accepted calls on finite inputs return no NaN/inf (lse -inf is checked by the caller)."""
    for arr in arrays:
        arr = np.asarray(arr, dtype=np.float64)
        assert not np.isnan(arr).any() and not np.isposinf(arr).any(), (
            f"{what}: NaN or +inf from finite inputs")
