"""``pagedlab hint lab3.2 [--level 1|2|3]``: graded hints for one TODO, on demand.

Hints live next to each handout in ``labs/<lab>/hints.toml``, one table per TODO tag::

    ["lab3.2"]
    title = "what the TODO is about"
    see = "What to implement"          # the handout section to re-read
    level1 = "the idea"
    level2 = "the invariant or formula"
    level3 = "the shape of the code (never the code)"

``pagedlab hint 3`` lists a lab's tags and titles. Levels are cumulative: level 2 prints the
idea again first, so a hint always reads on its own.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

from reference.paths import LABS_DIR, load_toml, resolve_labs

LEVELS = (1, 2, 3)
LEVEL_NAMES = {1: "the idea", 2: "the invariant or formula", 3: "the shape of the code"}
_TAG = re.compile(r"^lab(\d+)\.(\w+)$")
#: TODO tags in a lab's own files (the docstring placeholder ``labN.k`` is not a task).
_TODO = re.compile(r"TODO\((lab\d+\.[0-9a-z]+)\)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tag", help="a TODO tag such as lab3.2, or a lab (3, lab03) to list its hints")
    parser.add_argument("--level", type=int, choices=LEVELS, default=1,
                        help="1: the idea (default); 2: the invariant or formula; 3: the code's shape")


def hints_path(lab: str) -> Path:
    """Returns the path of a lab's hints file (it may not exist)."""
    return LABS_DIR / lab / "hints.toml"


def load_hints(lab: str) -> dict[str, dict]:
    """Reads a lab's hints.

    Args:
        lab: lab folder name.

    Returns:
        TODO tag -> its table (title, see, level1..level3); empty when the lab has no hints file.
    """
    path = hints_path(lab)
    return load_toml(path.read_text()) if path.is_file() else {}


def todo_tags(lab: str) -> list[str]:
    """Returns the TODO tags of a lab's starter files (``.py``, ``.cu``), in tag order.

    Args:
        lab: lab folder name.
    """
    tags = set()
    for path in (LABS_DIR / lab).iterdir():
        if path.suffix in (".py", ".cu", ".cuh") and not path.name.startswith(("test_", "_")):
            tags.update(_TODO.findall(path.read_text(errors="replace")))
    tags.discard(f"lab{int(lab[3:5])}.k")
    return sorted(tags, key=lambda t: (int(t[3:].split(".")[0]), t.split(".")[1]))


def lab_of_tag(tag: str) -> str:
    """Returns the lab folder of a tag such as ``lab3.2``.

    Raises:
        UnknownLabError: no lab has that number.
    """
    match = _TAG.match(tag)
    return resolve_labs([match.group(1) if match else tag])[0]


def format_hint(tag: str, hint: dict, level: int) -> str:
    """Returns the text of a hint, levels 1 to ``level``.

    Args:
        tag: the TODO tag.
        hint: its table from hints.toml.
        level: the highest level to print (1..3).
    """
    lines = [f"TODO({tag}): {hint.get('title', '')}"]
    for n in range(1, level + 1):
        body = hint.get(f"level{n}", "").strip("\n")
        lines += ["", f"[level {n}: {LEVEL_NAMES[n]}]", textwrap.indent(body, "  ")]
    if level < 3:
        lines += ["", f"(more: pagedlab hint {tag} --level {level + 1})"]
    if hint.get("see"):
        lines += [f"(handout: §{hint['see']})"]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    lab = lab_of_tag(args.tag)
    hints = load_hints(lab)
    if not _TAG.match(args.tag):
        print(f"hints for {lab} (pagedlab hint <tag> --level 1|2|3):")
        for tag in todo_tags(lab):
            title = hints.get(tag, {}).get("title", "(no hint yet)")
            print(f"  {tag:<8} {title}")
        return 0
    if args.tag not in hints:
        known = ", ".join(hints) or "none"
        print(f"pagedlab hint: no hint for {args.tag} (hints for {lab}: {known})", file=sys.stderr)
        return 2
    print(format_hint(args.tag, hints[args.tag], args.level))
    return 0

