"""Infrastructure (no points): the README and the handouts name only what exists.

Every command in their fenced shell blocks names an existing command, subcommand, option,
extra and file; every repository path a handout names exists in the tree it ships in: the
workbook repository (source) and a student release (the files `pagedlab release` copies).
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

from reference.grader.release import WORKFLOW, is_released, source_files
from reference.grader.manifest import MANIFEST_NAME
from reference.paths import REPO_ROOT, lab_names, load_toml

HANDOUTS = sorted(f"labs/{lab}/README.md" for lab in lab_names())
DOCS = ["README.md", *HANDOUTS]
#: A fenced block holding this phrase is for the workbook repository only.
WORKBOOK_ONLY = "not in a student release"
#: Top-level folders of this repository: a backticked path starting with one is ours to check.
OUR_TOPS = ("labs/", "solutions/", "reference/", "notebooks/", "tests/", ".ci/", ".github/", "../")
#: Commands a shell block may use besides the workbook's own.
SHELL_BUILTINS = {"cd", "source", ".", "export", "git", "jupyter", "nvidia-smi"}
SHELL_BLOCK = re.compile(r"^```(bash|sh|shell|console)\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")


# --- the two trees --------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def tree_files(tree: str) -> frozenset[str]:
    """Returns the files of ``tree``: ``"source"`` (this checkout) or ``"release"`` (what
    `pagedlab release` of every lab copies, plus the two files it writes)."""
    files = source_files()
    if tree == "release":
        files = [f for f in files if is_released(f, lab_names())] + [WORKFLOW, MANIFEST_NAME]
    return frozenset(files)


def exists_in(tree: str, rel: str) -> bool:
    """Returns whether ``rel`` (a file, a folder ending in ``/``, or a glob) is in ``tree``."""
    rel = rel.rstrip("/")
    files = tree_files(tree)
    if any(ch in rel for ch in "*?["):
        return any(fnmatch(f, rel) or fnmatch(f, rel + "/*") for f in files)
    return rel in files or any(f.startswith(rel + "/") for f in files)


# --- commands -------------------------------------------------------------------------------

def shell_blocks(doc: str) -> list[str]:
    """Returns the text of every fenced shell block of ``doc`` (a path relative to the root)."""
    text = (REPO_ROOT / doc).read_text()
    return [m.group(2) for m in SHELL_BLOCK.finditer(text)]


def commands(block: str) -> list[list[str]]:
    """Splits a shell block into simple commands (words), dropping comments and ``VAR=x``."""
    out = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in words + ["&&"]:
            if word in ("&&", "||", ";", "|"):
                while current and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", current[0]):
                    current.pop(0)
                if current:
                    out.append(current)
                current = []
            else:
                current.append(word)
    return out


@functools.lru_cache(maxsize=None)
def subcommand_options(name: str) -> frozenset[str]:
    """Returns the option strings of ``pagedlab NAME``."""
    from reference.tools.cli import _parser

    parser = _parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return frozenset(o for a in sub.choices[name]._actions for o in a.option_strings)


@functools.lru_cache(maxsize=1)
def pytest_options() -> str:
    """Returns ``pytest --help`` (with the workbook's plugins), to look options up in."""
    return subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
                          cwd=REPO_ROOT, capture_output=True, text=True).stdout


def check_path(tree: str, word: str) -> str | None:
    """Returns a problem with a file argument, or None (``.venv/…`` is made by the Quickstart)."""
    if word.startswith((".venv/", "-")) or "://" in word or word.startswith(".[") or word == ".":
        return None
    if "/" in word or word.endswith((".py", ".sh", ".ipynb")):
        if word.startswith("../") and not word.startswith("../pagedattention-lab"):
            return f"{word} lies outside the repository"
        if not word.startswith("../") and not exists_in(tree, word):
            return f"{word} does not exist in the {tree} tree"
    return None


