"""Turns a graded pytest report into what people read: a table, Gradescope JSON, Markdown.

Input records are :class:`~reference.grader.results.TestResult` (nodeid, lab, name, doc, points,
outcome, when, message, details, hidden). A *hidden* test (:mod:`reference.grader.hidden`) is shown to
students after the due date, with its failure message only; the summary always counts how many
hidden tests failed per lab. ``notes`` are grader findings shown to everyone (tampered files,
tests that never reported, collection errors).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction

from reference.grader.hidden import hidden_summary, student_message
from reference.grader.results import TestResult, points_float
from reference.paths import LABS_DIR

TODO_RE = re.compile(r"TODO\((lab\d+\.\d+)\):?\s*([^\n'\"]*)")


@dataclass
class LabRow:
    """One lab's line in the grade table."""

    lab: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    total: int = 0
    points: Fraction = Fraction(0)
    max_points: Fraction = Fraction(0)


def summarize(records: list[TestResult]) -> list[LabRow]:
    """Groups test records by lab.

    Args:
        records: graded test records.

    Returns:
        One row per lab, in lab order. Skipped tests count towards the maximum, not the score.
    """
    rows: dict[str, LabRow] = {}
    for rec in records:
        row = rows.setdefault(rec.lab, LabRow(rec.lab))
        row.total += 1
        row.max_points += rec.points
        if rec.passed:
            row.passed += 1
            row.points += rec.points
        elif rec.skipped:
            row.skipped += 1
        else:
            row.failed += 1
    return [rows[k] for k in sorted(rows)]


def fmt_points(x: Fraction | float) -> str:
    """Points for people: exact sums print whole (281), shares to two decimals (0.33)."""
    return f"{round(float(x), 2):g}"


def total_points_of(rows: list[LabRow]) -> tuple[Fraction, Fraction]:
    """Returns (points earned, maximum) over the rows, exactly."""
    return (sum((r.points for r in rows), Fraction(0)),
            sum((r.max_points for r in rows), Fraction(0)))


def format_table(rows: list[LabRow]) -> str:
    """Returns the plain-text grade table (lab × tests passed/total, points/max)."""
    header = f"{'lab':<28} {'tests':>9} {'skipped':>8} {'points':>13}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.lab:<28} {f'{r.passed}/{r.total}':>9} {r.skipped:>8} "
            f"{f'{fmt_points(r.points)}/{fmt_points(r.max_points)}':>13}"
        )
    tot_p, tot_m = total_points_of(rows)
    passed = sum(r.passed for r in rows)
    total = sum(r.total for r in rows)
    skipped = sum(r.skipped for r in rows)
    lines.append("-" * len(header))
    lines.append(
        f"{'total':<28} {f'{passed}/{total}':>9} {skipped:>8} "
        f"{f'{fmt_points(tot_p)}/{fmt_points(tot_m)}':>13}"
    )
    return "\n".join(lines)


def todos(records: list[TestResult]) -> list[tuple[str, str]]:
    """Returns the distinct ``TODO(labN.k)`` tags that failing tests hit, in task order.

    Args:
        records: graded test records.

    Returns:
        (tag, text) pairs, e.g. ``("lab1.3", "allocate one block ...")``.
    """
    found: dict[str, str] = {}
    for rec in records:
        if rec.failed:
            for tag, text in TODO_RE.findall(rec.message + "\n" + rec.details):
                found.setdefault(tag, text.strip())

    return [(t, found[t]) for t in sorted(found, key=task_order_key)]


def task_order_key(tag: str) -> tuple[int, int, int]:
    """Sort key for a ``labN.k`` tag: the order the lab's handout lists its tasks in.

    NOTE: a handout may ask for the tasks out of numeric order (Lab 1 starts with the free queue,
    ``lab1.2``, which ``lab1.1``'s manager is built on); ``grade`` and ``status`` must send the
    student where the handout does. Tags the handout never names sort after, by number.
    """
    lab, task = (int(x) for x in tag.removeprefix("lab").split("."))
    position = _handout_positions(lab).get(tag)
    return lab, position if position is not None else 1 << 30, task


@functools.lru_cache(maxsize=None)
def _handout_positions(lab_number: int) -> dict[str, int]:
    """``labN.k`` -> where its ``TODO(labN.k)`` first appears in the lab's handout."""
    positions: dict[str, int] = {}
    for handout in sorted(LABS_DIR.glob(f"lab{lab_number:02d}_*/README.md")):
        for match in TODO_RE.finditer(handout.read_text(errors="replace")):
            positions.setdefault(match.group(1), match.start())
    return positions


