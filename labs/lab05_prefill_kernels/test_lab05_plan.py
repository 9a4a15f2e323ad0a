"""Lab 5, part B (CPU): the tile plan — the grid of the tiled and tensor-core kernels.

A plan cuts each sequence's query rows (token x head-in-group) into tiles of block_m rows,
says how many KV tiles of block_n keys each tile visits, and lists the tiles heaviest first.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def brute_force_rows(q_lens, rows_per_token):
    """Every (sequence, row) pair a plan must cover exactly once."""
    return {(s, r) for s, q in enumerate(q_lens) for r in range(q * rows_per_token)}


def cu_of(q_lens):
    return np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)


# NOTE: `impl` is the same module for every example, so the function-scoped fixture is safe here.
PLAN_SETTINGS = settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
batches = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 700)), min_size=1, max_size=6)


@pytest.mark.points(3)
@PLAN_SETTINGS
@given(batch=batches, rows_per_token=st.sampled_from([1, 4, 8]), block_m=st.sampled_from([64, 128]))
def test_plan_covers_every_query_row_exactly_once(impl, batch, rows_per_token, block_m):
    """The tiles cover every (sequence, row) exactly once, start on a multiple of block_m, and
    never run into the next sequence (a tile past a sequence's end is masked, not shared)."""
    q_lens = [q for q, _ in batch]
    ctx = np.asarray([q + h for q, h in batch], dtype=np.int32)
    plan = impl.plan_query_tiles(cu_of(q_lens), ctx, rows_per_token=rows_per_token,
                                 block_m=block_m, block_n=64)
    assert plan.work.dtype == np.int32 and plan.work.shape == (len(plan.work), 2)
    seen = []
    for s, row0 in plan.work.tolist():
        assert row0 % block_m == 0, f"tile of sequence {s} starts at row {row0}, not a multiple of {block_m}"
        num_rows = q_lens[s] * rows_per_token
        assert 0 <= row0 < num_rows, f"tile ({s}, {row0}) lies outside sequence {s}'s {num_rows} rows"
        seen += [(s, r) for r in range(row0, min(row0 + block_m, num_rows))]
    assert len(seen) == len(set(seen)), "a query row is covered by two tiles (computed twice)"
    missing = brute_force_rows(q_lens, rows_per_token) - set(seen)
    assert not missing, f"rows never computed, e.g. {sorted(missing)[:3]} (likely cause: floor " \
                        f"instead of ceil for the last partial tile)"


@pytest.mark.points(3)
@PLAN_SETTINGS
@given(batch=batches, rows_per_token=st.sampled_from([1, 4, 8]), causal=st.booleans())
def test_plan_visits_kv_tiles_only_up_to_the_diagonal(impl, batch, rows_per_token, causal):
    """A causal tile visits KV tiles up to the one holding its last row's last visible key
    (history + token): no tile wholly above the diagonal, none short of it. Non-causal: all."""
    q_lens = [q for q, _ in batch]
    ctx = [q + h for q, h in batch]
    plan = impl.plan_query_tiles(cu_of(q_lens), np.asarray(ctx, np.int32),
                                 rows_per_token=rows_per_token, block_m=64, block_n=64,
                                 causal=causal)
    for (s, row0), n in zip(plan.work.tolist(), plan.num_kv_tiles.tolist()):
        last_row = min(row0 + 64, q_lens[s] * rows_per_token) - 1
        history = ctx[s] - q_lens[s]
        last_key = history + last_row // rows_per_token if causal else ctx[s] - 1
        want = last_key // 64 + 1
        assert n == want, (f"tile (seq {s}, row {row0}): {n} KV tiles, expected {want} — its last "
                           f"row is token {last_row // rows_per_token} with history {history}")


@pytest.mark.points(2)
def test_causal_plan_skips_half_the_work_of_a_long_prompt(impl):
    """For one 4096-token prompt, a causal plan visits 2080 of the 64 x 64 = 4096 (tile, KV
    tile) pairs: the triangle, which is what tiling saves over computing and masking all."""
    plan = impl.plan_query_tiles(np.asarray([0, 4096], np.int32), np.asarray([4096], np.int32),
                                 block_m=64, block_n=64)
    assert len(plan.work) == 64
    assert int(plan.num_kv_tiles.sum()) == 64 * 65 // 2


@pytest.mark.points(2)
def test_plan_lists_heaviest_tiles_first(impl):
    """Tiles are ordered by KV tiles visited, most first, ties in (sequence, row) order, so the
    longest CTAs start first instead of running alone at the end of the grid."""
    q_lens, hist = [100, 300, 5, 64], [0, 0, 900, 10]
    plan = impl.plan_query_tiles(cu_of(q_lens), np.asarray([q + h for q, h in zip(q_lens, hist)], np.int32),
                                 block_m=64, block_n=64)
    n = plan.num_kv_tiles.tolist()
    assert n == sorted(n, reverse=True), f"KV tiles per work item {n} are not in descending order"
    assert plan.work.tolist()[0] == [2, 0], "the 5-token chunk over 900 tokens of history is heaviest"
    ties = [tuple(w) for w, k in zip(plan.work.tolist(), n) if k == n[-1]]
    assert ties == sorted(ties), f"equal tiles must keep (sequence, row) order, got {ties}"


@pytest.mark.points(1)
def test_plan_skips_empty_sequences(impl):
    """A sequence with no new tokens gets no tile, and an empty batch an empty work list."""
    plan = impl.plan_query_tiles(np.asarray([0, 0, 3, 3], np.int32), np.asarray([5, 8, 2], np.int32),
                                 rows_per_token=4)
    assert plan.work.tolist() == [[1, 0]]
    plan = impl.plan_query_tiles(np.asarray([0, 0], np.int32), np.asarray([0], np.int32))
    assert plan.work.shape == (0, 2)


@pytest.mark.points(2)
@pytest.mark.parametrize("cu, ctx, name", [
    ([1, 4], [9], "cu_seqlens_q"),
    ([0, 5, 3], [9, 9], "cu_seqlens_q"),
    ([0, 5], [9, 9], "cu_seqlens_q"),
    ([0, 5, 9], [9, 3], "context_lens"),
])
def test_plan_checks_the_metadata_values(impl, cu, ctx, name):
    """plan_query_tiles reads the metadata to the host and refuses values no kernel could run:
    cu_seqlens_q not starting at 0, decreasing, or of the wrong length; a context shorter than
    the query — ValueError naming the array."""
    with pytest.raises(ValueError, match=name):
        impl.plan_query_tiles(np.asarray(cu, np.int32), np.asarray(ctx, np.int32))