def check_command(tree: str, words: list[str]) -> list[str]:
    """Returns what is wrong with one simple command (empty when it names only real things)."""
    from reference.tools.cli import COMMANDS, _benchmarks

    prog, args = Path(words[0]).name, words[1:]
    if words[0].startswith(("./", ".ci/", "reference/")):  # a script run by its path
        return [p for p in [check_path(tree, words[0])] if p]
    problems = []
    if prog == "pagedlab":
        if not args or (args[0] not in COMMANDS and args[0] != "bench"):
            return [f"`pagedlab {' '.join(args[:1])}` is no pagedlab command"]
        if args[0] == "bench":
            if len(args) < 2 or args[1] not in _benchmarks():
                problems.append(f"`pagedlab bench {' '.join(args[1:2])}`: no such benchmark")
            return problems
        known = subcommand_options(args[0])
        for word in args[1:]:
            if word.startswith("-") and word.split("=")[0] not in known:
                problems.append(f"`pagedlab {args[0]}` has no option {word}")
            elif not word.startswith("-"):
                problems += [p for p in [check_path(tree, word)] if p]
    elif prog == "pytest" or (prog.startswith("python") and args[:2] == ["-m", "pytest"]):
        args = args[2:] if prog.startswith("python") else args
        for word in args:
            if word.startswith("--") and word.split("=")[0] not in pytest_options():
                problems.append(f"pytest has no option {word}")
            elif not word.startswith("-"):
                problems += [p for p in [check_path(tree, word)] if p]
    elif prog == "pip" or (prog.startswith("python") and args[:2] == ["-m", "pip"]):
        extras = set(load_toml((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        for word in args:
            for extra in re.findall(r"\.\[([\w,-]+)\]", word):
                problems += [f"pyproject.toml has no extra [{e}]" for e in extra.split(",")
                             if e not in extras]
    elif prog.startswith("python"):
        if args[:2] not in (["-m", "venv"], ["-m", "reference.tools.cli"]):
            problems.append(f"`{' '.join(words[:3])}`: not a command of this workbook")
    elif prog == "bash":
        if not args or (not args[0].startswith("../") and not exists_in(tree, args[0])):
            problems.append(f"bash {' '.join(args[:1])}: no such script in the {tree} tree")
        elif args[0].startswith("../"):
            problems.append(f"{args[0]} lies outside the repository")
    elif words[0] not in SHELL_BUILTINS:
        problems.append(f"`{words[0]}` is neither a workbook command nor a shell builtin")
    return problems


@pytest.mark.parametrize("tree", ["source", "release"])
@pytest.mark.parametrize("doc", DOCS)
def test_every_printed_command_names_something_that_exists(doc, tree):
    """Each command in the doc's fenced shell blocks names an existing pagedlab subcommand,
    benchmark, option, pytest option, pip extra or file — in the workbook repository and in a
    student release (blocks marked "not in a student release" are checked in the source only)."""
    if tree == "release" and doc not in tree_files("release"):
        pytest.skip(f"{doc} is not in a student release")
    problems = []
    for block in shell_blocks(doc):
        if tree == "release" and WORKBOOK_ONLY in block:
            continue
        for words in commands(block):
            problems += [f"{' '.join(words)}\n    -> {p}" for p in check_command(tree, words)]
    assert not problems, (f"{doc} prints commands that cannot run as written ({tree} tree):\n"
                          + "\n".join(problems))


# --- paths a handout names -------------------------------------------------------------------

CODE_PATH = re.compile(r"(?<![\w/.])((?:\.\./|labs/|solutions/|reference/|notebooks/|tests/|"
                       r"\.ci/|\.github/)[\w./*-]*)")


def named_paths(doc: str, text: str | None = None) -> list[tuple[str, str]]:
    """Returns (path, the line it is on) for every repository path ``doc`` names.

    A path is a backticked span, or a word of a fenced block (comments included), starting
    with one of this repository's top-level folders (or ``../``); or a bare file name in the
    handout's "## Files" table (relative to the lab folder, or to the folder of another path
    on the same row).

    Args:
        doc: the handout, relative to the repository root.
        text: its text (default: read from ``doc``).
    """
    lab_dir = str(Path(doc).parent)
    out, in_files, in_code = [], False, False
    for line in (text if text is not None else (REPO_ROOT / doc).read_text()).splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            out += [(m, line) for m in CODE_PATH.findall(line)]
            continue
        if line.startswith("## "):
            in_files = line.strip() == "## Files"
        spans = [s.strip() for s in SPAN.findall(line) if " " not in s.strip()]
        dirs = [str(Path(s).parent) for s in spans if s.startswith(OUR_TOPS) and "/" in s]
        for span in spans:
            if span.startswith(OUR_TOPS):
                out.append((span, line))
            elif in_files and re.fullmatch(r"[\w*.-]+\.(py|cu|cuh|toml|json|sh|ipynb)", span):
                candidates = [f"{lab_dir}/{span}"] + [f"{d}/{span}" for d in dirs]
                out.append(("|".join(candidates), line))
    return out


@pytest.mark.parametrize("tree", ["source", "release"])
@pytest.mark.parametrize("doc", HANDOUTS)
def test_every_path_a_handout_names_exists_where_it_ships(doc, tree):
    """Each repository path the handout names exists in the workbook repository and in a
    student release: a release ships what its handouts cite, or the handouts do not cite it."""
    missing = []
    for path, line in named_paths(doc):
        if path.startswith("../"):
            missing.append(f"{path} (outside the repository: no user has it)\n    in: {line.strip()}")
        elif not any(exists_in(tree, p) for p in path.split("|")):
            missing.append(f"{path.split('|')[0]}\n    in: {line.strip()}")
    assert not missing, (f"{doc} names paths that do not exist in the {tree} tree (a student "
                         "release holds no solutions/, tests/ or .ci/):\n" + "\n".join(missing))


def test_named_paths_finds_paths_in_prose_tables_and_code_comments():
    """Paths are found in backticks, in a Files table (bare names) and in a code block's
    comment — where the old Lab 4 handout named ../shared/tools/flashinfer_wheels.sh."""
    text = ("## Files\n| `starter.py` | x |\n## Run\n```bash\n"
            "pagedlab bench decode   # via ../shared/tools/x.sh\n```\nsee `.ci/gpu_lab04.sh`\n")
    found = [p for p, _ in named_paths("labs/lab04_decode_kernels/README.md", text)]
    assert found == ["labs/lab04_decode_kernels/starter.py", "../shared/tools/x.sh", ".ci/gpu_lab04.sh"]


def test_the_checks_catch_what_they_are_for():
    """The checkers themselves: a missing file, an unknown subcommand or option, an unknown
    extra and a path outside the repository are each reported."""
    assert check_command("source", ["pagedlab", "grade", "--no-such-flag"])
    assert check_command("source", ["pagedlab", "teleport"])
    assert check_command("source", ["pagedlab", "bench", "nothing"])
    assert check_command("source", ["pip", "install", "-e", ".[nope]"])
    assert check_command("source", ["bash", ".ci/nothing.sh"])
    assert check_command("release", ["bash", ".ci/run"])
    assert check_command("source", ["frobnicate"])
    assert not check_command("source", ["pagedlab", "grade", "1", "--no-hidden"])
    assert not exists_in("release", "solutions/lab01_block_manager/solution.py")
    assert exists_in("source", "labs/lab01_block_manager/test_lab01_*.py")
    assert commands("LAB_IMPL=starter pagedlab grade 1   # points") == [["pagedlab", "grade", "1"]]


# --- a release, run from its own README ------------------------------------------------------

#: README commands the offline end-to-end run leaves out: they install (network), open a UI,
#: run every lab (minutes on 2 cores; `pagedlab release` itself grades every lab), or time
#: kernels (speed grading needs a GPU; without one it exits 2 by design: tests/test_speed.py).
NOT_RUN_OFFLINE = re.compile(r"^(pip|python3? -m venv|\.venv/bin/pip|source|\.|jupyter)\b"
                             r"|^pagedlab (status|grade)$|^pytest labs/$"
                             r"|^pagedlab grade .*--speed")
#: Exit codes of a run that ended in test failures only (pytest 1) or finished (0); anything
#: else (2 interrupted, 3 internal error, 4 usage error, 5 nothing collected) is a broken doc.
FAILED_OR_PASSED = {0, 1}


@pytest.fixture(scope="module")
def built_release(tmp_path_factory):
    """A release of every lab (not verified in a venv: test_release.py does that)."""
    from reference.grader.release import build_release

    out = tmp_path_factory.mktemp("release") / "student"
    _, problems = build_release(out, lab_names(), log=lambda *a: None)
    assert not problems, "the release has problems:\n" + "\n".join(problems)
    return out


def offline_commands(text: str) -> list[str]:
    """Returns the README commands (one per shell line, comment and ``VAR=x`` dropped) that the
    offline run executes: ``pytest …`` and ``pagedlab …`` of one lab."""
    out = []
    for block in SHELL_BLOCK.finditer(text):
        if WORKBOOK_ONLY in block.group(2):
            continue
        for line in block.group(2).splitlines():
            words = shlex.split(line, comments=True)
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                words.pop(0)
            cmd = shlex.join(words)
            if words and words[0] in ("pytest", "pagedlab") and not NOT_RUN_OFFLINE.search(cmd) \
                    and "&&" not in words and words[:2] != ["pagedlab", "bench"]:
                out.append(cmd)
    return out


def run_in_release(root: Path, cmd: str) -> subprocess.CompletedProcess:
    """Runs a README command in a release the way the README's venv would: its own code first
    on the path, ``LAB_IMPL`` unset (a release grades the starters by default)."""
    import os

    words = shlex.split(cmd)
    prog = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"] if words[0] == "pytest" \
        else [sys.executable, "-m", "reference.tools.cli"]
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_IMPL", "PYTEST_ADDOPTS")}
    env.update(PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([*prog, *words[1:]], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_a_release_runs_the_commands_its_readme_prints(built_release):
    """Every `pytest …` and one-lab `pagedlab …` line of the student README and of Labs 1 and 3's
    Run sections runs in a fresh release as printed: tests and notebook cells fail only with
    their `TODO(labN.k)` (no collection error, no crash, no usage error) and the pagedlab
    commands (grade, hint, show, doctor) finish and name the TODOs."""
    readme = (built_release / "README.md").read_text()
    cmds = offline_commands(readme)
    for lab in ("lab01_block_manager", "lab03_paged_attention_oracle"):
        cmds += offline_commands((built_release / "labs" / lab / "README.md").read_text())
    assert any(c.startswith("pytest --nbval-lax") for c in cmds) and any(
        c.startswith("pagedlab hint") for c in cmds), f"the README lost its commands: {cmds}"
    problems = []
    for cmd in dict.fromkeys(cmds):
        proc = run_in_release(built_release, cmd)
        out = proc.stdout + proc.stderr
        bad = [w for w in ("ERROR collecting", "INTERNALERROR", "Traceback (most recent call last)",
                           "NameError", "ModuleNotFoundError") if w in out and "nbval" not in cmd]
        if proc.returncode not in FAILED_OR_PASSED or bad:
            problems.append(f"{cmd}: exit {proc.returncode} {bad}\n{out[-1500:]}")
        elif proc.returncode == 1 and "TODO(" not in out:
            problems.append(f"{cmd}: failed without naming a TODO\n{out[-1500:]}")
        elif "nbval" in cmd and "TODO(" not in out.split("Traceback:")[1 if "Traceback:" in out else 0]:
            problems.append(f"{cmd}: the first failing notebook cell does not name its TODO\n"
                            f"{out[-1500:]}")
    assert not problems, ("commands the student README or a handout prints do not run as "
                          "described in a fresh release:\n" + "\n\n".join(problems))
    assert "# the reference solution" not in "\n".join(
        (built_release / "labs" / lab / "README.md").read_text() for lab in lab_names()), \
        "a handout's Run section says pytest runs the reference solution: a release has none"


def test_offline_commands_keeps_one_lab_runs_and_drops_installs():
    """The README filter runs pytest and one-lab pagedlab lines, not installs or all-lab runs."""
    text = ("```bash\npython3 -m venv .venv\n.venv/bin/pip install -e '.[dev]'\npagedlab status\n"
            "pytest labs/lab01_block_manager -q   # one lab\nLAB_IMPL=starter pagedlab grade 1\n"
            "pagedlab grade\npytest labs/\npagedlab bench blocks\n```\n")
    assert offline_commands(text) == ["pytest labs/lab01_block_manager -q", "pagedlab grade 1"]
