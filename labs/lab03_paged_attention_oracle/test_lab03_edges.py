"""Lab 3, Part G: the edges the classic cases avoid — logits past float64's exp range, block
sizes that are not powers of two, ranges one past the context, batches with no key at all,
and what exactly the low-precision decode rounds, and how."""

from __future__ import annotations

import numpy as np
import pytest

from labs.lab03_paged_attention_oracle._compare import (
    assert_attention_close,
    check_decode,
    decode_args,
    decode_oracle,
    prefill_args,
    prefill_oracle,
    round_half,
)
from reference.expect import raises_naming
from reference.inputs import make_decode_case, make_prefill_case
from reference.oracle import attention_ref, paged_decode_ref


@pytest.mark.points(1)
def test_dense_attention_survives_logits_past_the_float64_exp_range(impl):
    """dense_attention with logits beyond ±800 (exp overflows float64 past 709) still matches
    the oracle: finite outputs and exact lse."""
    rng = np.random.default_rng(41)
    q = rng.standard_normal((3, 2, 8)) * 400
    k, v = rng.standard_normal((5, 2, 8)), rng.standard_normal((5, 2, 8))
    out, lse = impl.dense_attention(q, k, v, 1.0)
    want_out, want_lse = attention_ref(q, k, v, 1.0)
    assert np.abs(want_lse).max() > 800, "the case must really exceed float64's exp range"
    hint = ("NaN or inf with logits past 709 — likely cause: exp(scores) without subtracting "
            "the row max first (float64 hides it only up to ~709)")
    assert_attention_close(out, want_out, atol=1e-9, what="dense_attention out", hint=hint)
    assert_attention_close(lse, want_lse, atol=1e-9, what="dense_attention lse", hint=hint)


@pytest.mark.points(2)
@pytest.mark.parametrize("block_size", [3, 6])
def test_block_sizes_that_are_not_powers_of_two_match_the_oracle(impl, block_size):
    """Block sizes 3 and 6: decode, split-K at every multiple of the block size up to the
    longest context, and prefill with history all match the oracle; a partition size that is not
    a multiple of the block size is refused."""
    case = make_decode_case(42 + block_size, [1, 2 * block_size + 1, 4 * block_size], 4, 2, 8,
                            block_size)
    check_decode(impl, case, hint=f"block_size={block_size}")
    want_out, want_lse = decode_oracle(case)
    for partition_size in range(block_size, 5 * block_size, block_size):
        out, lse = impl.paged_decode_split_k(*decode_args(case), partition_size)
        hint = (f"block_size={block_size}, partition_size={partition_size} — likely cause: a "
                f"shift or bitmask standing in for // or % (right only for powers of two)")
        assert_attention_close(out, want_out, atol=1e-6, what="split-K out", hint=hint)
        assert_attention_close(lse, want_lse, atol=1e-6, what="split-K lse", hint=hint)
    for bad in (block_size + 1, 8 if block_size == 6 else 4, 2 * block_size - 1):
        with pytest.raises(ValueError, match="partition_size"):
            impl.paged_decode_split_k(*decode_args(case), bad)
    pre = make_prefill_case(44 + block_size, [block_size + 2, 1], [block_size - 1, 2 * block_size],
                            4, 2, 8, block_size)
    out, lse = impl.paged_prefill(*prefill_args(pre))
    want_out, want_lse = prefill_oracle(pre)
    assert_attention_close(out, want_out, atol=1e-6, what="paged_prefill out")
    assert_attention_close(lse, want_lse, atol=1e-6, what="paged_prefill lse")


@pytest.mark.points(1)
def test_partition_range_past_the_context_is_refused(impl):
    """partition_attention accepts ``0 <= start <= end <= context_len`` (end exactly the context,
    an empty range at the end) and refuses end one past the context, start past end, start < 0,
    with a ValueError."""
    case = make_decode_case(45, [7], 2, 2, 4, 4)
    kv = case.kv
    args = (case.query[0], kv.key_cache, kv.value_cache, kv.block_tables[0], 7, case.scale)
    m, l, acc = impl.partition_attention(*args, 4, 7)
    assert np.isfinite(acc).all(), "the range [4, 7) holds tokens 4, 5, 6 only"
    m, l, acc = impl.partition_attention(*args, 7, 7)
    assert np.isneginf(m).all() and (l == 0).all() and (acc == 0).all(), "an empty range is empty"
    for start, end in ((4, 8), (0, 8), (5, 4), (-1, 3)):
        raises_naming(lambda: impl.partition_attention(*args, start, end), ValueError, None,
                      f"partition_attention(start={start}, end={end}) with context_len 7",
                      crashed_hint=" (the docstring: a range outside 0 <= start <= end <= "
                                   "context_len is a ValueError)",
                      accepted_hint=" — a range past the context reads rows that hold no token; "
                                    "check 0 <= start <= end <= context_len first")


