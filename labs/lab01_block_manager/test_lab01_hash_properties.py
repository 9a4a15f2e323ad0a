"""Lab 1, Part C: what the prefix-cache hash promises — every token counts, no two prefixes
collide by construction, a non-negative 64-bit int, and the same value in every process."""

from __future__ import annotations

import json
import random
import sys

import pytest

from reference.child import run_with_implementation

LAB = "lab01_block_manager"

# Blocks hashed in the test process and again in child processes with other hash seeds.
_PROBE_BLOCKS = [[], [0], [7, 7, 7], list(range(16)), [50_000, 3, 128_000, 1]]

_CHILD = """
import json, sys
from reference.loader import load_impl
impl = load_impl(sys.argv[1])
blocks = json.loads(sys.argv[2])
parent, out = None, []
for tokens in blocks:
    parent = impl.hash_block_tokens(parent, tokens)
    out.append(parent)
out.append(impl.hash_prompt_blocks(list(range(40)), 8))
print(json.dumps(out))
"""


def _hashes_in_a_child(hash_seed: str) -> list:
    # NOTE: the child runs the implementation: graded isolated, as the worker user.
    done = run_with_implementation([sys.executable, "-s", "-c", _CHILD, LAB,
                                    json.dumps(_PROBE_BLOCKS)],
                                   env={"PYTHONHASHSEED": hash_seed}, timeout=120)
    assert done.returncode == 0, f"the child process failed:\n{done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.points(2)
def test_block_hash_is_identical_across_processes(impl):
    """hash_block_tokens and hash_prompt_blocks give the same values in processes started with
    different PYTHONHASHSEEDs (two engine workers, or an engine after a restart)."""
    parent, here = None, []
    for tokens in _PROBE_BLOCKS:
        parent = impl.hash_block_tokens(parent, tokens)
        here.append(parent)
    here.append(impl.hash_prompt_blocks(list(range(40)), 8))
    for seed in ("1", "2"):
        there = _hashes_in_a_child(seed)
        assert there == here, (
            f"a process with PYTHONHASHSEED={seed} computed other hashes for the same blocks — "
            f"likely cause: Python's built-in hash() (salted per process for str and bytes); "
            f"use hashlib"
        )


@pytest.mark.points(1)
def test_block_hash_covers_every_token(impl):
    """Changing any one token of a block (first, middle, last), or the parent, changes the hash."""
    rng = random.Random(11)
    for block_size in (1, 5, 16):
        tokens = [rng.randrange(32_000) for _ in range(block_size)]
        parent = impl.hash_block_tokens(None, [rng.randrange(32_000) for _ in range(block_size)])
        h = impl.hash_block_tokens(parent, tokens)
        for i in range(block_size):
            changed = list(tokens)
            changed[i] += 1
            assert impl.hash_block_tokens(parent, changed) != h, (
                f"block_size={block_size}: changing token {i} did not change the hash — "
                f"likely cause: a token left out of the hashed payload (a slice one short?)"
            )
        assert impl.hash_block_tokens(parent + 1, tokens) != h, "the parent hash must count"
        assert impl.hash_block_tokens(None, tokens) != h, "a first block differs from a later one"


@pytest.mark.points(1)
def test_block_hash_separates_token_boundaries(impl):
    """Blocks whose token digits concatenate alike — [1, 23] and [12, 3], or parent 1 with
    tokens [23] and parent 12 with [3] — hash differently."""
    pairs = [((None, [1, 23]), (None, [12, 3])), ((1, [23]), (12, [3])),
             ((None, [1, 2, 3]), (None, [12, 3])), ((11, [1]), (1, [11]))]
    for (pa, ta), (pb, tb) in pairs:
        assert impl.hash_block_tokens(pa, ta) != impl.hash_block_tokens(pb, tb), (
            f"hash_block_tokens({pa}, {ta}) == hash_block_tokens({pb}, {tb}): two different "
            f"prefixes collide — likely cause: parent and tokens concatenated without separators"
        )


@pytest.mark.points(1)
def test_block_hash_is_a_non_negative_64_bit_int(impl):
    """Every block hash is an int in [0, 2**64) that uses all 64 bits, as documented (it is a
    dict key and an id: fewer bits mean more collisions)."""
    rng = random.Random(5)
    parent, hashes = None, []
    for _ in range(200):
        parent = impl.hash_block_tokens(parent, [rng.randrange(50_000) for _ in range(4)])
        assert isinstance(parent, int) and not isinstance(parent, bool), (
            f"a block hash must be an int, got {type(parent).__name__}")
        assert 0 <= parent < 2**64, (
            f"block hash {parent} is outside [0, 2**64) — likely cause: the digest read as a "
            f"signed integer, or more than 8 bytes of it kept"
        )
        hashes.append(parent)
    # 200 uniform 64-bit values all below 2**60 has probability 16**-200: fewer bits were kept.
    assert max(hashes) >= 2**60, (
        "no hash of 200 reaches 2**60: the hash keeps fewer than 64 bits (more collisions) — "
        "likely cause: fewer than 8 bytes of the digest kept"
    )


@pytest.mark.points(1)
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_prompt_hashes_include_an_exactly_full_last_block(impl, block_size):
    """A prompt of exactly k full blocks gets k hashes, and one token fewer or more gets
    ``len // block_size``, for block sizes that are and are not powers of two."""
    for num_full in (1, 2, 3):
        n = num_full * block_size
        prompt = list(range(100, 100 + n + 1))
        for length in (n - 1, n, n + 1):
            want = length // block_size
            got = impl.hash_prompt_blocks(prompt[:length], block_size)
            assert len(got) == want, (
                f"block_size={block_size}: a prompt of {length} tokens holds {want} full blocks, "
                f"got {len(got)} hashes — likely cause: an off-by-one in the range of block "
                f"starts (a block that ends exactly at the prompt's end is full)"
            )


@pytest.mark.points(1)
def test_prompt_hashes_are_chained_block_by_block(impl):
    """hash_prompt_blocks chains each block to the one before, so a prompt repeating one block
    gets a different hash for each repetition."""
    block = [4, 8, 15, 16, 23]
    hashes = impl.hash_prompt_blocks(block * 3, 5)
    assert len(set(hashes)) == 3, (
        f"the same 5 tokens at blocks 0, 1, 2 got hashes {hashes}: they must all differ — likely "
        f"cause: every block hashed with parent None instead of the previous block's hash"
    )
    parent = None
    for i, h in enumerate(hashes):
        parent = impl.hash_block_tokens(parent, block)
        assert h == parent, f"hash {i} must be hash_block_tokens(hash {i - 1}, block {i})"


@pytest.mark.points(1)
@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (4.0, TypeError)])
def test_hash_prompt_blocks_rejects_bad_block_size(impl, bad, error):
    """block_size must be an int >= 1; the typed error names block_size."""
    with pytest.raises(error, match="block_size"):
        impl.hash_prompt_blocks(list(range(8)), bad)
