"""What a lab's handout says about it: its title and whether it needs a GPU."""

from __future__ import annotations

import re

from reference.paths import LABS_DIR

_NEEDS = re.compile(r"\[(CPU-OK|GPU-REQ)\]")


def _title_line(lab: str) -> str | None:
    handout = LABS_DIR / lab / "README.md"
    if handout.is_file():
        for line in handout.read_text().splitlines():
            if line.startswith("# "):
                return line[2:]
    return None


def lab_title(lab: str) -> str:
    """Returns the handout's title without its ``#`` and tags (the folder name if there is none).

    NOTE: everything from the first tag on is dropped: Lab 4's title goes on after its tag
    ("`[GPU-REQ]` (validation and plan: `[CPU-OK]`)"), which :func:`lab_needs_text` keeps.
    """
    line = _title_line(lab)
    if line is None:
        return lab
    return _NEEDS.split(line, maxsplit=1)[0].rstrip(" `").strip()


def lab_needs_text(lab: str) -> str:
    """Returns the title's tags and what follows them, as Markdown (``[CPU-OK]`` if untagged).

    E.g. ``"`[GPU-REQ]` (validation and plan: `[CPU-OK]`)"`` for Lab 4.
    """
    line = _title_line(lab) or ""
    match = _NEEDS.search(line)
    if not match:
        return f"`[{lab_needs(lab)}]`"
    start = match.start() - 1 if line[match.start() - 1:match.start()] == "`" else match.start()
    return line[start:].strip()


def lab_needs(lab: str) -> str:
    """Returns ``CPU-OK`` or ``GPU-REQ`` from the handout's title.

    NOTE: without a tagged handout (a lab still being written) a lab with ``.cu`` files is
    taken to need a GPU.
    """
    handout = LABS_DIR / lab / "README.md"
    if handout.is_file():
        for line in handout.read_text().splitlines():
            if line.startswith("# "):
                match = _NEEDS.search(line)
                if match:
                    return match.group(1)
                break
    return "GPU-REQ" if any((LABS_DIR / lab).rglob("*.cu")) else "CPU-OK"


def todo_location(lab: str, tag: str) -> str | None:
    """Returns ``path:line`` of the first ``TODO(<tag>)`` in the lab's own files, or None.

    NOTE: ``starter.py`` is searched first: a ``.cu`` file may name a tag in a comment
    ("the ``TODO(lab4.0)`` line of starter.py") before the TODO itself, and ``decode_v0.cu``
    sorts before ``starter.py``.
    """
    needle = f"TODO({tag})"
    folder = LABS_DIR / lab
    for path in sorted(folder.rglob("*"), key=lambda p: (p.name != "starter.py", p)):
        if path.suffix not in (".py", ".cu", ".cuh") or path.name.startswith(("test_", "_")):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if needle in line:
                return f"{path.relative_to(LABS_DIR.parent)}:{number}"
    return None
