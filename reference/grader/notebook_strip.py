"""Clears the outputs of a notebook's code cells (a student release must not ship them).

The workbook commits its walkthroughs *executed* — against the solutions. Their outputs would
show students what the finished code prints, so a release keeps the markdown and the code and
drops every output and execution count. Plain JSON, no nbformat needed.
"""

from __future__ import annotations

import json
from pathlib import Path


def strip_outputs(path: Path) -> int:
    """Clears every code cell's outputs and execution count, in place.

    Args:
        path: an ``.ipynb`` file.

    Returns:
        How many cells had outputs.
    """
    nb = json.loads(path.read_text())
    cleared = 0
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        cleared += bool(cell.get("outputs"))
        cell["outputs"] = []
        cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return cleared


def has_outputs(path: Path) -> bool:
    """Returns True when any code cell of the notebook has an output or execution count."""
    nb = json.loads(path.read_text())
    return any(c.get("outputs") or c.get("execution_count") is not None
               for c in nb.get("cells", []) if c.get("cell_type") == "code")
