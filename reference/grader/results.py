"""One graded test result, from the pytest plugin to ``results.json``: a typed record.

The grading plugin (:mod:`reference.grader.grading`) builds a :class:`TestResult` per lab test,
the signed log carries it as JSON, the runner rebuilds it, and every report (grade table,
Gradescope, Classroom, Markdown, ``pagedlab status`` and ``check``) reads its attributes. The
outcome predicates live here, once.

Points are exact fractions: a test's ``points(n)`` is shared by its parametrized cases, so a
3-case test worth 1 point gives each case 1/3. Floats would add 281 points up to 280.9984;
:class:`fractions.Fraction` adds them up to exactly 281. In JSON a whole number stays a number
and a fraction is written ``"1/3"``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from fractions import Fraction
from typing import Iterable

#: Outcomes that cost the test its points because something went wrong (not a skip).
FAILED_OUTCOMES = frozenset({"failed", "error"})
OUTCOMES = frozenset({"passed", "skipped"}) | FAILED_OUTCOMES


def parse_points(value: object) -> Fraction:
    """Reads points as written in a report, log or manifest: a number or ``"n/d"``.

    Args:
        value: an int, a float or a string such as ``"1/3"``.

    Returns:
        The points as an exact fraction.

    Raises:
        ValueError: not a non-negative number.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Fraction)):
        raise ValueError(f"points must be a number or 'n/d', got {value!r}")
    points = Fraction(value)
    if points < 0:
        raise ValueError(f"points must be >= 0, got {value!r}")
    return points


def points_json(points: Fraction) -> int | str:
    """Writes points for JSON: a whole number as an int, anything else as ``"n/d"``."""
    points = Fraction(points)
    return int(points) if points.denominator == 1 else f"{points.numerator}/{points.denominator}"


def total_points(points: Iterable[object]) -> Fraction:
    """Adds up points as written in a manifest (numbers or ``"n/d"``), exactly."""
    return sum((parse_points(p) for p in points), Fraction(0))


def points_float(points: Fraction, digits: int = 4) -> float:
    """Points for a consumer that wants a float (Gradescope, Classroom), rounded."""
    return round(float(points), digits)


@dataclass
class TestResult:
    """One lab test's graded result.

    Attributes:
        nodeid: pytest's id of the test case.
        lab: the lab folder it belongs to.
        name: the test case's name.
        doc: the first paragraph of its docstring (the property it proves).
        points: what the case is worth (its test's points over its number of cases).
        hidden: an instructor-only test (see :mod:`reference.grader.hidden`).
        outcome: ``passed``, ``failed``, ``error`` or ``skipped``.
        when: the phase that decided a non-pass: ``setup``, ``call`` or ``teardown``.
        message: one line: the exception and its message, or the skip reason.
        details: the (truncated) traceback.
        duration_s: seconds the test took, all phases.
    """

    __test__ = False  # not a pytest test class, whatever its name

    nodeid: str
    lab: str
    name: str = ""
    doc: str = ""
    points: Fraction = Fraction(0)
    hidden: bool = False
    outcome: str = "passed"
    when: str = ""
    message: str = ""
    details: str = ""
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    @property
    def failed(self) -> bool:
        """Failed or errored: the test ran (or tried to) and did not pass."""
        return self.outcome in FAILED_OUTCOMES

    @property
    def skipped(self) -> bool:
        return self.outcome == "skipped"

    @property
    def func_name(self) -> str:
        """The test function's name, without the parametrization (``test_x[1]`` -> ``test_x``)."""
        return self.nodeid.split("::")[-1].split("[")[0]

    def fail(self, message: str, when: str = "call") -> None:
        """Marks the result failed with a message (no traceback): used by the grader itself."""
        self.outcome, self.when, self.message, self.details = "failed", when, message, ""

    def to_json(self) -> dict:
        """Returns a JSON-ready dict (points as a number or ``"n/d"``)."""
        out = asdict(self)
        out["points"] = points_json(self.points)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "TestResult":
        """Rebuilds a result from :meth:`to_json`'s dict, checking every field's type.

        Raises:
            ValueError: a field is missing, unknown, or of the wrong type, or the outcome is
                not one of :data:`OUTCOMES`.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a test result must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown test result fields: {sorted(unknown)}")
        kwargs = {k: v for k, v in data.items() if k != "points"}
        for key in ("nodeid", "lab", "name", "doc", "outcome", "when", "message", "details"):
            if key in kwargs and not isinstance(kwargs[key], str):
                raise ValueError(f"test result field {key!r} must be a string")
        if not isinstance(kwargs.get("hidden", False), bool):
            raise ValueError("test result field 'hidden' must be a boolean")
        duration = kwargs.get("duration_s", 0.0)
        if isinstance(duration, bool) or not isinstance(duration, (int, float)):
            raise ValueError("test result field 'duration_s' must be a number")
        if kwargs.get("outcome", "passed") not in OUTCOMES:
            raise ValueError(f"unknown outcome {kwargs['outcome']!r}")
        if "nodeid" not in kwargs or "lab" not in kwargs:
            raise ValueError("a test result needs 'nodeid' and 'lab'")
        return cls(points=parse_points(data.get("points", 0)), **kwargs)
