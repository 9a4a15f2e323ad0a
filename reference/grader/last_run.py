"""The last run's results per lab, reused by ``pagedlab status`` when nothing changed.

``pagedlab grade`` and ``status`` store each lab's results in ``.pagedlab-cache/last_run.json``
(git-ignored, never released) keyed by a fingerprint: ``LAB_IMPL`` and a hash of every file of
the lab (``labs/<lab>/``, and ``solutions/<lab>/`` when it exists) and of ``reference/``. When
the fingerprint still matches, ``status`` prints the stored results instead of running the
lab's tests again; a lab whose files changed is the only one re-run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from reference.loader import MUTANT_DIR_ENV

from reference.grader.results import TestResult
from reference.paths import LABS_DIR, REPO_ROOT, SOLUTIONS_DIR

CACHE = REPO_ROOT / ".pagedlab-cache" / "last_run.json"
_SKIP = {"__pycache__", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints"}


def _hash_tree(h, root: Path) -> None:
    if not root.is_dir():
        return
    for path in sorted(root.rglob("*")):
        if path.is_file() and not _SKIP.intersection(path.parts) and path.suffix not in (".pyc",):
            h.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())


def fingerprint(lab: str, impl: str) -> str:
    """Returns the hash of everything a lab's results depend on (files and ``LAB_IMPL``).

    Args:
        lab: lab folder name.
        impl: ``starter`` or ``solution``.
    """
    h = hashlib.sha256(f"{impl}\0{lab}\0".encode())
    for root in (LABS_DIR / lab, SOLUTIONS_DIR / lab, REPO_ROOT / "reference"):
        _hash_tree(h, root)
    return h.hexdigest()


def _read() -> dict:
    try:
        return json.loads(CACHE.read_text())
    except (OSError, ValueError):
        return {}


def load(lab: str, impl: str) -> list[TestResult] | None:
    """Returns the stored results of a lab when its fingerprint still matches, else None."""
    if os.environ.get(MUTANT_DIR_ENV):
        return None  # a mutant copy is under test: never the stored run
    entry = _read().get(lab)
    if not entry or entry.get("fingerprint") != fingerprint(lab, impl):
        return None
    try:
        return [TestResult.from_json(r) for r in entry["records"]]
    except (KeyError, ValueError):
        return None


def store(records: list[TestResult], labs: list[str], impl: str) -> None:
    """Stores a run's results for ``labs`` (a lab with no record is stored as empty).

    NOTE: failures to write (a read-only checkout) are ignored: the cache only saves time.
    """
    if os.environ.get(MUTANT_DIR_ENV):
        return  # results of a mutant copy say nothing about this checkout's files
    data = _read()
    for lab in labs:
        data[lab] = {"fingerprint": fingerprint(lab, impl),
                     "records": [r.to_json() for r in records if r.lab == lab]}
    try:
        CACHE.parent.mkdir(exist_ok=True)
        CACHE.write_text(json.dumps(data))
    except OSError:
        pass
