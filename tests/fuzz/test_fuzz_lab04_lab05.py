"""Bad-input probes of the CPU-side validation of Labs 4–5 (the kernel launchers' checks and
planners), against their *public* functions only: the same contract as Labs 1–3 — a
documented error naming the argument, nothing half-done, integer arguments never computed in
the caller's NumPy integer type.

NOTE: a probe that fails on the solutions gets an entry in ``FINDINGS`` (it is then ``xfail``
with the finding as the reason); fix the finding and remove the entry. Issue #19's findings
for Labs 4–5 are all fixed, so every probe here must pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from _fuzz_harness import accepted, fuzz_settings, refused
from reference.loader import load_impl

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def lab4():
    return load_impl("lab04_decode_kernels")


@pytest.fixture(scope="module")
def lab5():
    return load_impl("lab05_prefill_kernels")


def decode_args(num_seqs=2, num_q_heads=4, num_kv_heads=2, head_size=64, block_size=16):
    """Valid CPU tensors for a decode call (2 blocks per sequence)."""
    num_blocks = 2 * num_seqs + 1
    return dict(
        query=torch.zeros(num_seqs, num_q_heads, head_size, dtype=torch.float16),
        key_cache=torch.zeros(num_blocks, num_kv_heads, block_size, head_size,
                              dtype=torch.float16),
        value_cache=torch.zeros(num_blocks, num_kv_heads, block_size, head_size,
                                dtype=torch.float16),
        block_tables=torch.arange(2 * num_seqs, dtype=torch.int32).view(num_seqs, 2),
        context_lens=torch.full((num_seqs,), 20, dtype=torch.int32),
    )


def prefill_args(head_size=64, block_size=16):
    """Valid CPU tensors for a prefill call: 2 sequences of 3 and 5 new tokens."""
    return dict(
        query=torch.zeros(8, 4, head_size, dtype=torch.float16),
        key_cache=torch.zeros(5, 2, block_size, head_size, dtype=torch.float16),
        value_cache=torch.zeros(5, 2, block_size, head_size, dtype=torch.float16),
        block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, 3, 8], dtype=torch.int32),
        context_lens=torch.tensor([10, 20], dtype=torch.int32),
    )


def _decode(lab4, **change):
    args = dict(decode_args(), scale=0.125)
    args.update(change)
    return lab4.check_decode_args(**args)


def _prefill(lab5, **change):
    args = dict(prefill_args(), scale=0.125, kernel="naive")
    args.update(change)
    return lab5.check_prefill_inputs(**args)


def xfail(reason):
    return pytest.mark.xfail(reason=reason, strict=False)


LAB4_PROBES = {
    "scale 1e39 (inf in float32)": (lambda m: _decode(m, scale=1e39), ("scale",)),
    "scale 1e-50 (0 in float32)": (lambda m: _decode(m, scale=1e-50), ("scale",)),
    "scale 10**400": (lambda m: _decode(m, scale=10**400), ("scale",)),
    "scale NaN": (lambda m: _decode(m, scale=float("nan")), ("scale",)),
    "scale '0.1'": (lambda m: _decode(m, scale="0.1"), ("scale",)),
    "num_q_heads 0": (lambda m: _decode(m, query=torch.zeros(2, 0, 64, dtype=torch.float16)),
                      ("num_q_heads", "query")),
    "query None": (lambda m: _decode(m, query=None), ("query",)),
    "block_tables float": (lambda m: _decode(m, block_tables=decode_args()["block_tables"]
                                             .float()), ("block_tables",)),
    "context_lens too long": (lambda m: _decode(m, context_lens=torch.tensor(
        [20, 33], dtype=torch.int32)), ("context_lens",)),
    "heads_per_cta(0)": (lambda m: m.heads_per_cta(0), ("group",)),
    "heads_per_cta(2.5)": (lambda m: m.heads_per_cta(2.5), ("group",)),
    "check_on_cuda() with no tensors": (lambda m: m.check_on_cuda(), ("tensor",)),
    "plan_split_kv num_sms 0": (lambda m: m.plan_split_kv(2, 2, 100, 0), ("num_sms",)),
    "plan_split_kv num_seqs 1.5": (lambda m: m.plan_split_kv(1.5, 2, 100, 132), ("num_seqs",)),
}

LAB5_PROBES = {
    "scale 1e39 (inf in float32)": (lambda m: _prefill(m, scale=1e39), ("scale",)),
    "scale 1e-50 (0 in float32)": (lambda m: _prefill(m, scale=1e-50), ("scale",)),
    "scale 10**400": (lambda m: _prefill(m, scale=10**400), ("scale",)),
    "alibi slopes NaN": (lambda m: _prefill(m, alibi_slopes=torch.full((4,), float("nan"))),
                         ("alibi_slopes",)),
    "alibi slopes inf": (lambda m: _prefill(m, alibi_slopes=torch.full((4,), float("inf"))),
                         ("alibi_slopes",)),
    "num_q_heads 0": (lambda m: _prefill(m, query=torch.zeros(8, 0, 64, dtype=torch.float16)),
                      ("num_q_heads", "query")),
    "cu_seqlens_q None": (lambda m: _prefill(m, cu_seqlens_q=None), ("cu_seqlens_q",)),
    "plan block_m 0": (lambda m: m.plan_query_tiles(torch.tensor([0, 3]), torch.tensor([3]),
                                                    block_m=0), ("block_m",)),
    "plan block_n 0": (lambda m: m.plan_query_tiles(torch.tensor([0, 3]), torch.tensor([3]),
                                                    block_n=0), ("block_n",)),
    "plan cu_seqlens_q None": (lambda m: m.plan_query_tiles(None, torch.tensor([3])),
                               ("cu_seqlens_q",)),
    "kernel_tiling unknown kernel": (lambda m: m.kernel_tiling("fast", 4, 2), ("kernel",)),
    "kernel_tiling num_kv_heads 0": (lambda m: m.kernel_tiling("tc", 4, 0), ("num_kv_heads",)),
    "check_on_cuda() with no arrays": (lambda m: m.check_on_cuda(), ("array", "tensor")),
}

#: What the probes found on the solutions as of this commit (each probe below is xfail until
#: its finding is fixed; remove the entry then).
FINDINGS: dict = {}


def _params(lab, probes):
    out = []
    for name in probes:
        reason = FINDINGS.get((lab, name))
        marks = xfail(f"finding (Lab {lab}): {reason}") if reason else ()
        out.append(pytest.param(name, marks=marks))
    return out


def _run_probe(module, probe):
    call, names = probe
    refused(lambda: call(module), names=names, what="probe")


@pytest.mark.parametrize("name", _params(4, LAB4_PROBES))
def test_lab04_validation_probes(lab4, name):
    _run_probe(lab4, LAB4_PROBES[name])


@pytest.mark.parametrize("name", _params(5, LAB5_PROBES))
def test_lab05_validation_probes(lab5, name):
    _run_probe(lab5, LAB5_PROBES[name])


@fuzz_settings(0.25)
@given(data=st.data())
def test_lab04_plan_split_kv_is_the_same_for_numpy_integer_arguments(lab4, data):
    """plan_split_kv computes in Python ints whatever integer type its arguments come in: a
    uint32 or int8 context length must give the Python-int plan (or a typed refusal)."""
    kind = data.draw(st.sampled_from([np.uint32, np.uint8, np.int8, np.int16, np.int64]))
    # NOTE: every value must fit in ``kind`` (np.int8(128) is an OverflowError of NumPy's, not
    # of plan_split_kv); the products of them are what must not wrap.
    top = int(np.iinfo(kind).max)
    num_seqs = data.draw(st.integers(1, 8))
    num_kv_heads = data.draw(st.integers(1, 8))
    max_context_len = data.draw(st.integers(1, min(100, top)))
    num_sms = data.draw(st.integers(1, min(132, top)))
    want = lab4.plan_split_kv(num_seqs, num_kv_heads, max_context_len, num_sms)
    got = accepted(lambda: lab4.plan_split_kv(kind(num_seqs), kind(num_kv_heads),
                                              kind(max_context_len), kind(num_sms)),
                   what=f"plan_split_kv with {kind.__name__} arguments")
    assert got == want, f"plan_split_kv in {kind.__name__}: {got} != {want} (Python ints)"


def test_lab05_huge_cu_seqlens_is_refused_before_planning(lab5):
    """A cu_seqlens_q whose last entry is huge is refused by the cheap length checks, before a
    single tile is planned (no seconds of work, no hundreds of MiB)."""
    refused(lambda: lab5.plan_query_tiles(torch.tensor([0, 2**40]), torch.tensor([3])),
            names=("cu_seqlens_q", "context_lens"), what="plan_query_tiles(huge)")
