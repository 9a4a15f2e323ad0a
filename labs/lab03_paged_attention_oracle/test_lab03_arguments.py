"""Lab 3, Part F: every argument is used and every default is what it says.

The classic tests pass ``scale = 1/sqrt(head_size)`` and ``causal=True`` every time, so a
function that hard-codes them passes. Here each function gets an unconventional scale (and a
second one), and the documented defaults are exercised by omitting the argument.
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
)
from reference.inputs import make_decode_case, make_prefill_case
from reference.oracle import attention_ref, paged_decode_ref

SCALES = (0.37, 1.9)


def _decode_case(scale):
    case = make_decode_case(31, [5, 12, 1], 4, 2, 8, 4)
    case.scale = scale
    return case


def _run(impl, function, scale):
    """(got, want) of one function at one scale, against the float64 oracle."""
    if function == "paged_decode":
        case = _decode_case(scale)
        return impl.paged_decode(*decode_args(case)), decode_oracle(case)
    if function == "paged_decode_split_k":
        case = _decode_case(scale)
        return impl.paged_decode_split_k(*decode_args(case), 4), decode_oracle(case)
    if function == "partition_attention":
        case = _decode_case(scale)
        kv = case.kv
        state = impl.partition_attention(case.query[1], kv.key_cache, kv.value_cache,
                                         kv.block_tables[1], int(kv.context_lens[1]), scale)
        out, lse = impl.finalize_state(*state)
        want_out, want_lse = decode_oracle(case)
        return (out[None], lse[None]), (want_out[1:2], want_lse[1:2])
    if function == "paged_prefill":
        case = make_prefill_case(32, [3, 5], [4, 0], 4, 2, 8, 4)
        case.scale = scale
        return impl.paged_prefill(*prefill_args(case)), prefill_oracle(case)
    assert function == "dense_attention"
    rng = np.random.default_rng(33)
    q = rng.standard_normal((3, 4, 8))
    k, v = rng.standard_normal((2, 7, 2, 8))
    return impl.dense_attention(q, k, v, scale), attention_ref(q, k, v, scale)


@pytest.mark.points(1)
@pytest.mark.parametrize("function", ["dense_attention", "partition_attention", "paged_decode",
                                      "paged_prefill", "paged_decode_split_k"])
def test_scale_is_used_not_assumed(impl, function):
    """Each attention function multiplies q·k by the scale it is given — checked at scales
    0.37 and 1.9 (the conventional 1/sqrt(head_size) would be 0.354)."""
    for scale in SCALES:
        (out, lse), (want_out, want_lse) = _run(impl, function, scale)
        hint = (f"{function} at scale={scale} differs from the oracle — likely cause: the scale "
                f"argument ignored and 1/sqrt(head_size) used instead")
        assert_attention_close(out, want_out, atol=1e-6, what=f"{function} out", hint=hint)
        assert_attention_close(lse, want_lse, atol=1e-6, what=f"{function} lse", hint=hint)


@pytest.mark.points(1)
def test_dense_attention_is_causal_by_default(impl):
    """Omitting ``causal`` masks future keys (the documented default is True), and omitting
    ``alibi_slopes`` adds no bias. Every argument can be passed by name, and the two after
    ``*`` only by name (a positional ``False`` is a TypeError, never a silent mode switch)."""
    rng = np.random.default_rng(34)
    q = rng.standard_normal((3, 2, 4))
    k, v = rng.standard_normal((2, 6, 2, 4))
    got = impl.dense_attention(q, k, v, 0.5)
    want = attention_ref(q, k, v, 0.5, causal=True, alibi_slopes=None)
    hint = "omitting causal must give causal attention — likely cause: the default causal=False"
    assert_attention_close(got[0], want[0], atol=1e-9, what="dense_attention out", hint=hint)
    assert_attention_close(got[1], want[1], atol=1e-9, what="dense_attention lse", hint=hint)
    by_name = impl.dense_attention(q=q, k=k, v=v, scale=0.5, causal=True, alibi_slopes=None)
    assert np.array_equal(by_name[0], got[0]), "dense_attention by keyword gave another result"
    with pytest.raises(TypeError):
        impl.dense_attention(q, k, v, 0.5, False)


@pytest.mark.points(1)
def test_decode_defaults_are_no_alibi_and_the_whole_context(impl):
    """paged_decode without alibi_slopes adds no bias; partition_attention without a range
    attends to the whole context; paged_decode_lowp without dtype rounds to float16, takes
    every argument by name, and dtype only by name."""
    case = make_decode_case(35, [9, 4], 4, 4, 8, 4)
    want_out, want_lse = paged_decode_ref(*decode_args(case), alibi_slopes=None)
    out, lse = impl.paged_decode(*decode_args(case))
    assert_attention_close(out, want_out, atol=1e-6, what="paged_decode out (no alibi_slopes)")
    kv = case.kv
    state = impl.partition_attention(case.query[0], kv.key_cache, kv.value_cache,
                                     kv.block_tables[0], 9, case.scale)
    full = impl.partition_attention(case.query[0], kv.key_cache, kv.value_cache,
                                    kv.block_tables[0], 9, case.scale, 0, 9)
    for a, b in zip(state, full):
        np.testing.assert_array_equal(a, b, err_msg="the default range must be [0, context_len)")
    low, _ = impl.paged_decode_lowp(*decode_args(case))
    assert np.array_equal(low, low.astype(np.float16).astype(np.float32)), (
        "the documented default dtype of paged_decode_lowp is float16")
    names = ("query", "key_cache", "value_cache", "block_tables", "context_lens", "scale")
    by_name = impl.paged_decode_lowp(**dict(zip(names, decode_args(case))), alibi_slopes=None,
                                     dtype="float16")
    assert np.array_equal(by_name[0], low), "paged_decode_lowp by keyword gave another result"
    with pytest.raises(TypeError):  # dtype comes after `*`: keyword-only
        impl.paged_decode_lowp(*decode_args(case), None, "bfloat16")
