"""Lab 3, Task 2: the online-softmax recurrence and paged decode, against the float64 oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labs.lab03_paged_attention_oracle._compare import (
    assert_attention_close,
    check_decode,
    decode_args,
    decode_oracle,
)
from reference.inputs import make_decode_case
from reference.layout import PAD_BLOCK_ID

LN3, LN6, LN2 = math.log(3.0), math.log(6.0), math.log(2.0)


def _softmax_state(scores, values):
    """The closed form for one head: (out, lse) of softmax(scores) @ values, in float64."""
    m = scores.max()
    p = np.exp(scores - m)
    return p @ values / p.sum(), m + np.log(p.sum())


def _hand_traced_cache():
    """The handout's example: 4 tokens, block_size 2, logical blocks 0, 1 in physical 3, 1."""
    key_cache = np.full((4, 1, 2, 2), np.nan)
    value_cache = np.full((4, 1, 2, 2), np.nan)
    key_cache[3, 0] = [[0.0, 0.0], [LN3, 0.0]]  # tokens 0, 1: scores 0, ln 3 (q = [1, 0])
    key_cache[1, 0] = [[LN6, 0.0], [LN2, 0.0]]  # tokens 2, 3: scores ln 6, ln 2
    value_cache[3, 0] = [[12.0, 0.0], [0.0, 12.0]]
    value_cache[1, 0] = [[6.0, 6.0], [0.0, -12.0]]
    block_tables = np.array([[3, 1, PAD_BLOCK_ID]], dtype=np.int32)
    return key_cache, value_cache, block_tables


@pytest.mark.points(2)
def test_hand_traced_two_block_example(impl):
    """The handout's two-block trace, step by step: the correction 1/2 halves the first block.

    Block 0 (scores 0, ln 3) gives m = ln 3, l = 4/3, acc = [4, 12]; block 1 (scores ln 6,
    ln 2) raises the max to ln 6, so the history is rescaled by exp(ln 3 - ln 6) = 1/2:
    l = 2, acc = [8, 8]; out = [4, 4], lse = ln 12.
    """
    m, l, acc = impl.empty_state((1,), 2)
    m, l, acc = impl.online_softmax_update(m, l, acc, np.array([[0.0, LN3]]),
                                           np.array([[[12.0, 0.0], [0.0, 12.0]]]))
    np.testing.assert_allclose([m[0], l[0], *acc[0]], [LN3, 4 / 3, 4.0, 12.0], rtol=1e-12,
                               err_msg="after block 0: expected m = ln 3, l = 4/3, acc = [4, 12]")
    m, l, acc = impl.online_softmax_update(m, l, acc, np.array([[LN6, LN2]]),
                                           np.array([[[6.0, 6.0], [0.0, -12.0]]]))
    np.testing.assert_allclose(
        [m[0], l[0], *acc[0]], [LN6, 2.0, 8.0, 8.0], rtol=1e-12,
        err_msg="after block 1: expected m = ln 6, l = 2, acc = [8, 8]. Without the correction "
                "factor (1/2 here) you get l = 8/3, acc = [10, 14], out = [3.75, 5.25]")
    out, lse = impl.finalize_state(m, l, acc)
    np.testing.assert_allclose([*out[0], lse[0]], [4.0, 4.0, math.log(12.0)], rtol=1e-12)

    key_cache, value_cache, block_tables = _hand_traced_cache()
    out, lse = impl.paged_decode(np.array([[[1.0, 0.0]]]), key_cache, value_cache, block_tables,
                                 np.array([4], dtype=np.int32), 1.0)
    np.testing.assert_allclose([*out[0, 0], lse[0, 0]], [4.0, 4.0, math.log(12.0)], rtol=1e-12,
                               err_msg="paged_decode of the hand-traced cache")


