"""Lab 3, Task 5: numerics — fp16/bf16 data with fp32 arithmetic, and the tolerance a kernel test needs.

The low-precision decode is compared with the float64 oracle run on the *same rounded inputs*
(what the kernel actually reads), so the error measured is the kernel's arithmetic and output
rounding — not the quantisation of the data, which no kernel can undo.
"""

from __future__ import annotations

import numpy as np
import pytest

from labs.lab03_paged_attention_oracle._compare import rel_error_per_row, round_half
from reference.inputs import make_decode_case
from reference.oracle import paged_decode_ref

#: The tolerance Labs 4–5 use for fp16/bf16 KV with fp32 accumulation: per (seq, head) row,
#: ‖out − ref‖₂ / ‖ref‖₂ < 1e-2, with ref the float64 oracle on the same rounded inputs.
KERNEL_RTOL = 1e-2
#: Log-sum-exp is computed in fp32 and never rounded to half precision.
KERNEL_LSE_ATOL = 1e-3


def _lowp_case(seed, context_lens, dtype, *, query_scale=1.0, **kw):
    """A decode case whose query and caches are rounded to dtype, plus the oracle on them."""
    case = make_decode_case(seed, context_lens, 8, 2, 64, 16, dtype=np.float32, **kw)
    case.query = round_half(case.query * query_scale, dtype)
    case.kv.key_cache = round_half(case.kv.key_cache, dtype)
    case.kv.value_cache = round_half(case.kv.value_cache, dtype)
    kv = case.kv
    args = (case.query, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, case.scale)
    return args, paged_decode_ref(*args, alibi_slopes=case.alibi_slopes), case.alibi_slopes


def _report(rel, lens):
    s, h = np.unravel_index(np.nanargmax(rel), rel.shape)
    return f"worst row: seq {s} (context_len {int(lens[s])}), head {h}: relative error {rel[s, h]:.3g}"


@pytest.mark.points(2)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_lowp_decode_is_within_the_kernel_tolerance(impl, dtype):
    """fp16/bf16 data with fp32 arithmetic stays within the kernels' tolerance: per (seq, head)
    ‖out − ref‖/‖ref‖ < 1e-2 and |lse − ref| < 1e-3; zero-length rows are exactly (0, -inf).
    """
    args, (want_out, want_lse), slopes = _lowp_case(51, [0, 1, 7, 64, 300, 1000], dtype, alibi=True)
    out, lse = impl.paged_decode_lowp(*args, slopes, dtype=dtype)
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    rel = rel_error_per_row(out, want_out)
    assert not np.isnan(rel).any(), "NaN in the low-precision output"
    assert rel.max() < KERNEL_RTOL, f"{dtype}: {_report(rel, args[4])} >= {KERNEL_RTOL}"
    assert (out[0] == 0).all() and np.isneginf(lse[0]).all(), "context_len 0 must give (0, -inf)"
    err = np.abs(lse[1:] - want_lse[1:]).max()
    assert err < KERNEL_LSE_ATOL, f"{dtype}: lse off by {err:.3g} (fp32 arithmetic should give ~1e-6)"


@pytest.mark.points(1)
def test_lowp_error_is_far_above_float64_rounding(impl):
    """A correct fp16 kernel is ~1e-4 off the float64 answer, so a 1e-6 test would reject it.

    The output is stored in fp16 (its values must be fp16 numbers), and storing alone moves each
    element by up to 2^-11 of its size: the error is real, expected, and not a bug.
    """
    args, (want_out, _), _ = _lowp_case(52, [33, 200, 517], "float16")
    out, _ = impl.paged_decode_lowp(*args, dtype="float16")
    assert np.array_equal(out, out.astype(np.float16).astype(np.float32)), (
        "paged_decode_lowp must return fp16 values (round the output as a kernel's store does)")
    rel = rel_error_per_row(out, want_out)
    assert np.median(rel) > 1e-5, (
        f"median relative error {np.median(rel):.3g} is at float64 level: the fp16/fp32 emulation "
        f"is not happening (round inputs and output, compute in float32)")
    assert rel.max() < KERNEL_RTOL, _report(rel, args[4])


@pytest.mark.points(1)
def test_lowp_accumulates_in_fp32_on_long_contexts(impl):
    """Over 16,384 tokens fp32 accumulation keeps the error at fp16's rounding level (< 1e-3).

    With nearly uniform weights the denominator grows to ~16,000, where fp16's spacing is 16: an
    fp16 accumulator rounds every block's contribution and drifts by about 1 %.
    """
    case = make_decode_case(53, [16384], 2, 1, 16, 64, dtype=np.float16)
    case.query = (case.query.astype(np.float32) * 0.1).astype(np.float16)  # nearly uniform weights
    kv = case.kv
    args = (case.query, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, case.scale)
    want_out, want_lse = paged_decode_ref(*args)
    out, lse = impl.paged_decode_lowp(*args, dtype="float16")
    rel = rel_error_per_row(out, want_out)
    # NOTE: an fp16 accumulator drifts by about 1 %; an error far beyond that is not precision
    # but a wrong recurrence (the rescale when the running max grows), so the hint says which.
    cause = ("the error grows with context length — are l and acc kept in fp32?"
             if rel.max() < 0.05 else
             "far more than fp16 accumulation could drift (~1 %): when the running max grows, are "
             "l and acc rescaled by exp(m_old - m_new) before the new block is added?")
    assert rel.max() < 1e-3, f"{_report(rel, kv.context_lens)}: {cause}"
    err = np.abs(lse - want_lse).max()
    assert err < 1e-5, f"lse off by {err:.3g} over 16k tokens: accumulate the denominator in fp32"


@pytest.mark.points(1)
def test_lowp_logits_around_90_do_not_overflow(impl):
    """Logits around ±90 (exp(90) overflows fp32) give finite results within the kernel tolerance."""
    case = make_decode_case(54, [20, 90], 8, 2, 64, 16, dtype=np.float32)
    top = max(np.einsum("hd,thd->th", case.query[s], np.repeat(keys, 4, axis=1)).max()
              for s, keys in enumerate(case.kv.keys)) * case.scale
    args, (want_out, want_lse), _ = _lowp_case(54, [20, 90], "float16", query_scale=90.0 / top)
    out, lse = impl.paged_decode_lowp(*args, dtype="float16")
    assert np.abs(want_lse).max() > 80, "test setup: logits should reach about ±90"
    assert np.isfinite(out).all() and np.isfinite(lse).all(), (
        "overflow: exp(90) is inf in fp32 — subtract the running max before exponentiating")
    rel = rel_error_per_row(out, want_out)
    assert rel.max() < KERNEL_RTOL, _report(rel, args[4])
