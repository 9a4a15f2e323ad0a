"""Infrastructure (no points): the trusted oracle and input generators do what they promise."""

from __future__ import annotations

import numpy as np

from reference.inputs import make_decode_case, make_paged_kv, make_prefill_case
from reference.layout import PAD_BLOCK_ID
from reference.oracle import attention_ref, gather_kv, paged_decode_ref, paged_prefill_ref


def _naive(q, k, v, scale, q_pos, slopes=None):
    """One query, one head at a time: the definition, in plain loops."""
    out = np.zeros(q.shape[-1])
    scores = []
    for t in range(q_pos + 1):
        s = float(np.dot(q, k[t])) * scale
        if slopes is not None:
            s += slopes * (t - q_pos)
        scores.append(s)
    scores = np.array(scores)
    w = np.exp(scores - scores.max())
    w /= w.sum()
    for t in range(q_pos + 1):
        out += w[t] * v[t]
    return out


def test_pages_hold_the_logical_content_and_padding_is_poisoned():
    """gather_kv returns exactly what was written; every unused element is NaN."""
    kv = make_paged_kv(3, [0, 1, 16, 37], 2, 8, 16, dtype=np.float32)
    for s, n in enumerate(kv.context_lens):
        k, v = gather_kv(kv.key_cache, kv.value_cache, kv.block_tables[s], n)
        np.testing.assert_array_equal(k, kv.keys[s])
        np.testing.assert_array_equal(v, kv.values[s])
    used = sum(-(-int(n) // 16) for n in kv.context_lens)
    valid = sum(int(n) for n in kv.context_lens) * 2 * 8
    assert np.isfinite(kv.key_cache).sum() == valid
    assert (kv.block_tables != PAD_BLOCK_ID).sum() == used


def test_decode_oracle_matches_the_definition_with_gqa_and_alibi():
    """paged_decode_ref equals per-head loops, with head h reading KV head h // group."""
    case = make_decode_case(5, [1, 5, 33], 8, 2, 16, 8, dtype=np.float64, alibi=True)
    out, _ = paged_decode_ref(case.query, case.kv.key_cache, case.kv.value_cache,
                              case.kv.block_tables, case.kv.context_lens, case.scale,
                              alibi_slopes=case.alibi_slopes)
    for s, n in enumerate(case.kv.context_lens):
        for h in range(8):
            want = _naive(case.query[s, h], case.kv.keys[s][:, h // 4], case.kv.values[s][:, h // 4],
                          case.scale, int(n) - 1, float(case.alibi_slopes[h]))
            np.testing.assert_allclose(out[s, h], want, rtol=1e-12, atol=1e-12)


def test_prefill_oracle_is_causal_with_history():
    """Query i of a sequence with history H sees keys 0..H+i (checked against the definition)."""
    case = make_prefill_case(7, [4, 1], [3, 9], 2, 1, 8, 4, dtype=np.float64)
    out, _ = paged_prefill_ref(case.query, case.kv.key_cache, case.kv.value_cache,
                               case.kv.block_tables, case.cu_seqlens_q, case.kv.context_lens,
                               case.scale)
    for s in range(2):
        a = case.cu_seqlens_q[s]
        for i in range(case.cu_seqlens_q[s + 1] - a):
            for h in range(2):
                want = _naive(case.query[a + i, h], case.kv.keys[s][:, 0], case.kv.values[s][:, 0],
                              case.scale, int(case.history_lens[s]) + i)
                np.testing.assert_allclose(out[a + i, h], want, rtol=1e-12, atol=1e-12)


def test_zero_length_sequence_gives_zero_output_and_minus_inf_lse():
    """The shared contract: no keys -> output exactly 0, log-sum-exp -inf, never NaN."""
    out, lse = attention_ref(np.ones((1, 2, 4)), np.zeros((0, 2, 4)), np.zeros((0, 2, 4)), 0.5)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_large_logits_do_not_overflow():
    """Scores around ±90 (and beyond exp's float64 range after scaling) stay finite."""
    q = np.full((1, 1, 4), 30.0)
    k = np.array([[[3.0] * 4], [[-3.0] * 4]])
    out, lse = attention_ref(q, k, np.ones((2, 1, 4)), 1.0)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
