"""Where the workbook lives on disk."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

#: The repository root (the folder holding ``labs/``, ``reference/`` and, outside a student
#: release, ``solutions/``).
REPO_ROOT = Path(__file__).resolve().parent.parent
LABS_DIR = REPO_ROOT / "labs"
SOLUTIONS_DIR = REPO_ROOT / "solutions"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"




def mutants_dir(lab: str) -> Path:
    """Returns the folder of a lab's mutants, ``solutions/<lab>/mutants/`` (instructor-only,
    beside the hidden tests, so a release is one rule: drop ``solutions/``)."""
    return SOLUTIONS_DIR / lab / "mutants"


def lab_names() -> list[str]:
    """Returns the lab folder names (``lab01_block_manager``, ...) in lab order."""
    return sorted(p.name for p in LABS_DIR.glob("lab[0-9][0-9]_*") if p.is_dir())


def lab_of_path(path: str | Path) -> str | None:
    """Returns the lab a path belongs to, or None.

    Lab tests live in ``labs/<lab>/``; a lab's *hidden* tests (instructor-only, see
    ``reference/grader/hidden.py``) live in ``solutions/<lab>/hidden/`` or, in a grading bundle,
    ``hidden/<lab>/``. All three count as tests of ``<lab>`` (the folders themselves too).
    """
    parts = Path(path).resolve().parts
    for i, part in enumerate(parts[:-1]):
        if part in ("labs", "hidden") and parts[i + 1].startswith("lab"):
            return parts[i + 1]
        if (part == "solutions" and parts[i + 1].startswith("lab") and i + 2 < len(parts)
                and parts[i + 2] == "hidden"):
            return parts[i + 1]
    return None


def is_hidden_path(path: str | Path) -> bool:
    """Returns True for a file among a lab's hidden tests (``solutions/<lab>/hidden/``,
    ``hidden/<lab>/``)."""
    parts = Path(path).resolve().parts
    for i, part in enumerate(parts[:-1]):
        if part == "hidden" and (parts[i + 1].startswith("lab")
                                 or (i >= 2 and parts[i - 2] == "solutions")):
            return True
    return False


class UnknownLabError(ValueError):
    """A lab name on the command line matches no lab folder (or more than one)."""


def resolve_labs(names: list[str]) -> list[str]:
    """Maps ``1``, ``lab01`` or ``lab01_block_manager`` to lab folder names.

    Args:
        names: what the user typed, one entry per lab.

    Returns:
        Lab folder names, in the order given.

    Raises:
        UnknownLabError: a name matches no lab, or more than one.
    """
    known = lab_names()
    out = []
    for name in names:
        try:
            key = name if name.startswith("lab") else f"lab{int(name):02d}"
        except ValueError:
            key = name
        match = [lab for lab in known if lab == key or lab.startswith(key + "_")]
        if len(match) != 1:
            raise UnknownLabError(f"no lab matches {name!r}; labs are: {', '.join(known)}")
        out.append(match[0])
    return out


def load_toml(text: str) -> dict[str, Any]:
    """Parses TOML text: ``tomllib`` on Python 3.11+, the ``tomli`` backport on 3.10.

    NOTE: imported lazily, so a module that only *may* read TOML still imports on 3.10.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised by the 3.10 CI leg
        import tomli as tomllib
    return tomllib.loads(text)
