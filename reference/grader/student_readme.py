"""The student README a release ships in place of the instructors' one.

The source repository keeps its own ``README.md`` (quickstart against the solutions, grading
internals, Gradescope, hidden tests, releasing); a student reads none of that. The release
writes ``templates/student_README.md`` instead, filled in with the labs it holds.
"""

from __future__ import annotations

import re
import string
from pathlib import Path

from reference.paths import REPO_ROOT
from reference.tools.labinfo import lab_needs_text, lab_title

TEMPLATE = Path(__file__).resolve().parent / "templates" / "student_README.md"


def lab_table(labs: list[str], lab_max: dict[str, float]) -> str:
    """Returns the Markdown rows of the labs table (one row per released lab).

    Args:
        labs: lab folder names, in lab order.
        lab_max: lab -> its maximum points in the release.
    """
    rows = []
    for lab in labs:
        number = int(lab[3:5])
        rows.append(f"| [{number}](labs/{lab}/README.md) | {lab_title(lab)} | {lab_needs_text(lab)} "
                    f"| {lab_max.get(lab, 0):g} |")
    return "\n".join(rows)


def python_range() -> str:
    """Returns the Python versions the workbook installs on, from ``pyproject.toml``
    (``requires-python = ">=3.10"`` -> ``"3.10 or newer"``)."""
    text = (REPO_ROOT / "pyproject.toml").read_text()
    match = re.search(r'^requires-python\s*=\s*">=\s*([0-9.]+)"', text, re.M)
    return f"{match.group(1)} or newer" if match else "3.10 or newer"


def render_student_readme(labs: list[str], lab_max: dict[str, float], torch_pin: str) -> str:
    """Returns the student README of a release.

    Args:
        labs: the released lab folder names.
        lab_max: lab -> maximum points (from the collected tests).
        torch_pin: the torch requirement the quickstart installs (``torch==2.x.y``).

    Returns:
        The README's text, its Colab badge line built from ``[tool.pagedlab] repository``
        (:mod:`reference.colab`), like the handouts' and the notebooks' setup cells.
    """
    from reference.colab import readme_badge

    return string.Template(TEMPLATE.read_text()).substitute(
        python_range=python_range(), colab_badge=readme_badge(labs),
        torch_pin=torch_pin, lab_table=lab_table(labs, lab_max))