#: What a failed hidden test shows in place of its message (unless messages are shown).
HIDDEN_WITHHELD = "failed (a hidden test: its message is withheld; see the hidden-test count)"


def gradescope_results(records: list[TestResult], implementation: str,
                       notes: list[str] | tuple[str, ...] = (),
                       hidden_messages: bool = False) -> dict:
    """Builds a Gradescope ``results.json`` payload.

    Args:
        records: graded test records.
        implementation: which implementation was graded (shown to the student).
        notes: grader findings to show at the top (tampered files, crashes, ...).
        hidden_messages: show a failed hidden test's message (never its code); by default
            it is withheld (:data:`HIDDEN_WITHHELD`) and only the count is shown.

    Returns:
        A dict with ``score``, ``max_score``, ``output`` and ``tests``; each test has name, score,
        max_score, status, output (the failure message) and tags (its lab). Hidden tests have
        ``visibility: after_due_date``; their output is withheld, or with ``hidden_messages``
        the failure message alone (never the traceback, which quotes the test's code).
    """
    tests = []
    for rec in records:
        passed, hidden = rec.passed, rec.hidden
        output = ""
        if rec.skipped:
            output = f"skipped: {rec.message}"
        elif not passed and hidden:
            # NOTE: withheld by default: a hidden test's message can quote what it probes
            # (and what the student's code returned); the count is in the summary.
            output = student_message(rec.message) if hidden_messages else HIDDEN_WITHHELD
        elif not passed:
            output = rec.message
            if rec.details:
                output += "\n\n" + rec.details
        name = rec.nodeid.split("::", 1)[-1]
        if rec.doc:
            name = f"{name}: {rec.doc}"
        test = {
            "name": f"{rec.lab} · {'hidden · ' if hidden else ''}{name}",
            "score": points_float(rec.points) if passed else 0,
            "max_score": points_float(rec.points),
            "status": "passed" if passed else "failed",
            "output": output,
            "tags": [rec.lab, "hidden"] if hidden else [rec.lab],
            # For instructors' exports and the release check (Gradescope does not show it).
            "extra_data": {"nodeid": rec.nodeid, "outcome": rec.outcome,
                           **({"device": rec.device} if rec.device else {})},
        }
        if hidden:
            test["visibility"] = "after_due_date"
        tests.append(test)
    rows = summarize(records)
    output = [f"Graded implementation: {implementation}", *hidden_summary(records), *notes]
    return {
        "score": points_float(total_points_of(rows)[0]),
        "max_score": points_float(total_points_of(rows)[1]),
        "output": "\n".join(output),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def markdown_summary(records: list[TestResult], implementation: str,
                     notes: list[str] | tuple[str, ...] = ()) -> str:
    """Returns a Markdown summary (for ``$GITHUB_STEP_SUMMARY`` and instructors).

    Hidden tests appear only as per-lab counts of failures, never by name.
    """
    rows = summarize(records)
    lines = [
        "## PagedAttention Lab grade",
        "",
        f"Implementation: `{implementation}`",
        "",
        "| lab | tests passed | skipped | points |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r.lab} | {r.passed}/{r.total} | {r.skipped} | "
            f"{fmt_points(r.points)}/{fmt_points(r.max_points)} |"
        )
    tot_p, tot_m = total_points_of(rows)
    lines.append(f"| **total** | | | **{fmt_points(tot_p)}/{fmt_points(tot_m)}** |")
    hidden_lines = hidden_summary(records)
    if hidden_lines:
        lines += ["", "### Hidden tests", ""] + [f"- {line}" for line in hidden_lines]
    if notes:
        lines += ["", "### Grader notes", ""] + [f"- {note}" for note in notes]
    open_todos = todos(records)
    if open_todos:
        lines += ["", "### Still to do", ""]
        lines += [f"- `TODO({tag})` {text}" for tag, text in open_todos]
    failed = [r for r in records if r.failed and "TODO(" not in r.message and not r.hidden]
    if failed:
        lines += ["", "### Failing tests", ""]
        for r in failed[:50]:
            msg = r.message.replace("|", "\\|").splitlines()[0][:200] if r.message else ""
            lines.append(f"- `{r.nodeid}` — {msg}")
    return "\n".join(lines) + "\n"
