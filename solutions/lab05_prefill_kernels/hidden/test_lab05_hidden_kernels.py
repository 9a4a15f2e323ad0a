"""Lab 5, hidden kernel tests (instructor-only; stripped from the student release, run at grading).

Drawn from the test-design rules of issue #11 with shapes and seeds the public tests do not use:
block sizes 8 and 128, a causal diagonal that lands exactly on the first key of a 64-key tile,
ALiBi with GQA over two KV heads and history, a query tile whose rows straddle KV tiles, an
empty sequence and one-token queries without the causal mask, float32 at head size 128, and an
``out=`` buffer that starts as NaN. Caches are NaN past each context and in unused blocks.

Sizes are kept small so that every test also runs on the emulated device
(``PAGEDLAB_DEVICE=emulate``, the ``emulated`` marker); the naive kernel, the slowest there,
only gets the smallest batches.
"""

from __future__ import annotations

import pytest
import torch

from labs.lab05_prefill_kernels._cases import (KERNELS, check_close, launcher, make_batch,
                                               oracle, poison_allocator)
from reference.gpu import kernel_skip_reason, synchronize

pytestmark = [pytest.mark.emulated,
              pytest.mark.skipif(kernel_skip_reason() is not None, reason=kernel_skip_reason() or "")]


def run(impl, kernel, batch, *, causal=True, dtype="float16", what="", out=False):
    """Runs one kernel on a batch (output NaN before the call) and compares with the oracle."""
    ref = oracle(batch, causal=causal)
    kwargs = {}
    if out:
        kwargs["out"] = torch.full_like(batch["query"], float("nan"))
    else:
        poison_allocator(batch["query"].numel() * batch["query"].element_size())
    got = launcher(impl, kernel)(**batch, causal=causal, **kwargs)
    synchronize()
    if out:
        assert got is kwargs["out"], f"{kernel}: with out= the launcher must write into it and return it"
    check_close(got, ref, batch, dtype=dtype, what=f"{kernel} kernel, {what}")


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", KERNELS)
def test_hidden_causal_diagonal_on_a_kv_tile_boundary(impl, kernel):
    """Block size 8, GQA 4:2, head size 64: the last query of each sequence sits exactly on the
    first key of a 64-key tile (positions 64 and 128), or its context ends exactly on a tile
    (128 keys): that query must see its own key — one tile more than the keys before it."""
    batch = make_batch(501, [1, 3, 64], [64, 126, 64], 4, 2, 64, 8)
    run(impl, kernel, batch, what="diagonal key first in its KV tile (kv_end off by one?)")


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", KERNELS)
def test_hidden_alibi_with_gqa_over_two_kv_heads_and_history(impl, kernel):
    """ALiBi with GQA 8:2 (each query head its own slope, two KV heads) and causal history,
    block size 128: the bias uses the query head's slope and the distance key - position."""
    q_lens, hist = ([5, 2], [40, 71]) if kernel == "naive" else ([37, 70, 2], [90, 0, 140])
    batch = make_batch(511, q_lens, hist, 8, 2, 64, 128, alibi=True)
    run(impl, kernel, batch, what="ALiBi, GQA 8:2, history (slope of the KV head instead of "
                                  "the query head?)")


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", ["tiled", "tc"])
def test_hidden_query_tile_straddling_many_kv_tiles(impl, kernel):
    """A 70-token chunk after 300 tokens of history, and a 130-token one after 7: their query
    tiles span several 64-key tiles, the first rows' diagonal falls inside a tile that the last
    rows see whole (masking must follow each row), and K/V tiles are reloaded 5+ times."""
    batch = make_batch(521, [70, 130], [300, 7], 4, 4, 64, 16, dtype="bfloat16")
    run(impl, kernel, batch, dtype="bfloat16",
        what="chunks straddling KV tiles (mask per row; a barrier before the next tile?)")


@pytest.mark.points(1)
@pytest.mark.parametrize("kernel", KERNELS)
def test_hidden_non_causal_with_an_empty_sequence_and_single_tokens(impl, kernel):
    """Without the causal mask: one-token queries over 1 and 65 keys, an empty sequence (no new
    tokens) between them, into a NaN-filled ``out=`` buffer — every row sees its whole context."""
    batch = make_batch(531, [1, 0, 1, 9], [0, 12, 64, 30], 4, 1, 64, 32)
    run(impl, kernel, batch, causal=False, what="non-causal, empty sequence, one-token queries",
        out=True)


@pytest.mark.points(1)
@pytest.mark.parametrize("kernel", ["naive", "tiled"])
def test_hidden_float32_head_size_128(impl, kernel):
    """float32 at head size 128 with history (tolerance 1e-4: the kernels' fp32 path must not
    round anything to 16 bits)."""
    q_lens, hist = ([3, 1], [20, 33]) if kernel == "naive" else ([66, 1], [20, 200])
    batch = make_batch(541, q_lens, hist, 2, 2, 128, 16, dtype="float32")
    run(impl, kernel, batch, dtype="float32", what="float32, head size 128")
