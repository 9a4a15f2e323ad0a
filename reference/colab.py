"""Colab: the notebooks' setup cell and the "Open in Colab" badges, from one repository URL.

The URL lives in one place, ``[tool.pagedlab] repository`` (and ``branch``) in
``pyproject.toml``. A notebook opened in Colab has nothing but itself, so it cannot read that
file: the URL is written into each notebook's first code cell, and into the badge line of each
handout and of the README, by ``python -m reference.colab --write``; ``--check`` (and a test)
says where a copy disagrees with ``pyproject.toml``. ``pagedlab release`` reports a
disagreement as a problem and gives the student README the same badge line.

NOTE: the badges and the clone only work once the repository is hosted at that URL; until then
it is a placeholder (:func:`is_placeholder`).

Usage::

    python -m reference.colab --check     # exit 1 and list what disagrees
    python -m reference.colab --write     # rewrite the badge lines and setup cells
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from reference.paths import REPO_ROOT

#: Colab's badge picture.
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
#: How every badge line starts (how --write finds the line to replace).
BADGE_PREFIX = "[![Open In Colab]("
#: The first line of the setup cell (how --write finds the cell to replace).
SETUP_MARKER = "# Colab setup"
#: The setup cell's id in the notebook file.
SETUP_CELL_ID = "colab-setup"
#: The owner in the placeholder URL.
PLACEHOLDER_OWNER = "YOUR-ORG"

_GITHUB = re.compile(r"^https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")

_SETUP = '''\
# Colab setup: does nothing where the workbook is importable (a clone, CI). On Colab it clones
# and installs the workbook and CuPy; on a CPU-only runtime the CUDA kernels run emulated.
REPO, BRANCH = "{url}", "{branch}"  # pyproject.toml's [tool.pagedlab]
import importlib.util, os, subprocess, sys
if importlib.util.find_spec("reference") is None:
    folder = REPO.rsplit("/", 1)[-1]
    if not os.path.isdir(folder):
        subprocess.run(["git", "clone", "--depth", "1", "--branch", BRANCH, REPO], check=True)
    os.chdir(folder)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "."], check=True)
    sys.path.insert(0, os.getcwd())
    import torch
    if torch.cuda.is_available():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "cupy-cuda12x"], check=True)
    else:
        os.environ["PAGEDLAB_DEVICE"] = "emulate"  # the emulated device: reference/emulate.py'''


def settings(root: Path = REPO_ROOT) -> tuple[str, str]:
    """Returns ``(repository, branch)`` from ``[tool.pagedlab]`` in ``pyproject.toml``.

    Args:
        root: the repository root holding ``pyproject.toml``.

    Returns:
        The repository URL and its branch (``"main"`` when not set).

    Raises:
        ValueError: ``repository`` is missing or not a ``https://github.com/OWNER/NAME`` URL
            (Colab opens notebooks from GitHub).
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    table = tomllib.loads((root / "pyproject.toml").read_text()).get("tool", {}).get("pagedlab", {})
    url = table.get("repository")
    if not isinstance(url, str) or not _GITHUB.match(url):
        raise ValueError(f"[tool.pagedlab] repository in pyproject.toml must be a "
                         f"https://github.com/OWNER/NAME URL, got {url!r}")
    return url.rstrip("/").removesuffix(".git"), str(table.get("branch", "main"))


def is_placeholder(root: Path = REPO_ROOT) -> bool:
    """True while the repository URL is the placeholder (the badges cannot work yet)."""
    return f"/{PLACEHOLDER_OWNER}/" in settings(root)[0] + "/"


def notebook_url(notebook: str, root: Path = REPO_ROOT) -> str:
    """Returns the Colab address of ``notebooks/<notebook>.ipynb`` (e.g. ``lab01_block_manager``)."""
    url, branch = settings(root)
    owner, name = _GITHUB.match(url).groups()
    return (f"https://colab.research.google.com/github/{owner}/{name}/blob/{branch}/notebooks/"
            f"{notebook}.ipynb")


