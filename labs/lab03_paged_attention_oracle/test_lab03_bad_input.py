"""Lab 3: the bad-input and NaN/inf contract — typed errors naming the argument, no silent
rounding of integers, scales finite where they are used, and non-finite data that propagates
instead of turning into a finite wrong answer."""

from __future__ import annotations

import numpy as np
import pytest

from reference.inputs import make_decode_case, make_prefill_case


def _poisoned_row(kv, seq: int, token: int):
    """(block, row) of token ``token`` of sequence ``seq`` in the paged cache."""
    bs = kv.block_size
    return int(kv.block_tables[seq, token // bs]), token % bs


@pytest.mark.points(2)
def test_infinite_or_nan_data_propagates_never_a_finite_wrong_answer(impl):
    """A -inf key row that a query reads (with a positive query its score is -inf, like a masked
    key's) makes that query's out and lse non-finite in dense_attention, paged_decode and
    paged_prefill; a NaN query makes its own output NaN; the other sequences are untouched."""
    case = make_decode_case(3, [7, 5], 2, 1, 8, 4, dtype=np.float64)
    kv = case.kv
    query = np.abs(case.query) + 0.1  # every q·k with a -inf key is then exactly -inf
    clean_out, _ = impl.paged_decode(query, kv.key_cache, kv.value_cache, kv.block_tables,
                                     kv.context_lens, case.scale)
    block, row = _poisoned_row(kv, 0, 2)
    kv.key_cache[block, 0, row, :] = -np.inf
    query[1, 0, 0] = np.nan
    out, lse = impl.paged_decode(query, kv.key_cache, kv.value_cache, kv.block_tables,
                                 kv.context_lens, case.scale)
    assert not np.isfinite(out[0]).any() and not np.isfinite(lse[0]).any(), (
        "a key of -inf read by sequence 0 gave a finite output: its score -inf was taken for a "
        "masked key and silently dropped. Turn data -inf scores into NaN (_data_neg_inf_to_nan) "
        "before masking — the NaN/inf contract says non-finite data propagates")
    assert np.isnan(out[1, 0]).all(), "a NaN query must give a NaN output (propagate)"
    assert np.isfinite(clean_out).all(), "finite data must give finite outputs"

    k = np.abs(np.random.default_rng(0).standard_normal((5, 1, 8)))
    k[1] = -np.inf
    out_d, lse_d = impl.dense_attention(np.ones((2, 2, 8)), k, np.ones((5, 1, 8)), 0.5)
    assert not np.isfinite(out_d).any(), (
        "dense_attention: a -inf key seen by both queries gave a finite output (read as masked)")
    assert not np.isfinite(lse_d).any(), (
        f"dense_attention: a -inf key seen by both queries gave a finite lse {lse_d.tolist()} "
        f"— likely cause: a finite fill value for rows whose max is not finite")

    pcase = make_prefill_case(5, [3], [4], 2, 1, 8, 4, dtype=np.float64)
    pkv = pcase.kv
    block, row = _poisoned_row(pkv, 0, 1)  # history token 1: every query sees it
    pkv.key_cache[block, 0, row, :] = -np.inf
    out_p, lse_p = impl.paged_prefill(np.abs(pcase.query) + 0.1, pkv.key_cache,
                                      pkv.value_cache, pkv.block_tables, pcase.cu_seqlens_q,
                                      pkv.context_lens, pcase.scale)
    assert not np.isfinite(out_p).any() and not np.isfinite(lse_p).any(), (
        "paged_prefill: a -inf history key seen by every query gave a finite output or lse")


@pytest.mark.points(1)
def test_scale_and_slopes_must_be_finite_where_they_are_used(impl):
    """scale must be a real number (TypeError for a string or bool), finite and > 0 in the
    arithmetic that uses it (ValueError naming scale): 10**400 overflows a float, and for
    paged_decode_lowp, which multiplies in float32 like the kernels, 1e39 is inf and 1e-50 is 0;
    ALiBi slopes likewise (ValueError naming alibi_slopes)."""
    case = make_decode_case(1, [5, 3], 2, 1, 8, 4, dtype=np.float32)
    kv = case.kv
    args = (case.query, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens)
    impl.paged_decode_lowp(*args, case.scale)
    for fn, scale, error in [
        (impl.paged_decode, "0.5", TypeError),
        (impl.paged_decode, True, TypeError),
        (impl.paged_decode, 10**400, ValueError),
        (impl.paged_decode, float("nan"), ValueError),
        (impl.paged_decode_lowp, 1e39, ValueError),
        (impl.paged_decode_lowp, 1e-50, ValueError),
    ]:
        with pytest.raises(error, match="scale") as info:
            fn(*args, scale)
        assert info.type is error, (
            f"{fn.__name__}(scale={scale!r}) must raise {error.__name__} naming scale: a "
            f"kernel given float32(scale) = inf or 0 returns NaN or a uniform softmax")
    with pytest.raises(ValueError, match="alibi_slopes"):
        impl.paged_decode_lowp(*args, case.scale, np.array([0.5, 1e39]))


@pytest.mark.points(1)
def test_integer_arguments_are_never_rounded(impl):
    """Token indices, lengths, head counts and sizes must be ints: 2.7, 3.0 or True raise
    (TypeError naming the argument; ValueError for partition_size), never become 2 or 3;
    a cache with block_size 0 is a ValueError naming key_cache, not a ZeroDivisionError;
    empty_state's head_size may be 1 but not 0."""
    case = make_decode_case(2, [9], 2, 2, 8, 4, dtype=np.float64)
    kv = case.kv
    base = (case.query[0], kv.key_cache, kv.value_cache, kv.block_tables[0])
    impl.partition_attention(*base, 9, case.scale, 4, 8)
    for kwargs, name in [
        (dict(context_len=9, start_token_idx=2.7), "start_token_idx"),
        (dict(context_len=9, end_token_idx=8.0), "end_token_idx"),
        (dict(context_len=9.0), "context_len"),
        (dict(context_len=True), "context_len"),
    ]:
        context_len = kwargs.pop("context_len")
        with pytest.raises(TypeError, match=name):
            impl.partition_attention(*base, context_len, case.scale, **kwargs)
    with pytest.raises(TypeError, match="num_q_heads"):
        impl.kv_head_indices(4.0, 2)
    with pytest.raises(TypeError, match="head_size"):
        impl.empty_state((2,), 3.0)
    with pytest.raises(ValueError, match="head_size"):
        impl.empty_state((2,), 0)
    assert impl.empty_state((2,), 1)[2].shape == (2, 1), (
        "empty_state must accept head_size 1 (the limit is >= 1) — likely cause: an "
        "off-by-one minimum")
    with pytest.raises(ValueError, match="partition_size"):
        impl.paged_decode_split_k(case.query, kv.key_cache, kv.value_cache, kv.block_tables,
                                  kv.context_lens, case.scale, 8.0)
    empty = np.zeros((2, 1, 0, 8))
    with pytest.raises(ValueError, match="key_cache"):
        impl.paged_decode(np.zeros((1, 1, 8)), empty, empty, np.zeros((1, 1), np.int32),
                          np.zeros(1, np.int32), 1.0)


@pytest.mark.points(1)
@pytest.mark.parametrize("num_rows", [2, 4])
def test_block_tables_must_have_one_row_per_query_sequence(impl, num_rows):
    """A decode batch of 3 query sequences with 2 or 4 block-table rows (and as many context
    lengths) is refused with ValueError naming block_tables and its row count — fewer rows
    never turn into an IndexError halfway through the batch, more are never silently ignored;
    300 rows for 300 sequences pass."""
    case = make_decode_case(3, [5, 9, 2], 2, 2, 8, 4, dtype=np.float64)
    kv = case.kv
    tables = np.resize(kv.block_tables, (num_rows, kv.block_tables.shape[1]))
    lens = np.resize(kv.context_lens, num_rows)
    for fn, extra in [(impl.paged_decode, ()), (impl.paged_decode_split_k, (8,)),
                      (impl.paged_decode_lowp, ())]:
        with pytest.raises(ValueError, match="block_tables") as info:
            fn(case.query, kv.key_cache, kv.value_cache, tables, lens, case.scale, *extra)
        assert str(num_rows) in str(info.value), (
            f"the error should say how many rows block_tables has ({num_rows}): {info.value}")
    # Matching counts pass at any size: 300 rows for 300 sequences (past the small-int cache).
    big = make_decode_case(num_rows, [1] * 300, 1, 1, 4, 2, dtype=np.float64)
    out, _ = impl.paged_decode(big.query, big.kv.key_cache, big.kv.value_cache,
                               big.kv.block_tables, big.kv.context_lens, big.scale)
    assert out.shape == (300, 1, 4), (
        "a batch of 300 sequences with 300 table rows was refused or mis-shaped — likely cause: "
        "counts compared with `is` (true only for small ints)")
