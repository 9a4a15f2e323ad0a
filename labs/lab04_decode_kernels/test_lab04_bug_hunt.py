"""Lab 4, Task 4.0 (GPU): the seed's decode kernel, debugged — v0 matches the float64 oracle.

The starter's ``decode_v0.cu`` is a short decode kernel with the seed's classic bugs. Each case
here is built so that one of them cannot hide: more query heads than KV heads, a block table
wider than the number of heads, contexts longer than the CTA's thread count, empty sequences.
"""

from __future__ import annotations

import pytest

from labs.lab04_decode_kernels._cases import GpuCase, assert_exact_zeros, assert_matches
from reference.gpu import kernel_skip_reason, synchronize

pytestmark = [pytest.mark.emulated, pytest.mark.skipif(kernel_skip_reason() is not None,
                                                       reason=f"GPU-REQ: {kernel_skip_reason()}")]


def run_v0(impl, case):
    import torch

    got = impl.paged_attention_v0(*case.args(), case.scale, out=case.poisoned_out())
    synchronize()
    return got


@pytest.mark.points(3)
@pytest.mark.parametrize("num_q_heads, num_kv_heads, lens", [
    (4, 4, [200, 5, 129]),      # MHA; table width 15, not the 4 heads of the grid
    (8, 2, [40, 77, 1]),        # GQA 4: the KV head comes from the query head and the group
    (16, 1, [300, 16, 17]),     # MQA; contexts longer than the CTA's 128 threads
])
def test_v0_matches_oracle(impl, num_q_heads, num_kv_heads, lens):
    """v0 reads the right KV head and the right block-table row, keeps its shared arrays apart,
    and sums the softmax denominator without losing updates: it matches the oracle."""
    case = GpuCase(201 + num_q_heads, lens, num_q_heads, num_kv_heads, 128, 16)
    assert_matches(run_v0(impl, case), case.ref, case.host_lens, case.dtype,
                   f"v0 with {num_q_heads} query heads over {num_kv_heads} KV heads")


@pytest.mark.points(1)
@pytest.mark.parametrize("head_size", [64, 256])
def test_v0_every_head_size(impl, head_size):
    """v0 at head sizes 64 and 256: with 128 threads, a thread stages and computes every
    element it strides over (at 256, two each), not just one."""
    case = GpuCase(221 + head_size, [50, 7, 130], 4, 2, head_size, 16)
    assert_matches(run_v0(impl, case), case.ref, case.host_lens, case.dtype,
                   f"v0 at head_size={head_size} — likely cause: one element per thread where "
                   "the loop must stride by the thread count")


@pytest.mark.points(1)
def test_v0_writes_exact_zeros_for_empty_sequences(impl):
    """A sequence with context_len 0 still gets its output written: exactly 0, not left as
    whatever the buffer held (the buffer here holds NaN)."""
    case = GpuCase(211, [0, 33, 0], 8, 2, 128, 16)
    got = run_v0(impl, case)
    assert_exact_zeros(got, [0, 2], "v0")
    assert_matches(got, case.ref, case.host_lens, case.dtype, "v0")