def handout_badge(lab: str, root: Path = REPO_ROOT) -> str:
    """Returns the badge line of a lab's handout: its notebook, opened in Colab."""
    return (f"{BADGE_PREFIX}{BADGE_IMAGE})]({notebook_url(lab, root)}) this lab's notebook "
            "(its first cell installs the workbook on Colab)")


def readme_badge(labs: list[str], root: Path = REPO_ROOT) -> str:
    """Returns the README's badge line: Lab 1's notebook, then every lab's by number."""
    links = " · ".join(f"[{int(lab[3:5])}]({notebook_url(lab, root)})" for lab in labs)
    return (f"{BADGE_PREFIX}{BADGE_IMAGE})]({notebook_url(labs[0], root)}) "
            f"notebooks on Colab, lab {links}")


def setup_cell(root: Path = REPO_ROOT) -> str:
    """Returns the source of every notebook's first code cell (see the module)."""
    url, branch = settings(root)
    return _SETUP.format(url=url, branch=branch)


def _notebooks(root: Path) -> list[Path]:
    return sorted((root / "notebooks").glob("lab*.ipynb"))


def _labs(root: Path) -> list[str]:
    return [p.stem for p in _notebooks(root)]


def _with_badge(text: str, line: str) -> str:
    """``text`` (markdown) with its badge line replaced, or inserted after the first heading."""
    lines = text.split("\n")
    for i, old in enumerate(lines):
        if old.startswith(BADGE_PREFIX):
            lines[i] = line
            return "\n".join(lines)
    heading = next(i for i, old in enumerate(lines) if old.startswith("# "))
    return "\n".join(lines[:heading + 1] + ["", line] + lines[heading + 1:])


def _with_setup_cell(nb: dict, source: str) -> dict:
    """The notebook with its setup cell's source set, or the cell inserted before the first code cell."""
    cell = {"cell_type": "code", "execution_count": None, "id": SETUP_CELL_ID, "metadata": {},
            "outputs": [], "source": source.splitlines(keepends=True)}
    cells = nb["cells"]
    for i, old in enumerate(cells):
        if old["cell_type"] == "code" and "".join(old["source"]).startswith(SETUP_MARKER):
            cells[i] = {**old, "source": cell["source"]}
            return nb
    first_code = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"), len(cells))
    cells.insert(first_code, cell)
    return nb


def _expected(root: Path) -> dict[Path, str]:
    """File -> the text it must have (only files that exist)."""
    labs = _labs(root)
    out: dict[Path, str] = {}
    readme = root / "README.md"
    if readme.exists() and labs:
        out[readme] = _with_badge(readme.read_text(), readme_badge(labs, root))
    for lab in labs:
        handout = root / "labs" / lab / "README.md"
        if handout.exists():
            out[handout] = _with_badge(handout.read_text(), handout_badge(lab, root))
    source = setup_cell(root)
    for path in _notebooks(root):
        nb = _with_setup_cell(json.loads(path.read_text()), source)
        out[path] = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    return out


def check(root: Path = REPO_ROOT) -> list[str]:
    """Returns the files whose badge line or setup cell disagrees with ``pyproject.toml``.

    Args:
        root: the repository root.

    Returns:
        One problem per file (empty when every copy agrees).
    """
    try:
        expected = _expected(root)
    except ValueError as exc:
        return [str(exc)]
    return [f"{path.relative_to(root)}: its Colab badge line or setup cell does not match "
            "[tool.pagedlab] in pyproject.toml (run python -m reference.colab --write)"
            for path, text in expected.items() if path.read_text() != text]


def write(root: Path = REPO_ROOT) -> list[Path]:
    """Rewrites every badge line and setup cell from ``pyproject.toml``; returns the files changed."""
    changed = []
    for path, text in _expected(root).items():
        if path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference.colab", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="list the copies that disagree")
    group.add_argument("--write", action="store_true", help="rewrite them from pyproject.toml")
    args = parser.parse_args(argv)
    if args.write:
        for path in write():
            print(f"wrote {path.relative_to(REPO_ROOT)}")
        return 0
    problems = check()
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