@pytest.mark.points(1)
def test_split_k_of_an_all_empty_batch_is_empty(impl):
    """A split-K batch whose sequences all have context 0 returns out 0 and lse -inf for every
    (sequence, head), like paged_decode — the grid still has one (empty) partition."""
    case = make_decode_case(46, [0, 0, 0], 4, 2, 8, 4)
    for partition_size in (4, 8):
        try:
            out, lse = impl.paged_decode_split_k(*decode_args(case), partition_size)
        except ValueError as exc:
            raise AssertionError(
                f"split-K of an all-empty batch raised {exc!r} — likely cause: a grid of "
                f"num_blocks_for(max context_len) = 0 partitions (take at least one)"
            ) from None
        assert out.shape == (3, 4, 8) and (out == 0).all(), "empty sequences give out exactly 0"
        assert np.isneginf(lse).all(), "empty sequences give lse -inf"


@pytest.mark.points(1)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_lowp_sees_only_what_the_kernel_loads(impl, dtype):
    """paged_decode_lowp on raw float32 inputs equals, bit for bit, paged_decode_lowp on the same
    inputs already rounded to the storage dtype: the kernel only ever loads rounded values."""
    case = make_decode_case(47, [5, 13, 20], 4, 2, 16, 4, dtype=np.float32)
    kv = case.kv
    raw = (case.query, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, case.scale)
    rounded = (round_half(case.query, dtype), round_half(kv.key_cache, dtype),
               round_half(kv.value_cache, dtype), kv.block_tables, kv.context_lens, case.scale)
    out_raw, lse_raw = impl.paged_decode_lowp(*raw, dtype=dtype)
    out_rnd, lse_rnd = impl.paged_decode_lowp(*rounded, dtype=dtype)
    assert np.array_equal(lse_raw, lse_rnd) and np.array_equal(out_raw, out_rnd), (
        f"{dtype}: raw and pre-rounded inputs give different results (max lse difference "
        f"{np.abs(lse_raw - lse_rnd).max():.2e}) — likely cause: query or caches not rounded "
        f"with round_to before the float32 arithmetic"
    )


def _ulp(x, dtype: str):
    """The spacing of ``dtype`` values at |x| (normal range)."""
    mantissa_bits = 10 if dtype == "float16" else 7
    exponent = np.floor(np.log2(np.maximum(np.abs(x), 2.0**-14)))
    return 2.0 ** (exponent - mantissa_bits)


@pytest.mark.points(1)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_lowp_output_is_rounded_to_nearest(impl, dtype):
    """Every output element of paged_decode_lowp lies within half a unit in the last place of
    the storage dtype (plus a tenth of an ulp of float32 slack) of the float64 oracle on the
    rounded inputs: the output is rounded to nearest, not truncated."""
    case = make_decode_case(48, [6, 17, 33, 2], 8, 2, 32, 4, dtype=np.float32)
    kv = case.kv
    q, kc, vc = (round_half(a, dtype) for a in (case.query, kv.key_cache, kv.value_cache))
    out, _ = impl.paged_decode_lowp(case.query, kv.key_cache, kv.value_cache, kv.block_tables,
                                    kv.context_lens, case.scale, dtype=dtype)
    ref, _ = paged_decode_ref(q, kc, vc, kv.block_tables, kv.context_lens, case.scale)
    err = np.abs(out.astype(np.float64) - ref)
    # Half an ulp is the rounding; the rest is slack for float32 arithmetic, which can move an
    # exact value sitting near a tie to the other side: a tenth of an ulp, and a little relative
    # to the element and to its row (a small element of a large row carries the row's error).
    # Truncation errs by up to a whole ulp, so about 40 % of its outputs still fail this bound.
    row_scale = np.abs(ref).max(axis=-1, keepdims=True)
    bound = 0.6 * _ulp(ref, dtype) + 1e-5 * np.abs(ref) + 1e-6 * row_scale
    bad = err > bound
    assert not bad.any(), (
        f"{dtype}: {bad.sum()} of {bad.size} outputs are more than half an ulp from the exact "
        f"result (worst {(err / _ulp(ref, dtype)).max():.2f} ulp) — likely cause: the output "
        f"rounded by truncation (bits chopped) instead of round_to's nearest-even"
    )
