"""Mutants: small broken copies of a lab solution, each making one classic mistake.

A mutant lives in ``solutions/<lab>/mutants/<mistake_name>.toml``::

    mistake = "free() puts a block back on the free list even while others still use it"
    caught_by = ["test_shared_block_stays_used_until_last_reference_is_freed"]
    requires_gpu = false          # GPU-only mutants are checked where a GPU is present
    caught_emulated_by = [...]    # optional: under PAGEDLAB_DEVICE=emulate, where caught_by's
                                  # tests are GPU-only (racecheck), these catch it instead
    needs_real_race = false       # optional: only a real race shows it (racecheck on a GPU)
    gpu_escape = "..."            # optional: why no test can see it on a real GPU (a read one
                                  # element past an array that changes nothing): checked only
                                  # emulated, where every access is bounds-checked

    [[edit]]                      # one or more exact text replacements
    file = "solution.py"          # relative to solutions/<lab>/
    old = "..."                   # must occur exactly once in the solution
    new = "..."

The copy is built on the fly from the current solution, so a mutant never drifts from the code
it breaks: when ``old`` no longer matches exactly once, the check fails and says so.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from reference.paths import load_toml
from reference.paths import SOLUTIONS_DIR


class MutantSpecError(ValueError):
    """A mutant file is malformed or no longer matches the solution it edits."""


@dataclass
class Edit:
    """One exact text replacement in a solution file."""

    file: str
    old: str
    new: str


@dataclass
class Mutant:
    """One classic mistake, as edits to a lab's solution."""

    lab: str
    name: str
    mistake: str
    caught_by: list[str]
    requires_gpu: bool = False
    edits: list[Edit] = field(default_factory=list)
    caught_emulated_by: list[str] = field(default_factory=list)
    needs_real_race: bool = False
    gpu_escape: str = ""
    path: Path | None = None


def load_mutants(lab: str | None = None) -> list[Mutant]:
    """Reads every mutant spec, optionally for one lab only.

    Args:
        lab: lab folder name, or None for all labs.

    Returns:
        Mutants sorted by lab then name.

    Raises:
        MutantSpecError: a spec lacks a field or has no edit.
    """
    out = []
    for path in sorted(SOLUTIONS_DIR.glob(f"{lab or 'lab*'}/mutants/*.toml")):
        data, edits = read_spec(path)
        try:
            mutant = Mutant(
                lab=path.parent.parent.name,
                name=path.stem,
                mistake=data["mistake"],
                caught_by=list(data["caught_by"]),
                requires_gpu=bool(data.get("requires_gpu", False)),
                edits=edits,
                caught_emulated_by=list(data.get("caught_emulated_by", [])),
                gpu_escape=str(data.get("gpu_escape", "")),
                needs_real_race=bool(data.get("needs_real_race", False)),
                path=path,
            )
        except (KeyError, TypeError) as exc:
            raise MutantSpecError(f"{path}: missing or malformed field {exc}") from None
        if not mutant.caught_by or not mutant.edits:
            raise MutantSpecError(f"{path}: needs caught_by and at least one [[edit]]")
        out.append(mutant)
    return out


def read_spec(path: Path) -> tuple[dict, list[Edit]]:
    """Reads a mutant file (``mutants/`` or ``speed_mutants/``): its fields and its edits.

    Raises:
        MutantSpecError: the file has no well-formed ``[[edit]]``.
    """
    data = load_toml(path.read_text())
    try:
        edits = [Edit(e["file"], e["old"], e["new"]) for e in data["edit"]]
    except (KeyError, TypeError) as exc:
        raise MutantSpecError(f"{path}: missing or malformed field {exc}") from None
    return data, edits


def build_mutant(mutant: Mutant, dest: Path) -> Path:
    """Copies ``solutions/<lab>/`` to ``dest/<lab>`` and applies the mutant's edits.

    Args:
        mutant: the mutant to build.
        dest: an empty scratch folder.

    Returns:
        The folder holding the mutated ``solution.py`` (for ``PAGEDLAB_IMPL_DIR``).

    Raises:
        MutantSpecError: an edit's ``old`` text does not occur exactly once.
    """
    target = dest / mutant.lab
    shutil.copytree(SOLUTIONS_DIR / mutant.lab, target,
                    ignore=shutil.ignore_patterns("__pycache__", "mutants", "speed_mutants",
                                                  "hidden"))
    for edit in mutant.edits:
        path = target / edit.file
        text = path.read_text()
        count = text.count(edit.old)
        if count != 1:
            raise MutantSpecError(
                f"mutant {mutant.lab}/{mutant.name}: the 'old' text of its edit to {edit.file} "
                f"occurs {count} times in the solution (must be exactly once) — update the mutant"
            )
        path.write_text(text.replace(edit.old, edit.new))
    return target