@pytest.mark.points(2)
def test_online_softmax_matches_softmax_for_any_blocking(impl):
    """Streaming any split of a score row through the recurrence gives exactly softmax(row) @ V.

    Hypothesis picks the row (logits up to ±60, so the max moves up *and* down between blocks)
    and the block boundaries; the result must match the closed form to 1e-12.
    """
    @settings(max_examples=60)
    @given(st.integers(1, 40), st.data())
    def check(n, data):
        rng = np.random.default_rng(n)
        scores = rng.uniform(-60.0, 60.0, size=n) * rng.uniform(0.01, 1.0)
        values = rng.standard_normal((n, 3))
        cuts = sorted(data.draw(st.sets(st.integers(1, n - 1), max_size=8)) if n > 1 else [])
        m, l, acc = impl.empty_state((), 3)
        for lo, hi in zip([0, *cuts], [*cuts, n]):
            m, l, acc = impl.online_softmax_update(m, l, acc, scores[lo:hi], values[lo:hi])
        out, lse = impl.finalize_state(m, l, acc)
        want_out, want_lse = _softmax_state(scores, values)
        np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12,
                                   err_msg=f"blocks {[0, *cuts, n]}: output differs from softmax — "
                                           "is the history rescaled by exp(m_old - m_new)?")
        np.testing.assert_allclose(lse, want_lse, rtol=1e-12)

    check()


@pytest.mark.points(1)
def test_fully_masked_block_leaves_the_state_unchanged(impl):
    """A block whose scores are all -inf is the identity, even as the very first block.

    Kernels meet such blocks whenever a whole tile falls outside a causal or padding mask. Before
    any key, m is -inf, and exp(m - m_new) = exp(-inf - -inf) is NaN unless you guard it.
    """
    values = np.ones((2, 4, 3))
    masked = np.full((2, 4), -np.inf)
    m, l, acc = impl.online_softmax_update(*impl.empty_state((2,), 3), masked, values)
    assert np.isneginf(m).all() and (l == 0).all() and (acc == 0).all(), (
        f"a fully masked first block changed the empty state: m={m}, l={l}, acc={acc[:, 0]} "
        f"(NaN means exp(-inf - -inf) was evaluated; subtract a finite stand-in for m_new = -inf)"
    )
    scores = np.array([[1.0, 2.0, -np.inf, 0.5], [0.0, -np.inf, -np.inf, -np.inf]])
    state = impl.online_softmax_update(m, l, acc, scores, values * np.arange(4)[None, :, None])
    after = impl.online_softmax_update(*state, masked, values)
    for name, a, b in zip("m l acc".split(), state, after):
        assert np.array_equal(a, b), f"a fully masked block changed {name}: {a} -> {b}"


@pytest.mark.points(1)
@pytest.mark.parametrize("num_q_heads, num_kv_heads, want", [
    (4, 4, [0, 1, 2, 3]), (8, 2, [0, 0, 0, 0, 1, 1, 1, 1]), (4, 1, [0, 0, 0, 0]),
])
def test_kv_head_indices_group_consecutive_query_heads(impl, num_q_heads, num_kv_heads, want):
    """Query head h reads KV head h // (num_q_heads // num_kv_heads); a bad ratio is a ValueError."""
    got = impl.kv_head_indices(num_q_heads, num_kv_heads).tolist()
    assert got == want, f"kv_head_indices({num_q_heads}, {num_kv_heads}) = {got}, expected {want}"
    with pytest.raises(ValueError, match="num_q_heads"):
        impl.kv_head_indices(6, 4)


@pytest.mark.points(2)
def test_paged_decode_matches_oracle_block_aligned(impl):
    """Contexts that fill whole blocks (8, 16, 32, 64 tokens, block_size 8) match the oracle to 1e-6."""
    case = make_decode_case(11, [8, 16, 32, 64], 4, 4, 16, 8, dtype=np.float64)
    check_decode(impl, case, hint="with whole blocks only the recurrence can be wrong: "
                                  "check the correction factor")


@pytest.mark.points(2)
def test_paged_decode_matches_oracle_ragged_lengths(impl):
    """Ragged contexts (1, 3, 9, 17, 30, 100 tokens) in scattered blocks match the oracle to 1e-6."""
    case = make_decode_case(12, [1, 3, 9, 17, 30, 100], 4, 2, 16, 8, dtype=np.float64)
    check_decode(impl, case)


