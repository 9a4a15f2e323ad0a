"""Test helpers for Lab 3: comparisons whose failure messages say where and, likely, why.

Every comparison is against ``reference.oracle`` (trusted float64) — never against your own
``dense_attention``, so a wrong dense cannot make a paged test pass.
"""

from __future__ import annotations

import numpy as np

from reference.inputs import DecodeCase, PrefillCase
from reference.oracle import paged_decode_ref, paged_prefill_ref

POISON_HINT = (
    "NaN in the output where the answer is finite: your code read a poisoned element — a row "
    "past context_len in a partial last block, an unused block, or a PAD_BLOCK_ID (-1) entry "
    "of the block table (NumPy wraps -1 to the last physical block instead of failing)"
)


def _where(index: tuple, names: tuple) -> str:
    return ", ".join(f"{n}={int(i)}" for n, i in zip(names, index))


def assert_attention_close(got, want, *, atol: float, what: str,
                           names: tuple = ("seq", "head"), hint: str = "") -> None:
    """Asserts ``got`` equals ``want`` to ``atol``, naming the first bad (seq, head, ...).

    Args:
        got: [..., head_size] output under test (or [...] for a log-sum-exp).
        want: same shape, from the trusted oracle. -inf entries must be -inf in ``got`` too.
        atol: absolute tolerance on finite entries.
        what: what is compared, for the message (e.g. "paged_decode out").
        names: names of the leading axes, for the message.
        hint: the likely cause, appended to the message when the values differ.
    """
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    neg_inf = np.isneginf(want)
    if neg_inf.any():
        wrong = neg_inf != np.isneginf(got)
        if wrong.any():
            idx = tuple(np.argwhere(wrong)[0])
            raise AssertionError(f"{what}: at {_where(idx, names)} got {got[idx]}, expected -inf "
                                 f"exactly where the oracle has -inf (a query that sees no key)")
    finite = ~neg_inf
    nan = np.isnan(got) & finite
    if nan.any():
        idx = tuple(np.argwhere(nan)[0])
        raise AssertionError(f"{what}: NaN at {_where(idx, names)}. {POISON_HINT}, or computed "
                             f"exp(-inf - -inf) for a state that has seen no key yet")
    err = np.where(finite, np.abs(got - np.where(finite, want, 0.0)), 0.0)
    if err.max(initial=0.0) > atol:
        idx = tuple(np.argwhere(err > atol)[0])
        lead = idx[: len(names)]
        raise AssertionError(
            f"{what}: max |error| {err.max():.3g} > {atol:g}; first bad at {_where(lead, names)}: "
            f"got {np.array2string(got[lead], precision=5, threshold=6)}, expected "
            f"{np.array2string(want[lead], precision=5, threshold=6)}" + (f". {hint}" if hint else "")
        )


def decode_args(case: DecodeCase) -> tuple:
    """The positional arguments of paged_decode for a generated case."""
    kv = case.kv
    return case.query, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, case.scale


def prefill_args(case: PrefillCase) -> tuple:
    """The positional arguments of paged_prefill for a generated case."""
    kv = case.kv
    return (case.query, kv.key_cache, kv.value_cache, kv.block_tables, case.cu_seqlens_q,
            kv.context_lens, case.scale)


def decode_oracle(case: DecodeCase):
    """(out, lse) of the trusted float64 oracle for a decode case."""
    return paged_decode_ref(*decode_args(case), alibi_slopes=case.alibi_slopes)


def prefill_oracle(case: PrefillCase):
    """(out, lse) of the trusted float64 oracle for a prefill case."""
    return paged_prefill_ref(*prefill_args(case), alibi_slopes=case.alibi_slopes)


def check_decode(impl, case: DecodeCase, *, atol: float = 1e-6, hint: str = "") -> None:
    """Runs impl.paged_decode on a case and compares out and lse with the oracle."""
    out, lse = impl.paged_decode(*decode_args(case), alibi_slopes=case.alibi_slopes)
    want_out, want_lse = decode_oracle(case)
    assert_attention_close(out, want_out, atol=atol, what="paged_decode out", hint=hint)
    assert_attention_close(lse, want_lse, atol=atol, what="paged_decode lse", hint=hint)


def rel_error_per_row(got, want) -> np.ndarray:
    """‖got − want‖ / ‖want‖ per (seq, head) row; rows where want is all zero compare absolutely.

    Args:
        got: [num_seqs, num_q_heads, head_size]
        want: [num_seqs, num_q_heads, head_size]

    Returns:
        [num_seqs, num_q_heads] relative errors (NaN if got has NaN).
    """
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    num = np.linalg.norm(got - want, axis=-1)
    den = np.linalg.norm(want, axis=-1)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), num)


def round_half(x, dtype: str) -> np.ndarray:
    """Trusted rounding to float16/bfloat16 (nearest, ties to even), as float32 holding those values.

    Written independently of the lab's ``round_to`` so the tests do not trust student code.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    assert dtype == "bfloat16", dtype
    bits = x.view(np.uint32)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + lsb) >> 16 << 16).astype(np.uint32)
    return np.where(np.isnan(x), np.float32(np.nan), rounded.view(np.float32))
