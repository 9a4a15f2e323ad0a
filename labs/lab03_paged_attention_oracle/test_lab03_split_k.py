"""Lab 3, Task 4: split-K (flash-decoding) — partition states and their merge."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labs.lab03_paged_attention_oracle._compare import (
    assert_attention_close,
    decode_args,
    decode_oracle,
)
from reference.inputs import make_decode_case

MERGE_HINT = ("each partition's l and acc must be rescaled by exp(m_i - max_j m_j) before "
              "summing — they are relative to different maxima")


def _states(impl, case, seq, cuts):
    """Partition states of one sequence for the given token boundaries, stacked."""
    kv = case.kv
    parts = [impl.partition_attention(case.query[seq], kv.key_cache, kv.value_cache,
                                      kv.block_tables[seq], int(kv.context_lens[seq]), case.scale,
                                      lo, hi, case.alibi_slopes)
             for lo, hi in zip(cuts[:-1], cuts[1:])]
    return [np.stack(x) for x in zip(*parts)]


@pytest.mark.points(2)
def test_split_k_merge_equals_unsplit_for_any_partitioning(impl):
    """Cut a context anywhere (any number of partitions, any sizes, even empty ones), attend to each
    part, merge: the result equals the unsplit oracle to 1e-9.

    Hypothesis draws the context length and the cut points; ALiBi and GQA are on, so every
    partition has its own maximum.
    """
    @settings(max_examples=30)
    @given(st.integers(1, 40), st.data())
    def check(n, data):
        case = make_decode_case(n, [n], 4, 2, 8, 4, dtype=np.float64, alibi=n % 2 == 0)
        case.query *= 3.0  # sharper softmax: partitions' maxima differ a lot
        inner = data.draw(st.lists(st.integers(0, n), max_size=6))
        cuts = [0, *sorted(inner), n]
        m, l, acc = _states(impl, case, 0, cuts)
        out, lse = impl.finalize_state(*impl.merge_partitions(m, l, acc))
        want_out, want_lse = decode_oracle(case)
        assert_attention_close(out[None], want_out, atol=1e-9, what=f"merge of partitions {cuts}",
                               hint=MERGE_HINT)
        assert_attention_close(lse[None], want_lse, atol=1e-9, what=f"merged lse of {cuts}",
                               hint=MERGE_HINT)

    check()


@pytest.mark.points(1)
def test_merge_is_associative_and_order_free(impl):
    """merge(merge(a, b), c) == merge(a, merge(b, c)) == merge(c, a, b), to 1e-12."""
    case = make_decode_case(41, [30], 4, 4, 8, 4, dtype=np.float64)
    case.query *= 4.0
    m, l, acc = _states(impl, case, 0, [0, 7, 8, 30])

    def merge(*idx):
        return impl.merge_partitions(m[list(idx)], l[list(idx)], acc[list(idx)])

    ab, bc = merge(0, 1), merge(1, 2)
    left = impl.merge_partitions(*[np.stack([x, y]) for x, y in zip(ab, (m[2], l[2], acc[2]))])
    right = impl.merge_partitions(*[np.stack([x, y]) for x, y in zip((m[0], l[0], acc[0]), bc)])
    shuffled = merge(2, 0, 1)
    outs = [impl.finalize_state(*s) for s in (left, right, shuffled)]
    for (o, s), name in zip(outs[1:], ["merge(a, merge(b, c))", "merge(c, a, b)"]):
        np.testing.assert_allclose(o, outs[0][0], rtol=1e-12, atol=1e-12,
                                   err_msg=f"{name} != merge(merge(a, b), c)")
        np.testing.assert_allclose(s, outs[0][1], rtol=1e-12, atol=1e-12)


@pytest.mark.points(2)
def test_merge_with_empty_partitions_is_the_identity(impl):
    """Empty ⊕ x = x exactly, and empty ⊕ empty = empty (out 0, lse -inf) — never NaN.

    vLLM's merge_attn_states and FlashInfer's cascade merge both once returned NaN here
    (exp(-inf - -inf)): a chunked-prefill query with no prefix keys merged two empty states.
    """
    empty = impl.empty_state((3,), 4)
    case = make_decode_case(42, [9], 3, 3, 4, 4, dtype=np.float64)
    x = _states(impl, case, 0, [0, 9])
    x = [a[0] for a in x]
    both = impl.merge_partitions(*[np.stack([e, a]) for e, a in zip(empty, x)])
    for name, got, want in zip("m l acc".split(), both, x):
        assert np.array_equal(got, want), f"empty ⊕ x changed {name}: {want} -> {got}"
    m, l, acc = impl.merge_partitions(*[np.stack([e, e]) for e in empty])
    assert not (np.isnan(m).any() or np.isnan(l).any() or np.isnan(acc).any()), (
        "empty ⊕ empty gave NaN: the global max is -inf and exp(-inf - -inf) is NaN — shift by a "
        "finite stand-in when the max is -inf")
    assert np.isneginf(m).all() and (l == 0).all() and (acc == 0).all()
    out, lse = impl.merge_attn_states(np.zeros((3, 4)), np.full(3, -np.inf),
                                      np.zeros((3, 4)), np.full(3, -np.inf))
    assert (out == 0).all() and np.isneginf(lse).all(), (
        f"merge_attn_states of two empty results must be (0, -inf), got {out[0]}, {lse}")


@pytest.mark.points(1)
def test_merge_rescales_to_the_global_max(impl):
    """Two partitions whose maxima differ by 30 merge to the oracle's answer (to 1e-9)."""
    case = make_decode_case(43, [16], 1, 1, 8, 4, dtype=np.float64)
    q = case.query[0, 0]
    # Tokens 8..15 (logical blocks 2, 3) get keys whose scores are 30 higher.
    case.kv.key_cache[case.kv.block_tables[0, 2:4]] += 30.0 * q / (q @ q * case.scale)
    m, l, acc = _states(impl, case, 0, [0, 8, 16])
    assert m[1, 0] - m[0, 0] > 25.0, "test setup: the partitions' maxima should differ by ~30"
    out, lse = impl.finalize_state(*impl.merge_partitions(m, l, acc))
    want_out, want_lse = decode_oracle(case)
    assert_attention_close(out[None], want_out, atol=1e-9, what="merged out", hint=MERGE_HINT)
    assert_attention_close(lse[None], want_lse, atol=1e-9, what="merged lse", hint=MERGE_HINT)