@pytest.mark.points(1)
def test_partial_last_block_reads_only_valid_rows(impl):
    """13 tokens with block_size 4 are 3 full blocks and 1 row; the other 3 rows are NaN and unread."""
    case = make_decode_case(13, [13, 5, 2], 2, 1, 8, 4, dtype=np.float64)
    check_decode(impl, case, hint="read min(block_size, context_len - block_start) rows of a block")


@pytest.mark.points(1)
def test_context_of_one_token_returns_its_value(impl):
    """With one key, softmax is 1: out is that token's value and lse its score, for every head."""
    case = make_decode_case(14, [1, 1], 4, 2, 16, 8, dtype=np.float64)
    out, lse = impl.paged_decode(*decode_args(case))
    for s in range(2):
        for h in range(4):
            want = case.kv.values[s][0, h // 2]
            score = case.query[s, h] @ case.kv.keys[s][0, h // 2] * case.scale
            np.testing.assert_allclose(out[s, h], want, rtol=1e-12, atol=1e-12,
                                       err_msg=f"seq {s} head {h}: one key must be copied through")
            np.testing.assert_allclose(lse[s, h], score, rtol=1e-12, atol=1e-12)


@pytest.mark.points(2)
def test_zero_length_sequence_gives_zero_output_and_neg_inf_lse(impl):
    """context_len 0 gives out exactly 0 and lse -inf (the empty state), and leaves its neighbours alone.

    The workbook's contract (reference/oracle.py): zero output and -inf log-sum-exp, never NaN,
    so that merging it with anything is the identity. Its block-table row is all PAD_BLOCK_ID.
    """
    case = make_decode_case(15, [0, 5, 0, 16], 4, 4, 16, 8, dtype=np.float64)
    out, lse = impl.paged_decode(*decode_args(case))
    for s in (0, 2):
        assert not np.isnan(out[s]).any() and not np.isnan(lse[s]).any(), (
            f"seq {s} (context_len 0) has NaN: acc / l with l = 0 is 0/0 — return 0 where l == 0")
        assert (out[s] == 0).all(), f"seq {s} (context_len 0): out must be exactly 0, got {out[s]}"
        assert np.isneginf(lse[s]).all(), f"seq {s} (context_len 0): lse must be -inf, got {lse[s]}"
    check_decode(impl, case)


@pytest.mark.points(1)
def test_paging_invariance(impl):
    """The same logical sequences in two different physical placements give bit-identical output.

    The block table is the only link between logical and physical order, so moving every block
    elsewhere (and rewriting the table) cannot change a single bit of the result.
    """
    case = make_decode_case(16, [7, 20, 33], 4, 2, 16, 4, dtype=np.float64)
    kv = case.kv
    perm = np.random.default_rng(0).permutation(kv.key_cache.shape[0])  # old block b -> perm[b]
    key_cache, value_cache = np.empty_like(kv.key_cache), np.empty_like(kv.value_cache)
    key_cache[perm], value_cache[perm] = kv.key_cache, kv.value_cache
    tables = np.where(kv.block_tables == PAD_BLOCK_ID, PAD_BLOCK_ID, perm[kv.block_tables])
    out_a, lse_a = impl.paged_decode(*decode_args(case))
    out_b, lse_b = impl.paged_decode(case.query, key_cache, value_cache, tables.astype(np.int32),
                                     kv.context_lens, case.scale)
    assert np.array_equal(out_a, out_b) and np.array_equal(lse_a, lse_b), (
        f"moving blocks changed the output by up to {np.nanmax(np.abs(out_a - out_b)):.3g}: "
        f"something depends on the physical block id instead of going through block_tables"
    )


@pytest.mark.points(1)
@pytest.mark.parametrize("logit_scale", [90.0, 1000.0])
def test_large_logits_do_not_overflow(impl, logit_scale):
    """Logits around ±90 and ±1000 (exp overflows float64 past 709) give finite, exact results.

    Subtracting the running max keeps every exponent <= 0, whatever the logits.
    """
    case = make_decode_case(17, [5, 24, 40], 2, 2, 16, 8, dtype=np.float64)
    biggest = max(np.abs(np.einsum("hd,thd->th", case.query[s], keys)).max()
                  for s, keys in enumerate(case.kv.keys)) * case.scale
    case.query *= logit_scale / biggest  # the largest |logit| is now exactly logit_scale
    out, lse = impl.paged_decode(*decode_args(case))
    assert np.isfinite(out).all() and np.isfinite(lse).all(), (
        f"logits ~ ±{logit_scale:g} overflowed: exp() of an unshifted score (subtract the running max)")
    want_out, want_lse = decode_oracle(case)
    assert_attention_close(out, want_out, atol=1e-6, what="paged_decode out")
    np.testing.assert_allclose(lse, want_lse, rtol=1e-9)


@pytest.mark.points(2)
@pytest.mark.parametrize("num_kv_heads", [8, 2, 1], ids=["ratio1", "ratio4", "ratio8"])
def test_gqa_ratios_match_oracle(impl, num_kv_heads):
    """8 query heads over 8, 2 or 1 KV heads (GQA ratios 1, 4, 8) match the oracle to 1e-6."""
    case = make_decode_case(18, [6, 19, 40], 8, num_kv_heads, 16, 8, dtype=np.float64)
    check_decode(impl, case, hint="query head h reads KV head h // (num_q_heads // num_kv_heads), "
                                  "not h % num_kv_heads")


@pytest.mark.points(1)
def test_alibi_decode_matches_oracle(impl):
    """ALiBi adds slope[h] * (key_pos - query_pos) with query_pos = context_len - 1; matches to 1e-6."""
    case = make_decode_case(19, [1, 12, 45], 8, 2, 16, 8, dtype=np.float64, alibi=True)
    check_decode(impl, case, hint="the bias is slope * (key_pos - query_pos): <= 0, largest "
                                  "penalty for the oldest key")


@pytest.mark.points(1)
def test_nan_poison_in_padding_and_unused_blocks_never_leaks(impl):
    """With 40 poisoned spare blocks and wide PAD-filled tables, every output is finite and right."""
    case = make_decode_case(20, [3, 8, 17, 1, 26], 4, 2, 16, 8, dtype=np.float64,
                            extra_blocks=40, max_blocks_per_seq=12)
    out, lse = impl.paged_decode(*decode_args(case))
    assert np.isfinite(out).all() and np.isfinite(lse).all(), "NaN leaked from poisoned cache rows"
    check_decode(impl, case)


def _bad(case, **change):
    args = dict(zip(["query", "key_cache", "value_cache", "block_tables", "context_lens", "scale"],
                    decode_args(case)))
    args.update(change)
    return args


@pytest.mark.points(1)
@pytest.mark.parametrize("change, error, match", [
    ("table_pad", IndexError, "block_tables"),
    ("table_out_of_range", IndexError, "block_tables"),
    ("too_long", ValueError, "context_lens"),
    ("negative_len", ValueError, "context_lens"),
    ("heads", ValueError, "num_q_heads"),
    ("cache_shapes", ValueError, "value_cache"),
    ("query_list", TypeError, "query"),
    ("float_table", TypeError, "block_tables"),
    ("alibi_len", ValueError, "alibi_slopes"),
    ("scale", ValueError, "scale"),
])
def test_decode_rejects_bad_input_with_typed_errors(impl, change, error, match):
    """Bad arguments raise a typed error naming the argument, before anything is computed.

    The PAD case matters most: NumPy reads key_cache[-1] happily, so a context_len that claims
    one block more than the table holds would silently attend over somebody else's keys.
    """
    case = make_decode_case(21, [5, 9], 4, 2, 8, 4, dtype=np.float64)
    kv = case.kv
    tables = kv.block_tables.copy()
    lens = kv.context_lens.copy()
    if change == "table_pad":
        lens[0] = 9  # needs a third block; the row holds PAD there
        args = _bad(case, context_lens=lens)
    elif change == "table_out_of_range":
        tables[1, 0] = kv.key_cache.shape[0]
        args = _bad(case, block_tables=tables)
    elif change == "too_long":
        lens[1] = tables.shape[1] * 4 + 1
        args = _bad(case, context_lens=lens)
    elif change == "negative_len":
        lens[0] = -1
        args = _bad(case, context_lens=lens)
    elif change == "heads":
        args = _bad(case, query=np.ones((2, 3, 8)))
    elif change == "cache_shapes":
        args = _bad(case, value_cache=kv.value_cache[:, :, :2])
    elif change == "query_list":
        args = _bad(case, query=case.query.tolist())
    elif change == "float_table":
        args = _bad(case, block_tables=tables.astype(np.float64))
    elif change == "alibi_len":
        args = _bad(case) | {"alibi_slopes": np.ones(3, dtype=np.float32)}
    else:
        args = _bad(case, scale=-1.0)
    with pytest.raises(error, match=match):
        impl.paged_decode(**args)


def _far_apart_cache():
    """One KV head, block size 4, head size 1: K = 1 everywhere; V = 1 in block 0, 3 in block 1."""
    key_cache = np.ones((2, 1, 4, 1))
    value_cache = np.ones((2, 1, 4, 1))
    value_cache[1] = 3.0
    return key_cache, value_cache


@pytest.mark.points(1)
def test_every_state_keeps_a_max_of_its_own_far_from_the_others(impl):
    """Each (sequence, head, query) and each split-K partition keeps its own running max: a
    head, a query or a sequence whose logits are ~2000 (or ~800) below another's still gets
    its exact softmax, never an underflow to 0 (a max shared between them, or an empty
    partition whose max starts at 0 instead of -inf, shifts its exponents past exp's range)."""
    key_cache, value_cache = _far_apart_cache()
    # decode, two query heads on one KV head: logits +1000 and -1000
    out, lse = impl.paged_decode(np.array([[[1000.0], [-1000.0]]]), key_cache, value_cache,
                                 np.array([[0, PAD_BLOCK_ID]], dtype=np.int32), np.array([2]), 1.0)
    assert np.allclose(out[0, :, 0], [1.0, 1.0]) and np.allclose(lse[0], [1000 + LN2, -1000 + LN2]), (
        f"paged_decode with head logits +1000 / -1000 gave out {out[0, :, 0]}, lse {lse[0]} "
        f"(want [1, 1], [1000.69, -999.31]): one running max per head, not one for all heads")
    # prefill, two queries of one sequence: logits +1000 and -1000
    out, lse = impl.paged_prefill(np.array([[[1000.0]], [[-1000.0]]]), key_cache, value_cache,
                                  np.array([[0, PAD_BLOCK_ID]], dtype=np.int32), np.array([0, 2]),
                                  np.array([2]), 1.0)
    assert np.allclose(out[:, 0, 0], [1.0, 1.0]) and np.allclose(lse[:, 0], [1000.0, -1000 + LN2]), (
        f"paged_prefill with query logits +1000 / -1000 gave out {out[:, 0, 0]}, lse "
        f"{lse[:, 0]} (want [1, 1], [1000, -999.31]): one running max per (head, query)")
    # split-K: sequence 0 fills 1 of 2 partitions; every logit is -800
    query = np.full((2, 1, 1), -800.0)
    tables = np.array([[0, PAD_BLOCK_ID], [0, 1]], dtype=np.int32)
    want_out, want_lse = impl.paged_decode(query, key_cache, value_cache, tables, np.array([4, 8]), 1.0)
    out, lse = impl.paged_decode_split_k(query, key_cache, value_cache, tables, np.array([4, 8]),
                                         1.0, partition_size=4)
    assert np.allclose(out, want_out) and np.allclose(lse, want_lse), (
        f"paged_decode_split_k with logits of -800 gave out {out[:, 0, 0]}, lse {lse[:, 0]}; "
        f"paged_decode gives {want_out[:, 0, 0]}, {want_lse[:, 0]}: an empty partition's max is "
        f"-inf (it merges as the identity), never 0")
    # merge_attn_states of two finished states whose lse are both 1000 (or both -800)
    for big in (1000.0, -800.0):
        out, lse = impl.merge_attn_states(np.array([[1.0]]), np.array([big]), np.array([[3.0]]),
                                          np.array([big]))
        assert np.allclose(out, [[2.0]]) and np.allclose(lse, [big + LN2]), (
            f"merge_attn_states of lse {big:g} and {big:g} gave out {out}, lse {lse} (want 2, "
            f"{big + LN2:.2f}): weigh by exp(lse - max lse), never by exp(lse) itself")
