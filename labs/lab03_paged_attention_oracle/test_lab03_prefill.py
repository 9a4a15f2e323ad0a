"""Lab 3, Task 3: varlen paged prefill with history (chunked prefill), against the oracle."""

from __future__ import annotations

import numpy as np
import pytest

from labs.lab03_paged_attention_oracle._compare import (
    assert_attention_close,
    prefill_args,
    prefill_oracle,
)
from reference.inputs import make_prefill_case
from reference.oracle import paged_decode_ref

NAMES = ("token", "head")
CAUSAL_HINT = ("query i of a sequence with history H sits at position H + i and sees keys "
               "0 .. H + i inclusive (H = context_len - q_len)")


def _check(impl, case, hint=CAUSAL_HINT):
    out, lse = impl.paged_prefill(*prefill_args(case), alibi_slopes=case.alibi_slopes)
    want_out, want_lse = prefill_oracle(case)
    assert_attention_close(out, want_out, atol=1e-6, what="paged_prefill out", names=NAMES, hint=hint)
    assert_attention_close(lse, want_lse, atol=1e-6, what="paged_prefill lse", names=NAMES, hint=hint)
    return out, lse


@pytest.mark.points(2)
def test_paged_prefill_matches_oracle_varlen(impl):
    """Five packed sequences (1, 7, 16, 20, 3 new tokens over 0, 5, 16, 33, 0 of history) match to 1e-6."""
    case = make_prefill_case(31, [1, 7, 16, 20, 3], [0, 5, 16, 33, 0], 8, 2, 16, 8, dtype=np.float64)
    out, _ = _check(impl, case)
    assert np.isfinite(out).all(), "NaN leaked from a poisoned cache row"


@pytest.mark.points(2)
def test_chunked_prefill_equals_token_by_token_decode(impl):
    """Query i of a chunk with history H gives what a decode over the first H + i + 1 keys gives.

    This is the contract of chunked prefill: feeding a prompt in chunks, or token by token,
    must produce the same outputs as feeding it at once. The reference is the trusted decode
    oracle run on each prefix.
    """
    case = make_prefill_case(32, [6, 4], [10, 3], 4, 2, 16, 4, dtype=np.float64)
    out, lse = impl.paged_prefill(*prefill_args(case))
    kv = case.kv
    for s in range(2):
        start, history = int(case.cu_seqlens_q[s]), int(case.history_lens[s])
        for i in range(int(case.cu_seqlens_q[s + 1]) - start):
            want_out, want_lse = paged_decode_ref(
                case.query[start + i][None], kv.key_cache, kv.value_cache, kv.block_tables[s][None],
                np.array([history + i + 1]), case.scale)
            assert_attention_close(out[start + i][None], want_out, atol=1e-6,
                                   what=f"seq {s} query {i} (history {history})", hint=CAUSAL_HINT)
            assert_attention_close(lse[start + i][None], want_lse, atol=1e-6,
                                   what=f"seq {s} query {i} lse", hint=CAUSAL_HINT)


@pytest.mark.points(1)
def test_prefill_without_history_is_plain_causal(impl):
    """With no history the first query sees only itself (out = its own value) and the last sees all."""
    case = make_prefill_case(33, [9], [0], 2, 2, 16, 4, dtype=np.float64)
    out, _ = impl.paged_prefill(*prefill_args(case))
    np.testing.assert_allclose(out[0], case.kv.values[0][0], rtol=1e-12, atol=1e-12,
                               err_msg="query 0 must attend to key 0 only (the diagonal is visible)")
    _check(impl, case)


@pytest.mark.points(1)
def test_prefill_alibi_with_history_matches_oracle(impl):
    """ALiBi with history uses query_pos = H + i: slope * (key_pos - (H + i)); matches to 1e-6."""
    case = make_prefill_case(34, [5, 3, 8], [7, 0, 12], 8, 4, 16, 4, dtype=np.float64, alibi=True)
    _check(impl, case, hint=CAUSAL_HINT + "; the ALiBi bias is slope * (key_pos - query_pos) <= 0")


@pytest.mark.points(1)
@pytest.mark.parametrize("num_kv_heads", [8, 2, 1], ids=["ratio1", "ratio4", "ratio8"])
def test_prefill_gqa_ratios_match_oracle(impl, num_kv_heads):
    """8 query heads over 8, 2 or 1 KV heads, with history, match the oracle to 1e-6."""
    case = make_prefill_case(35, [4, 6], [5, 11], 8, num_kv_heads, 16, 8, dtype=np.float64)
    _check(impl, case, hint="query head h reads KV head h // (num_q_heads // num_kv_heads)")


@pytest.mark.points(1)
def test_prefill_skips_sequences_without_new_tokens(impl):
    """Sequences with no query tokens (repeated cu_seqlens_q entries, even context 0) add no rows."""
    case = make_prefill_case(36, [0, 3, 0, 2, 0], [4, 2, 0, 0, 9], 4, 4, 16, 4, dtype=np.float64)
    assert case.cu_seqlens_q.tolist() == [0, 0, 3, 3, 5, 5]
    _check(impl, case)


@pytest.mark.points(1)
def test_single_token_prefill_equals_decode(impl):
    """A prefill chunk of one token per sequence is exactly a decode step (same out and lse)."""
    case = make_prefill_case(37, [1, 1, 1], [0, 8, 30], 4, 2, 16, 8, dtype=np.float64, alibi=True)
    out, lse = impl.paged_prefill(*prefill_args(case), alibi_slopes=case.alibi_slopes)
    kv = case.kv
    want_out, want_lse = paged_decode_ref(case.query, kv.key_cache, kv.value_cache, kv.block_tables,
                                          kv.context_lens, case.scale, alibi_slopes=case.alibi_slopes)
    assert_attention_close(out, want_out, atol=1e-6, what="one-token prefill vs decode")
    assert_attention_close(lse, want_lse, atol=1e-6, what="one-token prefill lse vs decode")


@pytest.mark.points(1)
@pytest.mark.parametrize("cu, lens, match", [
    ([1, 3, 5], None, "cu_seqlens_q"),       # does not start at 0
    ([0, 4, 3], None, "cu_seqlens_q"),       # decreasing
    ([0, 2, 4], None, "cu_seqlens_q"),       # does not end at the 5 query rows
    ([0, 2], None, "cu_seqlens_q"),          # one entry short
    ([0, 4, 5], [3, 9], "context_lens"),     # 4 new tokens but only 3 keys in the cache
])
def test_prefill_rejects_bad_offsets(impl, cu, lens, match):
    """Bad cu_seqlens_q, or more new tokens than keys, raise ValueError naming the argument."""
    case = make_prefill_case(38, [2, 3], [1, 6], 2, 2, 8, 4, dtype=np.float64)
    kv = case.kv
    context_lens = kv.context_lens if lens is None else np.array(lens, dtype=np.int32)
    with pytest.raises(ValueError, match=match):
        impl.paged_prefill(case.query, kv.key_cache, kv.value_cache, kv.block_tables,
                           np.array(cu, dtype=np.int32), context_lens, case.scale)
