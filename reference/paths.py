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
    """Returns the lab folder name a path lies in (``labs/<lab>/...``), or None."""
    parts = Path(path).resolve().parts
    for i, part in enumerate(parts[:-1]):
        if part == "labs" and parts[i + 1].startswith("lab"):
            return parts[i + 1]
    return None
