"""Lab 3, the contract's edges: float32 really is float32, a state update leaves its inputs
alone, every function checks what it reads, and non-finite values propagate."""

from __future__ import annotations

import numpy as np
import pytest


def _cache(rng_seed: int = 0, num_blocks: int = 2, block_size: int = 4, head_size: int = 2):
    kc = np.random.default_rng(rng_seed).standard_normal((num_blocks, 1, block_size, head_size))
    return kc, kc.copy()


@pytest.mark.points(1)
def test_lowp_decode_computes_in_float32(impl):
    """``paged_decode_lowp`` keeps every score, max, denominator and accumulator in float32:
    a key 110 below the max has weight ``exp(-110)``, which is 0 in float32 (1.7e-48 in
    float64), so a huge value behind it adds nothing; and ``empty_state`` /
    ``partition_attention`` give their state in the dtype asked for."""
    q = np.array([[[1.0]]])
    kc, vc = np.array([[[[0.0], [-110.0]]]]), np.array([[[[0.0], [2.0 ** 100]]]])
    out, _ = impl.paged_decode_lowp(q, kc, vc, np.array([[0]]), np.array([2]), 1.0,
                                    dtype="bfloat16")
    assert float(np.ravel(out)[0]) == 0.0, (
        f"out = {float(np.ravel(out)[0]):.3g}, expected exactly 0: exp(-110) is 0 in "
        "float32, so the 2**100 value behind it must add nothing — likely cause: the decode ran "
        "in float64 (compute_dtype not float32, or a state made without its dtype)")
    state = impl.empty_state((2,), 3, np.float32)
    assert [x.dtype for x in state] == [np.float32] * 3, (
        f"empty_state(..., np.float32) gave dtypes {[str(x.dtype) for x in state]}")
    kc, vc = _cache(0, head_size=8)
    state = impl.partition_attention(np.ones((2, 8)), kc, vc, np.array([0, 1]), 6, 0.5,
                                     compute_dtype=np.float32)
    assert [x.dtype for x in state] == [np.float32] * 3, (
        f"partition_attention(compute_dtype=np.float32) gave {[str(x.dtype) for x in state]}")


@pytest.mark.points(1)
def test_state_updates_leave_their_inputs_unchanged(impl):
    """``online_softmax_update`` returns a new state and leaves the one it was given as it was,
    so one prefix state can be grown in two directions (a shared prompt, two continuations)."""
    s1 = impl.online_softmax_update(*impl.empty_state((1,), 2), np.array([[0.0]]),
                                    np.array([[[1.0, 2.0]]]))
    before = [np.array(x, copy=True) for x in s1]
    impl.online_softmax_update(*s1, np.array([[0.0]]), np.array([[[3.0, 4.0]]]))
    assert all(np.array_equal(a, b) for a, b in zip(s1, before)), (
        f"growing a state changed it: (m, l, acc) was {[x.tolist() for x in before]}, now "
        f"{[x.tolist() for x in s1]} — likely cause: in-place *= / += on the arrays passed in")
    out, _ = impl.finalize_state(*impl.online_softmax_update(*s1, np.array([[0.0]]),
                                                             np.array([[[7.0, 8.0]]])))
    assert np.allclose(out, [[4.0, 5.0]]), f"prefix [1, 2] + [7, 8] gave {out.tolist()}"


@pytest.mark.points(1)
def test_partition_checks_every_block_its_sequence_needs(impl):
    """``partition_attention`` checks the block table for the whole ``context_len`` (an entry
    the *sequence* needs), even outside its own range: PAD in block 2 of a 12-token sequence is
    an ``IndexError`` naming ``block_tables[0, 2]``, and a 1-entry table is a ``ValueError``."""
    kc, vc = _cache(0, num_blocks=4)
    with pytest.raises(IndexError, match=r"block_tables\[0, 2\]"):
        impl.partition_attention(np.ones((1, 2)), kc, vc, np.array([0, 1, -1]), 12, 1.0, 0, 4)
    with pytest.raises(ValueError):
        impl.partition_attention(np.ones((1, 2)), kc, vc, np.array([0]), 12, 1.0, 0, 4)


