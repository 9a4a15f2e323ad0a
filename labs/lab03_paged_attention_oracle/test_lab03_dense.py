"""Lab 3, Task 1: dense_attention — the slow truth, checked against the trusted oracle."""

from __future__ import annotations

import numpy as np
import pytest

from labs.lab03_paged_attention_oracle._compare import assert_attention_close
from reference.inputs import alibi_slopes
from reference.oracle import attention_ref

NAMES = ("query", "head")


def _qkv(seed, q_len, kv_len, num_q_heads, num_kv_heads, head_size=16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((q_len, num_q_heads, head_size))
    k = rng.standard_normal((kv_len, num_kv_heads, head_size))
    v = rng.standard_normal((kv_len, num_kv_heads, head_size))
    return q, k, v


@pytest.mark.points(2)
@pytest.mark.parametrize("causal, num_q_heads, num_kv_heads, alibi, q_len, kv_len", [
    (True, 4, 4, False, 9, 9),     # plain causal self-attention
    (True, 8, 2, False, 3, 20),    # history: the 3 queries are the last 3 of 20 positions
    (True, 8, 1, True, 5, 12),     # MQA with ALiBi and history
    (False, 4, 2, True, 6, 11),    # no mask at all
    (True, 4, 4, False, 1, 1),     # one token
])
def test_dense_attention_matches_the_oracle(impl, causal, num_q_heads, num_kv_heads, alibi,
                                            q_len, kv_len):
    """dense_attention equals the float64 oracle (out and lse) to 1e-9, masks, GQA and ALiBi included."""
    q, k, v = _qkv(1, q_len, kv_len, num_q_heads, num_kv_heads)
    slopes = alibi_slopes(num_q_heads) if alibi else None
    out, lse = impl.dense_attention(q, k, v, 0.25, causal=causal, alibi_slopes=slopes)
    want_out, want_lse = attention_ref(q, k, v, 0.25, causal=causal, alibi_slopes=slopes)
    hint = "check the history offset: query i sits at position kv_len - q_len + i"
    assert_attention_close(out, want_out, atol=1e-9, what="dense out", names=NAMES, hint=hint)
    assert_attention_close(lse, want_lse, atol=1e-9, what="dense lse", names=NAMES, hint=hint)


@pytest.mark.points(2)
def test_dense_attention_never_looks_at_future_keys(impl):
    """With history H, query i's output is unchanged when keys after position H + i change.

    A causal mask is a promise about *influence*: rewriting the future (keys and values after a
    query's position) must not move that query's output by a single bit.
    """
    q, k, v = _qkv(2, 4, 10, 2, 2)
    out, _ = impl.dense_attention(q, k, v, 0.3)
    history = 10 - 4
    for i in range(4):
        k2, v2 = k.copy(), v.copy()
        k2[history + i + 1:] = 50.0 * np.sign(k2[history + i + 1:] + 1e-3)  # huge future scores
        v2[history + i + 1:] = 1e3
        out2, _ = impl.dense_attention(q, k2, v2, 0.3)
        assert np.array_equal(out2[i], out[i]), (
            f"query {i} (position {history + i}) changed when keys after position {history + i} "
            f"changed — it sees the future; the mask must be key_pos <= kv_len - q_len + i"
        )
        assert not np.array_equal(out2[-1], out[-1]) or i == 3, "the last query must see key 9"


@pytest.mark.points(1)
def test_dense_attention_query_head_h_reads_kv_head_h_div_group(impl):
    """With 8 query heads over 2 KV heads, heads 0-3 read KV head 0 and heads 4-7 read KV head 1.

    Each KV head's values are one constant vector, so a head's output *is* the value vector of
    the KV head it read, whatever the softmax weights.
    """
    q, k, v = _qkv(3, 2, 6, 8, 2)
    v[:, 0, :] = 1.0
    v[:, 1, :] = -1.0
    out, _ = impl.dense_attention(q, k, v, 0.25)
    got = out[0, :, 0].round(9).tolist()
    assert got == [1.0] * 4 + [-1.0] * 4, (
        f"query heads read KV heads {['0' if x > 0 else '1' for x in got]}, expected 0,0,0,0,1,1,1,1 "
        f"(likely cause: np.tile instead of np.repeat — that maps head h to h % num_kv_heads)"
    )


@pytest.mark.points(1)
def test_dense_attention_empty_keys_and_bad_heads(impl):
    """No keys gives out exactly 0 and lse -inf; 6 query heads over 4 KV heads is a ValueError."""
    q, k, v = _qkv(4, 0, 0, 2, 2)
    out, lse = impl.dense_attention(np.ones((1, 2, 16)), k, v, 0.5, causal=False)
    assert (out == 0).all() and np.isneginf(lse).all(), f"no keys: got out {out.max()}, lse {lse}"
    q, k, v = _qkv(4, 2, 5, 6, 4)
    with pytest.raises(ValueError, match="num_q_heads"):
        impl.dense_attention(q, k, v, 0.5)
