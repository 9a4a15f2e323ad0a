"""Lab 3, hidden tests (instructor-only; stripped from the student release, run at grading).

Drawn from the test-design rules of issue #11 with shapes and seeds the public tests do not use:
GQA 6:3 and 8:2 with head sizes 12 and 20, block sizes 5 and 7, an unconventional scale, ALiBi,
empty sequences in the middle of a batch, and split-K merges of states whose maxima lie
hundreds apart.
"""

from __future__ import annotations

import numpy as np
import pytest

from labs.lab03_paged_attention_oracle._compare import (
    assert_attention_close,
    decode_args,
    decode_oracle,
    prefill_args,
    prefill_oracle,
    rel_error_per_row,
    round_half,
)
from reference.inputs import make_decode_case, make_prefill_case
from reference.oracle import paged_decode_ref


@pytest.mark.points(2)
def test_hidden_decode_and_split_k_with_block_size_5_and_alibi(impl):
    """GQA 6:3, head size 12, block size 5, scale 0.8, ALiBi, contexts 1, 5, 0, 6, 23: decode and
    split-K at partition sizes 5, 10 and 15 all match the oracle (the empty sequence too)."""
    case = make_decode_case(2024, [1, 5, 0, 6, 23], 6, 3, 12, 5, alibi=True)
    case.scale = 0.8
    want_out, want_lse = decode_oracle(case)
    out, lse = impl.paged_decode(*decode_args(case), alibi_slopes=case.alibi_slopes)
    assert_attention_close(out, want_out, atol=1e-6, what="paged_decode out")
    assert_attention_close(lse, want_lse, atol=1e-6, what="paged_decode lse")
    for partition_size in (5, 10, 15):
        out, lse = impl.paged_decode_split_k(*decode_args(case), partition_size,
                                             alibi_slopes=case.alibi_slopes)
        what = f"split-K (partition_size={partition_size})"
        assert_attention_close(out, want_out, atol=1e-6, what=f"{what} out")
        assert_attention_close(lse, want_lse, atol=1e-6, what=f"{what} lse")


@pytest.mark.points(2)
def test_hidden_prefill_with_block_size_7_gqa_8_to_2_and_history(impl):
    """Varlen prefill, GQA 8:2, head size 20, block size 7, scale 1.3, ALiBi; query lengths
    4, 0, 9, 1 over histories 10, 3, 0, 13 — every query matches the oracle."""
    case = make_prefill_case(2025, [4, 0, 9, 1], [10, 3, 0, 13], 8, 2, 20, 7, alibi=True)
    case.scale = 1.3
    want_out, want_lse = prefill_oracle(case)
    out, lse = impl.paged_prefill(*prefill_args(case), alibi_slopes=case.alibi_slopes)
    assert_attention_close(out, want_out, atol=1e-6, what="paged_prefill out")
    assert_attention_close(lse, want_lse, atol=1e-6, what="paged_prefill lse")


@pytest.mark.points(1)
def test_hidden_merge_of_states_whose_maxima_lie_hundreds_apart(impl):
    """merge_partitions of 6 partitions (two empty) with maxima from -400 to +500 equals the
    float64 state of the union computed directly, and merge_attn_states agrees pairwise."""
    rng = np.random.default_rng(2026)
    scores = [rng.standard_normal(n) * 3 + shift
              for n, shift in ((4, -400.0), (0, 0.0), (3, 500.0), (5, 497.0), (0, 0.0), (2, 120.0))]
    values = [rng.standard_normal((len(s), 4)) for s in scores]
    ms, ls, accs = [], [], []
    for s, v in zip(scores, values):
        m, l, acc = impl.empty_state((), 4)
        m, l, acc = impl.online_softmax_update(m, l, acc, s, v)
        ms.append(m), ls.append(l), accs.append(acc)
    m, l, acc = impl.merge_partitions(np.stack(ms), np.stack(ls), np.stack(accs))
    out, lse = impl.finalize_state(m, l, acc)
    all_s, all_v = np.concatenate(scores), np.concatenate(values)
    weights = np.exp(all_s - all_s.max())
    want_out = weights @ all_v / weights.sum()
    want_lse = all_s.max() + np.log(weights.sum())
    assert np.allclose(out, want_out, atol=1e-9) and abs(lse - want_lse) < 1e-9, (
        "merging states with maxima hundreds apart must rescale each to the global max")
    out_a, lse_a = impl.finalize_state(ms[0], ls[0], accs[0])
    out_b, lse_b = impl.finalize_state(ms[2], ls[2], accs[2])
    merged_out, merged_lse = impl.merge_attn_states(out_a, lse_a, out_b, lse_b)
    w = np.exp(np.concatenate([scores[0], scores[2]]) - scores[2].max())
    assert np.allclose(merged_out, w @ np.concatenate([values[0], values[2]]) / w.sum(), atol=1e-9)


@pytest.mark.points(1)
def test_hidden_bf16_decode_with_block_size_7_is_within_the_kernel_tolerance(impl):
    """bf16 decode, GQA 4:1, head size 24, block size 7, contexts 3, 40, 0, 15: relative error per
    row below 1e-2 against the oracle on the rounded inputs, the empty row exactly 0."""
    case = make_decode_case(2027, [3, 40, 0, 15], 4, 1, 24, 7, dtype=np.float32)
    kv = case.kv
    out, lse = impl.paged_decode_lowp(*decode_args(case), dtype="bfloat16")
    q, kc, vc = (round_half(a, "bfloat16") for a in (case.query, kv.key_cache, kv.value_cache))
    ref, ref_lse = paged_decode_ref(q, kc, vc, kv.block_tables, kv.context_lens, case.scale)
    err = rel_error_per_row(out, ref)
    assert np.nanmax(err) < 1e-2 and not np.isnan(err).any(), f"worst row error {err.max():.2e}"
    assert (out[2] == 0).all() and np.isneginf(lse[2]).all(), "context 0 gives out 0, lse -inf"
    finite = np.isfinite(ref_lse)
    assert np.abs(lse[finite] - ref_lse[finite]).max() < 1e-3


@pytest.mark.points(1)
def test_hidden_dense_attention_gqa_6_to_2_with_history_and_alibi(impl):
    """dense_attention with causal left at its default, GQA 6:2, 5 queries over 11 keys (6 of
    history), scale 0.55, ALiBi, and one query head's logits beyond 800: matches the oracle."""
    from reference.inputs import alibi_slopes
    from reference.oracle import attention_ref

    rng = np.random.default_rng(2028)
    q = rng.standard_normal((5, 6, 16))
    q[:, 3] *= 300  # one head past float64's exp range
    k, v = rng.standard_normal((2, 11, 2, 16))
    slopes = alibi_slopes(6)
    out, lse = impl.dense_attention(q, k, v, 0.55, alibi_slopes=slopes)
    want_out, want_lse = attention_ref(q, k, v, 0.55, causal=True, alibi_slopes=slopes)
    assert_attention_close(out, want_out, atol=1e-9, what="dense_attention out")
    assert_attention_close(lse, want_lse, atol=1e-9, what="dense_attention lse")