@pytest.mark.points(1)
def test_a_non_finite_value_row_makes_the_output_non_finite(impl):
    """A NaN or +inf in a value row a query reads makes that query's ``out`` non-finite — never
    a finite wrong number (``lse`` depends only on the scores and stays finite)."""
    for bad in (np.nan, np.inf):
        kc, vc = _cache(0)
        vc[0, 0, 1, :] = bad  # token 1 of the sequence: read by the decode query
        with np.errstate(all="ignore"):
            out, _ = impl.paged_decode(np.ones((1, 1, 2)), kc, vc, np.array([[0, 1]]),
                                       np.array([6]), 0.5)
        assert not np.isfinite(out).all(), (
            f"a value row of {bad} read by the query gave the finite output {np.ravel(out)} — "
            "likely cause: values cleaned (nan_to_num) before use")


@pytest.mark.points(1)
def test_every_function_checks_its_alibi_slopes(impl):
    """``paged_prefill`` refuses a NaN slope and a slope count that is not one per query head
    (``ValueError`` naming ``alibi_slopes``), and ``partition_attention`` checks slopes in its
    ``compute_dtype`` (``1e39`` is inf in float32)."""
    kc, vc = _cache(0)
    args = (np.ones((3, 2, 2)), kc, vc, np.array([[0, 1]]), np.array([0, 3]), np.array([6]), 0.5)
    for slopes in (np.array([np.nan, 0.5]), np.array([0.5])):
        with np.errstate(all="ignore"), pytest.raises(ValueError, match="alibi_slopes"):
            impl.paged_prefill(*args, np.asarray(slopes))
    with np.errstate(all="ignore"), pytest.raises(ValueError, match="alibi_slopes"):
        impl.partition_attention(np.ones((1, 2)), kc, vc, np.array([0, 1]), 6, 1.0,
                                 alibi_slopes=np.array([1e39]), compute_dtype=np.float32)


@pytest.mark.points(1)
def test_dense_causal_refuses_more_queries_than_keys(impl):
    """``dense_attention`` with ``causal`` refuses ``q_len > kv_len`` (a query would have no
    position in the sequence) with a ``ValueError``."""
    with pytest.raises(ValueError):
        impl.dense_attention(np.ones((3, 1, 2)), np.ones((2, 1, 2)), np.ones((2, 1, 2)), 1.0)


@pytest.mark.points(1)
def test_no_function_changes_the_arrays_it_is_given(impl):
    """Every function returns new arrays and leaves its arguments as they were: the merges'
    states, and the query and caches that ``paged_decode_lowp`` rounds (it rounds copies)."""
    from labs.lab03_paged_attention_oracle._compare import decode_args
    from reference.inputs import make_decode_case

    def unchanged(name, call, *arrays):
        before = [np.array(a, copy=True) for a in arrays]
        call(*arrays)
        changed = [i for i, (a, b) in enumerate(zip(arrays, before))
                   if not np.array_equal(a, b, equal_nan=True)]
        assert not changed, (
            f"{name} changed its argument(s) {changed} — likely cause: an in-place *=, += or "
            f"np.round(..., out=) on an array passed in; compute into new arrays")

    m = np.array([[0.5, -np.inf], [1.5, 2.0]])  # [num_partitions=2, 2]
    l, acc = np.array([[1.0, 0.0], [2.0, 1.0]]), np.ones((2, 2, 3))
    unchanged("merge_partitions", impl.merge_partitions, m, l, acc)
    unchanged("merge_attn_states", impl.merge_attn_states, np.ones((2, 3)), np.array([0.5, 1.0]),
              np.full((2, 3), 2.0), np.array([1.5, -np.inf]))
    case = make_decode_case(61, [5, 20], 4, 2, 8, 4, dtype=np.float64)
    args = decode_args(case)
    unchanged("paged_decode_lowp", lambda *a: impl.paged_decode_lowp(*a, args[5]), *args[:5])
    unchanged("paged_decode_split_k",
              lambda *a: impl.paged_decode_split_k(*a, args[5], partition_size=8), *args[:5])
