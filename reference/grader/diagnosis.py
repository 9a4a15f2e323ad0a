"""Feedback that names the mistake: match a run's failing tests against the mutants' signatures.

Each mutant (``solutions/<lab>/mutants/*.toml``) makes one classic mistake. ``pagedlab check
--signatures`` runs *all* of a lab's public tests against each mutant and stores the set of test
functions it fails — its *failure signature* — in ``solutions/<lab>/mutants/signatures.json``.
A release ships a student-safe form, ``labs/<lab>/_diagnosis.json`` (the mistake in words, the
handout section that explains it and the signature; no solution code, no edits), and
``pagedlab grade`` / ``status`` compare a student's failing tests with it.

A match is *clear* when the Jaccard similarity |A ∩ B| / |A ∪ B| of the failing set A and a
signature B is at least :data:`CLEAR_JACCARD` and that signature is the unique best: no other
signature scores within :data:`MARGIN` of it. Mutants with identical signatures cannot be told
apart by any run; they form one group and are named together ("a, or b").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from reference.context_lost import is_own_failure
from reference.paths import LABS_DIR, SOLUTIONS_DIR

CLEAR_JACCARD = 0.8
MARGIN = 0.05
SIGNATURES = "signatures.json"
DIAGNOSIS = "_diagnosis.json"


@dataclass(frozen=True)
class Mistake:
    """One group of mutants that fail exactly the same tests."""

    names: tuple[str, ...]  # mutant names (one unless equivalent mutants share the signature)
    mistakes: tuple[str, ...]  # each mutant's mistake, in words
    see: str  # the handout section that names it
    failing: frozenset[str]  # test function names

    def describe(self) -> str:
        """Returns the mistake(s) in words, equivalents joined by 'or'."""
        return " — or — ".join(self.mistakes)


def signatures_path(lab: str) -> Path:
    """Returns where ``check --signatures`` stores a lab's mutant signatures."""
    return SOLUTIONS_DIR / lab / "mutants" / SIGNATURES


def handout_section(lab: str, needle: str) -> str:
    """Returns the ``##`` heading above the first mention of ``needle`` in the lab's handout."""
    handout = LABS_DIR / lab / "README.md"
    if not handout.is_file():
        return ""
    heading = ""
    for line in handout.read_text().splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        if re.search(rf"(?<![\w]){re.escape(needle)}(?![\w])", line):
            return heading
    return ""


def load_entries(lab: str) -> dict[str, dict]:
    """Reads a lab's signatures: the release's ``_diagnosis.json``, else the instructors' file.

    Returns:
        mutant name -> {"mistake": str, "see": str, "failing": [test function names]}; empty
        when the lab has none.
    """
    for path in (LABS_DIR / lab / DIAGNOSIS, signatures_path(lab)):
        if path.is_file():
            return json.loads(path.read_text()).get("mutants", {})
    return {}


def student_diagnosis(lab: str) -> dict | None:
    """Returns the student-safe diagnosis data of a lab (for a release), or None without signatures.

    Only the mistake in words, the handout section and the failing test names: nothing of the
    solution's code.
    """
    path = signatures_path(lab)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    keep = ("mistake", "see", "failing")
    return {"format": 1, "clear_jaccard": CLEAR_JACCARD,
            "mutants": {name: {k: entry[k] for k in keep}
                        for name, entry in sorted(data.get("mutants", {}).items())}}


def groups(entries: dict[str, dict]) -> list[Mistake]:
    """Groups mutants by identical signature (the empty signature — an escaped mutant — is left out)."""
    by_sig: dict[frozenset[str], list[str]] = {}
    for name, entry in sorted(entries.items()):
        failing = frozenset(entry.get("failing", []))
        if failing:
            by_sig.setdefault(failing, []).append(name)
    return [Mistake(tuple(names), tuple(entries[n]["mistake"] for n in names),
                    entries[names[0]].get("see", ""), sig) for sig, names in by_sig.items()]


def jaccard(a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> float:
    """Returns |a ∩ b| / |a ∪ b| (0 for two empty sets)."""
    union = a | b
    return len(a & b) / len(union) if union else 0.0


def diagnose(failing: set[str], entries: dict[str, dict],
             unknown: frozenset[str] = frozenset()) -> Mistake | None:
    """Names the mistake a set of failing tests looks like, when the match is clear.

    Args:
        failing: function names of the failing tests of one lab.
        entries: that lab's signatures (:func:`load_entries`).
        unknown: tests whose own outcome the run cannot tell (they failed only because an
            earlier test lost the CUDA context); left out of every signature before comparing.

    Returns:
        The best-matching group when its Jaccard similarity is >= CLEAR_JACCARD and no other
        group comes within MARGIN of it; else None.
    """
    if not failing:
        return None
    scored = sorted(((jaccard(set(failing), g.failing - unknown), g) for g in groups(entries)),
                    key=lambda pair: -pair[0])
    if not scored or scored[0][0] < CLEAR_JACCARD:
        return None
    if len(scored) > 1 and scored[1][0] > scored[0][0] - MARGIN:
        return None
    return scored[0][1]


def diagnosis_lines(records) -> list[str]:
    """Returns "your failures look like ..." lines for the labs of a run with a clear match.

    Args:
        records: the run's TestResult records (hidden tests are left out: signatures use the
            public tests only). A failure caused by an earlier test's lost CUDA context (in one
            process) tells nothing about its own test: that test is left out of the comparison,
            on both sides (signatures come from isolated runs, where no context is shared).
    """
    lines = []
    by_lab: dict[str, set[str]] = {}
    cascaded: dict[str, set[str]] = {}
    for r in records:
        if r.failed and "/hidden/" not in r.nodeid and not r.nodeid.startswith("hidden/"):
            own = is_own_failure(r.message)
            (by_lab if own else cascaded).setdefault(r.lab, set()).add(r.func_name)
    for lab, failing in sorted(by_lab.items()):
        entries = load_entries(lab)
        unknown = frozenset(cascaded.get(lab, set()) - failing)
        found = diagnose(failing, entries, unknown) if entries else None
        if found:
            see = f" — see handout §{found.see}" if found.see else ""
            lines.append(f"{lab}: your failures look like: {found.describe()}{see} "
                         f"({lab}/README.md)")
    return lines
