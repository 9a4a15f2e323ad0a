"""Infrastructure (no points): Lab 6's given ``block_hash`` is the same in every process.

Its docstring promises it (a prefix cache shared across workers, and the isolated grader that
computes expected hashes in another process, rely on it). Before Python 3.12 ``hash(None)``
came from ``None``'s address, so a first block hashed with a ``None`` parent differed per run.
"""

from __future__ import annotations

import os
import subprocess
import sys

from reference.paths import REPO_ROOT

PROBE = ("from labs.lab06_serving_engine._sequence import block_hash; "
         "h = block_hash(None, [1, 2, 3, 4]); print(h, block_hash(h, [5, 6, 7, 8]))")


def test_block_hash_is_the_same_in_two_processes():
    """Two fresh interpreters with different hash seeds give the same chained hashes."""
    outs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO_ROOT))
        outs.append(subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=REPO_ROOT,
                                   capture_output=True, text=True, check=True).stdout)
    assert outs[0] == outs[1], f"block_hash differs between processes: {outs}"
