"""Hidden tests: instructor-only lab tests that run at grading time and never ship to students.

A lab's hidden tests live beside its solution, ``solutions/<lab>/hidden/test_<lab>_hidden_*.py``
(no ``__init__.py``: each file imports as a top-level module, so the ``test_labNN_hidden_``
prefix keeps names unique). They are ordinary lab tests: they use the ``impl`` fixture, carry
``@pytest.mark.points(n)`` and count towards the lab's score. A student release strips them with
the rest of ``solutions/``; a Gradescope bundle carries them as ``hidden/<lab>/`` (outside
``solutions/``, which a bundle must not contain).

Where they run:

* ``pagedlab grade`` and ``pagedlab check`` (both go through :mod:`reference.grader.runner`) include
  them whenever the folder exists, so the starters must score 0 and the solution must pass them
  too;
* the plain ``pytest`` of the README does *not* (``testpaths`` is ``labs`` and ``tests``):
  ``pytest solutions/*/hidden`` runs them by hand.

In ``results.json`` a hidden test carries Gradescope visibility ``after_due_date`` and shows
only its failure message, never its code; the summary always says how many hidden tests failed
in each lab.
"""

from __future__ import annotations

import re
from pathlib import Path

from reference.paths import REPO_ROOT, SOLUTIONS_DIR

#: Where a grading bundle keeps hidden tests (``hidden/<lab>/``).
BUNDLE_HIDDEN_DIR = REPO_ROOT / "hidden"

#: The assertion-rewrite lines that describe *code* rather than values ("where x = f(...)").
_CODE_LINE = re.compile(r"^\s*(\+|-)?\s*where\s|^\s*\+\s+and\s")


def hidden_dirs(lab: str, root: Path | None = None) -> list[Path]:
    """Returns the folders holding a lab's hidden tests (usually zero or one).

    Args:
        lab: lab folder name.
        root: repository root (default: this checkout).

    Returns:
        Existing folders among ``solutions/<lab>/hidden`` and ``hidden/<lab>``.
    """
    solutions = SOLUTIONS_DIR if root is None else root / "solutions"
    bundle = BUNDLE_HIDDEN_DIR if root is None else root / "hidden"
    return [d for d in (solutions / lab / "hidden", bundle / lab) if d.is_dir()]


def hidden_test_files(lab: str, root: Path | None = None) -> list[Path]:
    """Returns a lab's hidden test files."""
    return sorted(f for d in hidden_dirs(lab, root) for f in d.glob("test_*.py"))


def student_message(message: str, max_chars: int = 600) -> str:
    """Returns what a student may see of a hidden test's failure: the message, not the code.

    Args:
        message: the failure's one-line message (exception and text, assertion explanation).
        max_chars: cut longer messages.

    Returns:
        The message without assertion-rewrite lines that quote expressions of the test.
    """
    lines = [ln for ln in message.splitlines() if not _CODE_LINE.match(ln)]
    text = "\n".join(lines).strip()
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def hidden_summary(records: list) -> list[str]:
    """Returns one line per lab with hidden tests: ``N hidden tests failed in lab X``.

    Args:
        records: graded :class:`~reference.grader.results.TestResult` records (the hidden
            ones are counted).

    Returns:
        Lines in lab order, also for labs where none failed (``0 hidden tests failed ...``).
    """
    counts: dict[str, list[int]] = {}
    for rec in records:
        if rec.hidden:
            failed, total = counts.setdefault(rec.lab, [0, 0])
            counts[rec.lab] = [failed + rec.failed, total + 1]
    lines = []
    for lab in sorted(counts):
        failed, total = counts[lab]
        noun = "hidden test" if failed == 1 else "hidden tests"
        lines.append(f"{failed} {noun} failed in {lab} (of {total} hidden)")
    return lines
