"""Turns a graded pytest report into what people read: a table, Gradescope JSON, Markdown.

Input records are the dicts :mod:`reference.grader.grading` writes (nodeid, lab, name, doc, points,
outcome, when, message, details, hidden). A *hidden* test (:mod:`reference.grader.hidden`) is shown to
students after the due date, with its failure message only; the summary always counts how many
hidden tests failed per lab. ``notes`` are grader findings shown to everyone (tampered files,
tests that never reported, collection errors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from reference.grader.hidden import hidden_summary, student_message

TODO_RE = re.compile(r"TODO\((lab\d+\.\d+)\):?\s*([^\n'\"]*)")


@dataclass
class LabRow:
    """One lab's line in the grade table."""

    lab: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    total: int = 0
    points: float = 0.0
    max_points: float = 0.0


def summarize(records: list[dict]) -> list[LabRow]:
    """Groups test records by lab.

    Args:
        records: graded test records.

    Returns:
        One row per lab, in lab order. Skipped tests count towards the maximum, not the score.
    """
    rows: dict[str, LabRow] = {}
    for rec in records:
        row = rows.setdefault(rec["lab"], LabRow(rec["lab"]))
        row.total += 1
        row.max_points += rec["points"]
        if rec["outcome"] == "passed":
            row.passed += 1
            row.points += rec["points"]
        elif rec["outcome"] == "skipped":
            row.skipped += 1
        else:
            row.failed += 1
    return [rows[k] for k in sorted(rows)]


def fmt_points(x: float) -> str:
    return f"{round(x, 2):g}"


def format_table(rows: list[LabRow]) -> str:
    """Returns the plain-text grade table (lab × tests passed/total, points/max)."""
    header = f"{'lab':<28} {'tests':>9} {'skipped':>8} {'points':>13}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.lab:<28} {f'{r.passed}/{r.total}':>9} {r.skipped:>8} "
            f"{f'{fmt_points(r.points)}/{fmt_points(r.max_points)}':>13}"
        )
    tot_p = sum(r.points for r in rows)
    tot_m = sum(r.max_points for r in rows)
    passed = sum(r.passed for r in rows)
    total = sum(r.total for r in rows)
    skipped = sum(r.skipped for r in rows)
    lines.append("-" * len(header))
    lines.append(
        f"{'total':<28} {f'{passed}/{total}':>9} {skipped:>8} "
        f"{f'{fmt_points(tot_p)}/{fmt_points(tot_m)}':>13}"
    )
    return "\n".join(lines)


def todos(records: list[dict]) -> list[tuple[str, str]]:
    """Returns the distinct ``TODO(labN.k)`` tags that failing tests hit, in task order.

    Args:
        records: graded test records.

    Returns:
        (tag, text) pairs, e.g. ``("lab1.3", "allocate one block ...")``.
    """
    found: dict[str, str] = {}
    for rec in records:
        if rec["outcome"] in ("failed", "error"):
            for tag, text in TODO_RE.findall(rec.get("message", "") + "\n" + rec.get("details", "")):
                found.setdefault(tag, text.strip())

    def key(tag: str) -> tuple[int, int]:
        lab, task = tag.removeprefix("lab").split(".")
        return int(lab), int(task)

    return [(t, found[t]) for t in sorted(found, key=key)]


def gradescope_results(records: list[dict], implementation: str,
                       notes: list[str] | tuple[str, ...] = ()) -> dict:
    """Builds a Gradescope ``results.json`` payload.

    Args:
        records: graded test records.
        implementation: which implementation was graded (shown to the student).
        notes: grader findings to show at the top (tampered files, crashes, ...).

    Returns:
        A dict with ``score``, ``max_score``, ``output`` and ``tests``; each test has name, score,
        max_score, status, output (the failure message) and tags (its lab). Hidden tests have
        ``visibility: after_due_date`` and their output is the failure message alone (never
        the traceback, which quotes the test's code).
    """
    tests = []
    for rec in records:
        passed = rec["outcome"] == "passed"
        hidden = bool(rec.get("hidden"))
        output = ""
        if rec["outcome"] == "skipped":
            output = f"skipped: {rec['message']}"
        elif not passed and hidden:
            output = student_message(rec["message"])
        elif not passed:
            output = rec["message"]
            if rec.get("details"):
                output += "\n\n" + rec["details"]
        name = rec["nodeid"].split("::", 1)[-1]
        if rec.get("doc"):
            name = f"{name}: {rec['doc']}"
        test = {
            "name": f"{rec['lab']} · {'hidden · ' if hidden else ''}{name}",
            "score": round(rec["points"], 4) if passed else 0,
            "max_score": round(rec["points"], 4),
            "status": "passed" if passed else "failed",
            "output": output,
            "tags": [rec["lab"], "hidden"] if hidden else [rec["lab"]],
            # For instructors' exports and the release check (Gradescope does not show it).
            "extra_data": {"nodeid": rec["nodeid"], "outcome": rec["outcome"]},
        }
        if hidden:
            test["visibility"] = "after_due_date"
        tests.append(test)
    rows = summarize(records)
    output = [f"Graded implementation: {implementation}", *hidden_summary(records), *notes]
    return {
        "score": round(sum(r.points for r in rows), 4),
        "max_score": round(sum(r.max_points for r in rows), 4),
        "output": "\n".join(output),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def markdown_summary(records: list[dict], implementation: str,
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
    tot_p = sum(r.points for r in rows)
    tot_m = sum(r.max_points for r in rows)
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
    failed = [r for r in records if r["outcome"] in ("failed", "error")
              and "TODO(" not in r["message"] and not r.get("hidden")]
    if failed:
        lines += ["", "### Failing tests", ""]
        for r in failed[:50]:
            msg = r["message"].replace("|", "\\|").splitlines()[0][:200] if r["message"] else ""
            lines.append(f"- `{r['nodeid']}` — {msg}")
    return "\n".join(lines) + "\n"