@pytest.mark.points(2)
@pytest.mark.parametrize("partition_size", [4, 8, 12, 64])
def test_paged_decode_split_k_matches_oracle_for_any_partition_size(impl, partition_size):
    """Split-K decode matches the oracle (to 1e-9) for partitions of 1, 2, 3 and 16 blocks.

    The batch mixes a zero-length sequence (all partitions empty: out 0, lse -inf), sequences
    shorter than one partition (the rest of their partitions empty) and long ones; GQA and
    ALiBi are on.
    """
    case = make_decode_case(44, [0, 3, 13, 40, 57], 8, 2, 16, 4, dtype=np.float64, alibi=True)
    out, lse = impl.paged_decode_split_k(*decode_args(case), partition_size,
                                         alibi_slopes=case.alibi_slopes)
    want_out, want_lse = decode_oracle(case)
    assert_attention_close(out, want_out, atol=1e-9, what=f"split-K out (partition {partition_size})",
                           hint=MERGE_HINT)
    assert_attention_close(lse, want_lse, atol=1e-9, what=f"split-K lse (partition {partition_size})",
                           hint=MERGE_HINT)
    assert (out[0] == 0).all(), "the zero-length sequence must come out exactly 0"


@pytest.mark.points(1)
def test_merge_attn_states_combines_prefix_and_suffix(impl):
    """(out, lse) of a prefix and of a suffix merge into the whole context's, for every split point.

    This is how an engine combines attention over a shared prefix (cascade) or over cached
    history and new tokens: each side is a finished (out, lse), i.e. the state (lse, 1, out).
    The split at 0 has an empty prefix (0, -inf): the merge must return the suffix unchanged.
    """
    case = make_decode_case(45, [14], 4, 2, 8, 4, dtype=np.float64, alibi=True)
    want_out, want_lse = decode_oracle(case)
    for split in range(0, 15, 3):
        (pm, pl, pa), (sm, sl, sa) = [[x[i] for x in _states(impl, case, 0, [0, split, 14])]
                                      for i in (0, 1)]
        prefix = impl.finalize_state(pm, pl, pa)
        suffix = impl.finalize_state(sm, sl, sa)
        out, lse = impl.merge_attn_states(*prefix, *suffix)
        assert_attention_close(out[None], want_out, atol=1e-9, what=f"prefix {split} ⊕ suffix",
                               names=("split", "head"), hint=MERGE_HINT)
        assert_attention_close(lse[None], want_lse, atol=1e-9, what=f"lse prefix {split} ⊕ suffix",
                               names=("split", "head"))


@pytest.mark.points(1)
@pytest.mark.parametrize("bad", [0, -4, 6, 2.0, True])
def test_split_k_rejects_bad_partition_size(impl, bad):
    """partition_size must be a positive multiple of block_size (4 here): ValueError naming it.
    The smallest legal one is accepted: partitions of one token with a block size of 1."""
    case = make_decode_case(46, [5], 2, 2, 8, 4, dtype=np.float64)
    with pytest.raises(ValueError, match="partition_size"):
        impl.paged_decode_split_k(*decode_args(case), bad)
    tiny = make_decode_case(47, [3, 0, 1], 2, 1, 4, 1, dtype=np.float64)
    out, _ = impl.paged_decode_split_k(*decode_args(tiny), 1, alibi_slopes=tiny.alibi_slopes)
    want_out, _ = decode_oracle(tiny)
    assert_attention_close(out, want_out, atol=1e-9, what="split-K out (block 1, partition 1)",
                           hint="partition_size 1 is a positive multiple of block_size 1")
