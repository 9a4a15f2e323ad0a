"""Bad-input fuzz of Lab 3 (the NumPy paged-attention oracle) and of the trusted
``reference.oracle`` / ``reference.inputs`` it is graded against: one argument at a time is
corrupted by kind (type, dtype, shape, range, id validity, non-finite scalars); the call must
raise a documented error naming that argument and leave every input array unchanged. Accepted
calls on finite data return no NaN/+inf."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from _fuzz_harness import (
    NON_INTEGERS,
    accepted,
    assert_all_finite,
    fuzz_settings,
    integer_like,
    refused,
)
from reference import inputs as ref_inputs
from reference import oracle as ref_oracle
from reference.loader import load_impl

pytestmark = pytest.mark.fuzz
LAB = "lab03_paged_attention_oracle"


@pytest.fixture(scope="module")
def impl():
    return load_impl(LAB)


def _freeze(args: dict):
    """Bytes of every array argument: a call must never change its inputs."""
    return {k: (v.dtype.str, v.shape, v.tobytes()) for k, v in args.items()
            if isinstance(v, np.ndarray)}


@st.composite
def decode_cases(draw):
    lens = draw(st.lists(st.integers(0, 9), min_size=1, max_size=3))
    group = draw(st.sampled_from([1, 2]))
    num_kv_heads = draw(st.sampled_from([1, 2]))
    case = ref_inputs.make_decode_case(draw(st.integers(0, 99)), lens, group * num_kv_heads,
                                       num_kv_heads, 4, draw(st.sampled_from([2, 4])),
                                       dtype=draw(st.sampled_from([np.float32, np.float64])),
                                       alibi=draw(st.booleans()))
    kv = case.kv
    return dict(query=case.query, key_cache=kv.key_cache, value_cache=kv.value_cache,
                block_tables=kv.block_tables, context_lens=kv.context_lens, scale=case.scale,
                alibi_slopes=case.alibi_slopes)


NOT_AN_ARRAY = st.sampled_from([None, 3, "abc", [[1.0, 2.0], [3.0]], object()])
BAD_SCALES = st.one_of(st.sampled_from(["0.5", None, True, np.True_, 1 + 1j, [0.5],
                                        torch.tensor(0.5)]),
                       st.sampled_from([0.0, -1.0, float("nan"), float("inf"), -float("inf"),
                                        10**400, 1e-400]))


def corruptions(draw, args):
    """(argument name, bad value, names the error may use) for a decode-style call."""
    with np.errstate(invalid="ignore"):  # casting the NaN-poisoned caches to ints
        return _corruptions(draw, args)


def _corruptions(draw, args):
    q, kc, bt, cl = args["query"], args["key_cache"], args["block_tables"], args["context_lens"]
    num_blocks, _, block_size, head_size = kc.shape
    out = [
        ("query", draw(NOT_AN_ARRAY), ("query",)),
        ("query", q.astype(np.int64), ("query",)),
        ("query", torch.from_numpy(q.copy()), ("query",)),
        ("query", q[0], ("query",)),
        ("query", np.zeros(q.shape[:2] + (head_size + 1,), q.dtype), ("query", "head_size")),
        ("query", np.zeros((q.shape[0], 0, head_size), q.dtype), ("num_q_heads",)),
        ("query", np.zeros((q.shape[0], 2 * kc.shape[1] + 1, head_size), q.dtype)
         if kc.shape[1] > 1 else q[0], ("num_q_heads", "query")),
        ("query", np.zeros((q.shape[0] + 1,) + q.shape[1:], q.dtype), ("query", "rows")),
        ("key_cache", draw(NOT_AN_ARRAY), ("key_cache",)),
        ("key_cache", kc.astype(np.int32), ("key_cache",)),
        ("key_cache", kc[0], ("key_cache",)),
        ("key_cache", np.zeros((num_blocks, kc.shape[1], 0, head_size), kc.dtype), ("key_cache",)),
        ("value_cache", kc[:, :, :1], ("value_cache",)),
        ("block_tables", draw(NOT_AN_ARRAY), ("block_tables",)),
        ("block_tables", bt.astype(np.float64), ("block_tables",)),
        ("block_tables", bt.astype(bool), ("block_tables",)),
        ("block_tables", bt[0], ("block_tables",)),
        ("block_tables", bt[:0], ("context_lens", "block_tables")),
        ("context_lens", draw(NOT_AN_ARRAY), ("context_lens",)),
        ("context_lens", cl.astype(np.float32), ("context_lens",)),
        ("context_lens", cl[None], ("context_lens",)),
        ("context_lens", np.append(cl, 1), ("context_lens",)),
        ("scale", draw(BAD_SCALES), ("scale",)),
        ("alibi_slopes", draw(st.sampled_from([np.ones(7, np.float32), np.ones(q.shape[1], int),
                                               np.full(q.shape[1], np.nan),
                                               np.full(q.shape[1], np.inf), "ab",
                                               [[0.5]]])), ("alibi_slopes",)),
    ]
    s = draw(st.integers(0, len(cl) - 1))
    lens = cl.copy()
    lens[s] = draw(st.sampled_from([-1, bt.shape[1] * block_size + 1, 10**6]))
    out.append(("context_lens", lens, ("context_lens",)))
    needed = [(i, j) for i in range(len(cl)) for j in range(-(-int(cl[i]) // block_size))]
    if needed:
        i, j = draw(st.sampled_from(needed))
        tables = bt.astype(np.int64)
        tables[i, j] = draw(st.sampled_from([-1, num_blocks, 2**40, -(2**40)]))
        out.append(("block_tables", tables, (f"block_tables[{i}, {j}]",)))
        big = bt.astype(np.uint64)
        big[i, j] = np.uint64(2**64 - 1)
        out.append(("block_tables", big, ("block_tables",)))
    return out


@fuzz_settings()
@given(data=st.data())
def test_decode_family_refuses_each_bad_argument(impl, data):
    args = data.draw(decode_cases())
    fn_name = data.draw(st.sampled_from(["paged_decode", "paged_decode_split_k",
                                         "paged_decode_lowp", "paged_decode_ref"]))
    candidates = corruptions(data.draw, args)
    if fn_name == "paged_decode_lowp":  # float32 arithmetic: finite float64s that it cannot hold
        candidates += [("scale", data.draw(st.sampled_from([1e39, 1e-50])), ("scale",)),
                       ("alibi_slopes", np.full(args["query"].shape[1], 1e39), ("alibi_slopes",))]
    arg, bad, names = data.draw(st.sampled_from(candidates))
    if fn_name == "paged_decode_ref" and arg == "value_cache":
        names = names + ("key_cache",)
    fn = getattr(ref_oracle, fn_name) if fn_name.endswith("_ref") else getattr(impl, fn_name)
    extra = {"partition_size": args["key_cache"].shape[2] * 2} if "split_k" in fn_name else {}
    bad_args = dict(args, **{arg: bad}, **extra)
    frozen = {k: v.copy() for k, v in args.items() if isinstance(v, np.ndarray)}
    refused(lambda: fn(**bad_args), names=names, snapshot=lambda: _freeze(frozen | {
        k: v for k, v in args.items() if isinstance(v, np.ndarray)}) and _freeze(args),
        what=f"{fn_name}({arg}={type(bad).__name__})")


@fuzz_settings(0.5)
@given(data=st.data())
def test_decode_family_on_finite_data_is_finite(impl, data):
    args = data.draw(decode_cases())
    before = _freeze(args)
    for name in ("paged_decode", "paged_decode_lowp"):
        out, lse = accepted(lambda: getattr(impl, name)(**args), what=name)
        assert_all_finite(name, out, lse)
        seen = args["context_lens"] > 0
        assert np.isfinite(lse[seen]).all(), f"{name}: lse not finite for a sequence with keys"
    part = args["key_cache"].shape[2] * data.draw(st.integers(1, 3))
    size_like = data.draw(integer_like(part))
    out, lse = accepted(lambda: impl.paged_decode_split_k(**args, partition_size=size_like),
                        what=f"paged_decode_split_k(partition_size={size_like!r})")
    assert_all_finite("paged_decode_split_k", out, lse)
    assert _freeze(args) == before, "a call changed its input arrays"


@fuzz_settings(0.5)
@given(data=st.data())
def test_split_k_and_partition_integers_are_never_rounded(impl, data):
    args = data.draw(decode_cases())
    bad = data.draw(NON_INTEGERS)
    q0 = args["query"][0]
    bt0 = args["block_tables"][0]
    n = int(args["context_lens"][0])
    kc, vc, scale = args["key_cache"], args["value_cache"], args["scale"]
    cases = [
        (lambda: impl.paged_decode_split_k(**args, partition_size=bad), ("partition_size",)),
        (lambda: impl.paged_decode_split_k(**args, partition_size=data.draw(
            st.sampled_from([0, -4, 3, 10**30 + 1]))), ("partition_size",)),
        (lambda: impl.partition_attention(q0, kc, vc, bt0, bad, scale), ("context_len",)),
        (lambda: impl.partition_attention(q0, kc, vc, bt0, n, scale, bad), ("start_token_idx",)),
        (lambda: impl.partition_attention(q0, kc, vc, bt0, n, scale, 0, 2.5 if bad is None
                                          else bad), ("end_token_idx",)),  # None: to the end
        (lambda: impl.partition_attention(q0, kc, vc, bt0, n, scale, 0, n + 1), ("end_token_idx",)),
        (lambda: impl.partition_attention(q0, kc, vc, bt0, n, scale, compute_dtype=np.int32),
         ("compute_dtype",)),
        (lambda: impl.partition_attention(q0, kc, vc, bt0.astype(np.float64), n, scale),
         ("block_table",)),
        (lambda: impl.kv_head_indices(bad, 1), ("num_q_heads",)),
        (lambda: impl.kv_head_indices(4, bad), ("num_kv_heads",)),
        (lambda: impl.kv_head_indices(4, data.draw(st.sampled_from([0, 3, -2]))),
         ("num_q_heads",)),
    ]
    call, names = data.draw(st.sampled_from(cases))
    refused(call, names=names, what="a non-integer index, length or count")


@st.composite
def states(draw, lead=(2,), head_size=3):
    m = np.array(draw(st.lists(st.floats(-5, 5), min_size=lead[0], max_size=lead[0])))
    l = np.array(draw(st.lists(st.floats(0.5, 3), min_size=lead[0], max_size=lead[0])))
    acc = np.ones(lead + (head_size,))
    return m, l, acc


@fuzz_settings()
@given(data=st.data())
def test_state_building_blocks_refuse_bad_states(impl, data):
    m, l, acc = data.draw(states())
    scores, values = np.zeros((2, 4)), np.ones((2, 4, 3))
    bad_array = data.draw(st.sampled_from([None, 1.0, [1.0, 2.0], "x", np.array([1, 2]),
                                           torch.zeros(2)]))
    cases = [
        (lambda: impl.online_softmax_update(bad_array, l, acc, scores, values), ("m",)),
        (lambda: impl.online_softmax_update(m, l[:1], acc, scores, values), ("l",)),
        (lambda: impl.online_softmax_update(m, l, acc[..., :, None], scores, values), ("acc",)),
        (lambda: impl.online_softmax_update(m, l, acc, bad_array, values), ("scores",)),
        (lambda: impl.online_softmax_update(m, l, acc, np.zeros((3, 4)), values), ("scores",)),
        (lambda: impl.online_softmax_update(m, l, acc, scores, np.ones((2, 5, 3))), ("values",)),
        (lambda: impl.online_softmax_update(m, l, acc, scores, np.ones((3, 4, 3))), ("values",)),
        (lambda: impl.online_softmax_update(m, l, acc, scores, bad_array), ("values",)),
        (lambda: impl.finalize_state(m, bad_array, acc), ("l",)),
        (lambda: impl.finalize_state(m, l, np.ones((3, 3))), ("acc",)),
        (lambda: impl.merge_partitions(m[0], l[0], acc[0]), ("m",)),  # no partition axis
        (lambda: impl.merge_partitions(m[None, :0], l[None, :0], acc[None, :0][:0]), ("m",)),
        (lambda: impl.merge_partitions(np.zeros((0, 2)), np.zeros((0, 2)), np.zeros((0, 2, 3))),
         ("num_partitions",)),
        (lambda: impl.merge_attn_states(bad_array, m, acc, m), ("out_a",)),
        (lambda: impl.merge_attn_states(acc, m, acc[:1], m), ("out_b", "out_a")),
        (lambda: impl.merge_attn_states(acc, m, acc, bad_array), ("lse_b",)),
        (lambda: impl.empty_state(data.draw(st.sampled_from([None, 3, (2.0,), (-1,), "ab"])), 3),
         ("lead_shape",)),
        (lambda: impl.empty_state((2,), data.draw(st.one_of(NON_INTEGERS, st.integers(-3, 0)))),
         ("head_size",)),
        (lambda: impl.empty_state((2,), 3, data.draw(st.sampled_from(
            [np.int32, "int8", "nonsense", None, bool]))), ("dtype",)),
        (lambda: impl.round_to(data.draw(st.sampled_from(
            [None, "x", torch.zeros(2), [[1.0], [2.0, 3.0]], np.array([True])])), "float16"),
         ("x",)),
        (lambda: impl.round_to(np.ones(3), data.draw(st.sampled_from(
            ["fp16", "float32", None, np.float16]))), ("dtype",)),
    ]
    call, names = data.draw(st.sampled_from(cases))
    frozen = _freeze({"m": m, "l": l, "acc": acc})
    refused(call, names=names, snapshot=lambda: _freeze({"m": m, "l": l, "acc": acc}) == frozen
            or _freeze({"m": m, "l": l, "acc": acc}), what="a bad state")


@fuzz_settings(0.5)
@given(data=st.data())
def test_state_building_blocks_on_finite_data_are_finite(impl, data):
    m, l, acc = impl.empty_state((2,), 3)
    for _ in range(data.draw(st.integers(1, 3))):
        scores = np.array(data.draw(st.lists(st.floats(-50, 50), min_size=8, max_size=8))
                          ).reshape(2, 4)
        m, l, acc = impl.online_softmax_update(m, l, acc, scores, np.ones((2, 4, 3)))
    out, lse = impl.finalize_state(m, l, acc)
    assert_all_finite("online softmax", out, lse)
    out2, lse2 = impl.merge_attn_states(out, lse, *impl.finalize_state(*impl.empty_state((2,), 3)))
    assert_all_finite("merge_attn_states", out2, lse2)
    x = np.array(data.draw(st.lists(st.floats(-6e4, 6e4), min_size=1, max_size=5)))
    assert_all_finite("round_to", impl.round_to(x, data.draw(st.sampled_from(["float16",
                                                                              "bfloat16"]))))


@st.composite
def prefill_cases(draw):
    n = draw(st.integers(1, 3))
    q_lens = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    h_lens = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    case = ref_inputs.make_prefill_case(draw(st.integers(0, 99)), q_lens, h_lens, 2, 1, 4,
                                        draw(st.sampled_from([2, 4])), dtype=np.float32)
    kv = case.kv
    return dict(query=case.query, key_cache=kv.key_cache, value_cache=kv.value_cache,
                block_tables=kv.block_tables, cu_seqlens_q=case.cu_seqlens_q,
                context_lens=kv.context_lens, scale=case.scale)


@fuzz_settings()
@given(data=st.data())
def test_prefill_and_dense_refuse_each_bad_argument(impl, data):
    args = data.draw(prefill_cases())
    cu = args["cu_seqlens_q"].astype(np.int64)
    bad_cu = cu.copy()
    bad_cu[-1] += data.draw(st.sampled_from([1, 10**12]))
    cases = [
        ("cu_seqlens_q", data.draw(NOT_AN_ARRAY), ("cu_seqlens_q",)),
        ("cu_seqlens_q", cu.astype(np.float64), ("cu_seqlens_q",)),
        ("cu_seqlens_q", cu[:-1], ("cu_seqlens_q",)),
        ("cu_seqlens_q", bad_cu, ("cu_seqlens_q",)),
        ("cu_seqlens_q", np.concatenate([[1], cu[1:]]), ("cu_seqlens_q",)),  # must start at 0
        ("query", data.draw(NOT_AN_ARRAY), ("query",)),
        ("scale", data.draw(BAD_SCALES), ("scale",)),
        ("context_lens", np.zeros_like(args["context_lens"]) - 1, ("context_lens",)),
    ]
    fn_name = data.draw(st.sampled_from(["paged_prefill", "paged_prefill_ref"]))
    fn = getattr(impl, fn_name) if fn_name == "paged_prefill" else ref_oracle.paged_prefill_ref
    arg, bad, names = data.draw(st.sampled_from(cases))
    frozen = _freeze(args)
    refused(lambda: fn(**dict(args, **{arg: bad})), names=names,
            snapshot=lambda: _freeze(args) == frozen, what=f"{fn_name}({arg}=...)")
    out, lse = accepted(lambda: impl.paged_prefill(**args), what="paged_prefill")
    assert_all_finite("paged_prefill", out, lse)

    q = np.ones((2, 2, 4))
    k = np.ones((3, 1, 4))
    dense_cases = [
        (lambda: impl.dense_attention(data.draw(NOT_AN_ARRAY), k, k, 0.5), ("q",)),
        (lambda: impl.dense_attention(q, k.astype(int), k, 0.5), ("k",)),
        (lambda: impl.dense_attention(q, k, k[:2], 0.5), ("v",)),
        (lambda: impl.dense_attention(q, k, k, 0.5, causal=data.draw(st.sampled_from(
            [None, 1, "yes", 0.0]))), ("causal",)),
        (lambda: impl.dense_attention(q, k, k, data.draw(BAD_SCALES)), ("scale",)),
        (lambda: impl.dense_attention(q, k, k, 0.5, alibi_slopes=np.ones(5)), ("alibi_slopes",)),
        (lambda: impl.dense_attention(np.ones((4, 2, 4)), k, k, 0.5), ("q_len",)),
        (lambda: impl.dense_attention(np.ones((2, 2, 5)), k, k, 0.5), ("head_size",)),
        (lambda: ref_oracle.attention_ref(q, k, k[:2], 0.5), ("v",)),
        (lambda: ref_oracle.attention_ref(data.draw(NOT_AN_ARRAY), k, k, 0.5), ("q",)),
    ]
    call, names = data.draw(st.sampled_from(dense_cases))
    refused(call, names=names, what="a bad dense_attention call")


@fuzz_settings(0.5)
@given(data=st.data())
def test_reference_input_builders_refuse_bad_arguments(data):
    bad = data.draw(st.one_of(NON_INTEGERS, st.integers(-3, 0)))
    cases = [
        (lambda: ref_inputs.make_paged_kv(0, [3], 1, 4, bad), ("block_size",)),
        (lambda: ref_inputs.make_paged_kv(0, [3], bad, 4, 2), ("num_kv_heads",)),
        (lambda: ref_inputs.make_paged_kv(0, data.draw(st.sampled_from(
            [None, [1.5], [-1], "3", [[1]]])), 1, 4, 2), ("context_lens",)),
        (lambda: ref_inputs.make_decode_case(0, [3], bad, 1, 4, 2), ("num_q_heads",)),
        (lambda: ref_inputs.make_decode_case(0, [3], 3, 2, 4, 2), ("num_q_heads",)),
        (lambda: ref_inputs.make_prefill_case(0, [1, 2], [1], 2, 1, 4, 2), ("history_lens",)),
        (lambda: ref_inputs.alibi_slopes(bad), ("num_heads",)),
        (lambda: ref_oracle.gather_kv(np.ones((2, 1, 2, 4)), np.ones((2, 1, 2, 4)),
                                      np.array([0, -1]), 3), ("block_table",)),
        (lambda: ref_oracle.gather_kv(np.ones((2, 1, 2, 4)), np.ones((2, 1, 2, 4)),
                                      np.array([0, 1]), bad), ("context_len",)),
    ]
    call, names = data.draw(st.sampled_from(cases))
    refused(call, names=names, what="a bad reference input builder call")


@fuzz_settings(0.5)
@given(data=st.data())
def test_non_finite_data_reaches_exactly_the_queries_that_read_it(impl, data):
    """The NaN/inf contract: a NaN or ±inf in a key or value row makes the output of every
    query head that reads it non-finite (an infinite key is never taken for a masked one), and
    leaves every other sequence's output exactly as it was."""
    args = data.draw(decode_cases())
    lens = args["context_lens"]
    assume_seq = [s for s in range(len(lens)) if lens[s] > 0]
    if not assume_seq:
        return
    args["query"] = np.abs(args["query"]) + np.asarray(0.1, args["query"].dtype)
    args["alibi_slopes"] = None
    fn_name = data.draw(st.sampled_from(["paged_decode", "paged_decode_split_k",
                                         "paged_decode_lowp"]))
    fn = getattr(impl, fn_name)
    extra = {"partition_size": args["key_cache"].shape[2]} if "split_k" in fn_name else {}
    clean_out, _ = fn(**args, **extra)
    s = data.draw(st.sampled_from(assume_seq))
    t = data.draw(st.integers(0, int(lens[s]) - 1))
    block_size = args["key_cache"].shape[2]
    block, row = int(args["block_tables"][s, t // block_size]), t % block_size
    kv_head = data.draw(st.integers(0, args["key_cache"].shape[1] - 1))
    cache, value = data.draw(st.sampled_from([("key_cache", -np.inf), ("key_cache", np.nan),
                                              ("value_cache", np.inf), ("value_cache", np.nan)]))
    poisoned = args[cache].copy()
    poisoned[block, kv_head, row, :] = value
    out, lse = fn(**dict(args, **{cache: poisoned}), **extra)
    group = args["query"].shape[1] // args["key_cache"].shape[1]
    heads = list(range(kv_head * group, (kv_head + 1) * group))
    assert not np.isfinite(out[s, heads]).all(axis=-1).any(), (
        f"{fn_name}: {value} in {cache} row read by sequence {s} left a finite output "
        f"(a -inf score from data must not be read as a masked key)")
    others = [i for i in range(len(lens)) if i != s]
    assert np.array_equal(out[others], clean_out[others], equal_nan=True), (
        f"{fn_name}: poisoning sequence {s}'s row changed another sequence's output")
