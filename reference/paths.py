"""Where the workbook lives on disk."""

from __future__ import annotations

from pathlib import Path

#: The repository root (the folder holding ``labs/``, ``reference/`` and, outside a student
#: release, ``solutions/``).
REPO_ROOT = Path(__file__).resolve().parent.parent
LABS_DIR = REPO_ROOT / "labs"
SOLUTIONS_DIR = REPO_ROOT / "solutions"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
MUTANTS_DIR = Path(__file__).resolve().parent / "mutants"


def lab_names() -> list[str]:
    """Returns the lab folder names (``lab01_block_manager``, ...) in lab order."""
    return sorted(p.name for p in LABS_DIR.glob("lab[0-9][0-9]_*") if p.is_dir())


def lab_of_path(path: str | Path) -> str | None:
    """Returns the lab a path belongs to, or None.

    Lab tests live in ``labs/<lab>/``; a lab's *hidden* tests (instructor-only, see
    ``reference/hidden.py``) live in ``solutions/<lab>/hidden/`` or, in a grading bundle,
    ``hidden/<lab>/``. All three count as tests of ``<lab>``.
    """
    parts = Path(path).resolve().parts
    for i, part in enumerate(parts[:-1]):
        if part in ("labs", "hidden") and parts[i + 1].startswith("lab"):
            return parts[i + 1]
        if (part == "solutions" and parts[i + 1].startswith("lab") and i + 3 < len(parts)
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
