"""The release manifest: hashes of every file that decides a grade, and the tests to expect.

``pagedlab release`` writes ``.pagedlab-manifest.json`` at the root of the student repository::

    {"format": 1, "created": "...", "source_commit": "...",
     "files": {"labs/lab01_block_manager/test_lab01_allocator.py": "<sha256>", ...},
     "tests": {"lab01_block_manager": {"<node id>": <points>, ...}, ...}}

*Protected* files are the tests and their helpers (``labs/<lab>/test_*.py``, ``labs/<lab>/_*.py``),
every ``conftest.py``, ``pyproject.toml``, ``reference/**`` and a bundle's ``hidden/**``.
``pagedlab grade`` verifies the manifest when there is one and reports each protected file that
was edited, deleted or added (a new ``conftest.py`` can rewrite outcomes, so an added one counts).
The ``tests`` map is the grader's expected list: a test missing from the run fails, and points
come from here, not from the (editable) markers.

Everything else under ``labs/<lab>/`` — ``starter.py``, ``.cu`` files, helper modules a student
adds — is the student's (:func:`is_student_file`); that is all a grading bundle copies from a
submission.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST_NAME = ".pagedlab-manifest.json"
FORMAT = 1

#: Folders never walked (build output, caches, environments).
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".hypothesis",
             ".ipynb_checkpoints", "build", "dist", "node_modules"}
#: Files that change how Python or pytest start; one appearing anywhere is flagged as added.
STARTUP_FILES = ("conftest.py", "sitecustomize.py", "usercustomize.py", "*.pth")
#: Root-level files pytest may read its configuration from.
ROOT_CONFIG = ("pyproject.toml", "pytest.ini", "tox.ini", "setup.cfg", "conftest.py")
#: Importable files: one at the root shadows a module of that name in every grading process.
ROOT_CODE = (".py", ".pyc", ".pyo", ".so", ".pyd", ".pth")


def _parts(rel: str) -> list[str]:
    return rel.replace("\\", "/").split("/")


def is_protected(rel: str) -> bool:
    """Returns True for a file (path relative to the root) that decides grades.

    Args:
        rel: POSIX-style path relative to the repository root.
    """
    parts = _parts(rel)
    name = parts[-1]
    if "__pycache__" in parts:
        return False  # NOTE: grading never reads bytecode caches (runner: PYTHONPYCACHEPREFIX)
    if any(fnmatch.fnmatch(name, pat) for pat in STARTUP_FILES):
        return True
    if len(parts) == 1:
        # Code at the root is on sys.path of every grading process: a root ``pytest.py`` or
        # ``numpy.py`` would replace the real one, so any added there is flagged.
        return name in ROOT_CONFIG or name.endswith(ROOT_CODE)
    if len(parts) == 2 and name.split(".")[0] == "__init__" and name.endswith(ROOT_CODE):
        # NOTE: so is a package folder at the root: ``pytest_timeout/__init__.py`` is imported
        # instead of the installed plugin, inside the trusted test process (found by a red team).
        return True
    if parts[0] in ("reference", "hidden"):
        return True
    if parts[0] == "labs":
        if len(parts) == 2:
            return name == "__init__.py"
        # Tests (and their data files) and private helpers; starter.py and .cu files are not.
        return name.startswith(("test_", "_"))
    if parts[0] == ".github":
        return True  # the Classroom workflow decides the grade too
    return False


def is_student_file(rel: str) -> bool:
    """Returns True for a file a student owns: under ``labs/<lab>/`` and not protected."""
    parts = _parts(rel)
    return (len(parts) >= 3 and parts[0] == "labs" and parts[1].startswith("lab")
            and not is_protected(rel) and "__pycache__" not in parts)


def walk_files(root: Path) -> list[str]:
    """Returns every file under ``root`` (relative POSIX paths), skipping caches and envs; a
    symbolic link to a folder is listed like a file (never followed: see :func:`symlinks`)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        # NOTE: ``*.egg-info`` folders are walked: pytest recurses into them (its default
        # norecursedirs has ``*.egg`` only), so a conftest.py there would run in the grader.
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in filenames + links:
            out.append(Path(dirpath, name).relative_to(root).as_posix())
    return sorted(out)


