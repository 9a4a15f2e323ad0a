"""What a lab's handout says about it: its title and whether it needs a GPU."""

from __future__ import annotations

import re

from reference.paths import LABS_DIR

_NEEDS = re.compile(r"\[(CPU-OK|GPU-REQ)\]")


def lab_title(lab: str) -> str:
    """Returns the handout's title without its ``#`` and tag (the folder name if there is none)."""
    handout = LABS_DIR / lab / "README.md"
    if handout.is_file():
        for line in handout.read_text().splitlines():
            if line.startswith("# "):
                return _NEEDS.sub("", line[2:]).replace("`", "").strip()
    return lab


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
    """Returns ``path:line`` of the first ``TODO(<tag>)`` in the lab's own files, or None."""
    needle = f"TODO({tag})"
    folder = LABS_DIR / lab
    for path in sorted(folder.rglob("*")):
        if path.suffix not in (".py", ".cu", ".cuh") or path.name.startswith(("test_", "_")):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if needle in line:
                return f"{path.relative_to(LABS_DIR.parent)}:{number}"
    return None