def symlinks(root: Path) -> list[str]:
    """Returns every symbolic link under ``root`` outside :data:`SKIP_DIRS` (relative paths).

    NOTE: a release holds none, and any a submission adds counts as an added protected file:
    pytest and Python follow a link that the manifest's walk does not (a red team's
    ``labs/<lab>/zz -> build/pkg`` put a conftest.py into the grader; a root
    ``pytest_timeout -> node_modules/pt`` replaced a plugin).
    """
    return [rel for rel in walk_files(root) if os.path.islink(root / rel)]


def sha256_file(path: Path) -> str:
    """Returns the hex SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_manifest(root: Path, tests: dict[str, dict[str, float]], **info: str) -> dict:
    """Hashes the protected files under ``root``.

    Args:
        root: the release (or bundle) root.
        tests: lab -> {node id: points}, the tests a grader must see.
        **info: extra top-level fields (``created``, ``source_commit``).

    Returns:
        The manifest dict.
    """
    files = {rel: sha256_file(root / rel) for rel in walk_files(root)
             if is_protected(rel) and rel != MANIFEST_NAME}
    return {"format": FORMAT, **info, "files": files, "tests": tests}


def digest(manifest: dict) -> str:
    """Returns a short fingerprint of a manifest's files and tests (print it; pin it in CI).

    NOTE: ``.github/`` entries are left out: the Classroom workflow pins this digest, so it
    cannot be part of it (the manifest still hashes the workflow like any protected file).
    """
    files = {k: v for k, v in manifest["files"].items() if not k.startswith(".github/")}
    body = json.dumps({"files": files, "tests": manifest["tests"]}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def write_manifest(root: Path, manifest: dict) -> Path:
    """Writes ``root/.pagedlab-manifest.json`` and returns its path."""
    path = root / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return path


def load_manifest(path: Path) -> dict | None:
    """Reads a manifest file; None when it does not exist.

    Raises:
        ValueError: the file is not a manifest this version understands.
    """
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT or "files" not in data:
        raise ValueError(f"{path} is not a pagedlab manifest (format {FORMAT})")
    return data


@dataclass
class Tamper:
    """Protected files that differ from the manifest."""

    edited: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.edited or self.deleted or self.added)

    def files(self) -> list[str]:
        """Every flagged file."""
        return sorted(self.edited + self.deleted + self.added)

    def labs_affected(self, labs: list[str]) -> list[str]:
        """Returns the labs whose grade these files could change (all, for shared files)."""
        hit = set()
        for rel in self.files():
            parts = _parts(rel)
            if parts[0] in ("labs", "hidden") and len(parts) >= 3 and parts[1] in labs:
                hit.add(parts[1])
            else:
                return list(labs)
        return sorted(hit)

    def notes(self) -> list[str]:
        """One line per flagged file, for the summary and results.json."""
        return ([f"tampered: {f} was edited (differs from the release manifest)" for f in self.edited]
                + [f"tampered: {f} was deleted" for f in self.deleted]
                + [f"tampered: {f} was added (not in the release manifest)" for f in self.added])


def verify_manifest(root: Path, manifest: dict) -> Tamper:
    """Compares the protected files under ``root`` with a manifest.

    Args:
        root: the tree being graded.
        manifest: as written by :func:`build_manifest`.

    Returns:
        The edited, deleted and added protected files (empty when all match).
    """
    tamper = Tamper()
    present = {rel for rel in walk_files(root) if is_protected(rel) and rel != MANIFEST_NAME}
    for rel, want in sorted(manifest["files"].items()):
        if rel not in present:
            tamper.deleted.append(rel)
        elif not (root / rel).is_file() or sha256_file(root / rel) != want:
            tamper.edited.append(rel)
    tamper.added = sorted((present - set(manifest["files"])) | set(symlinks(root)))
    return tamper
