"""Infrastructure (no points): Lab 4's naive baseline kernel is correct, so the benchmark's
baseline row measures a kernel that computes the right thing. Skipped without a GPU."""

from __future__ import annotations

import pytest

from reference.gpu import gpu_skip_reason
from reference.loader import load_impl

pytestmark = pytest.mark.skipif(gpu_skip_reason() is not None,
                                reason=f"GPU-REQ: {gpu_skip_reason()}")


@pytest.mark.parametrize("num_q_heads, num_kv_heads, head_size, block_size",
                         [(8, 2, 128, 16), (4, 4, 64, 8), (8, 1, 256, 32)])
def test_naive_baseline_matches_the_oracle(num_q_heads, num_kv_heads, head_size, block_size):
    """The seed-004 style baseline, on ragged lengths with an empty sequence, matches the oracle."""
    import torch

    from labs.lab04_decode_kernels._cases import GpuCase, assert_exact_zeros, assert_matches

    impl = load_impl("lab04_decode_kernels", "solution")
    case = GpuCase(301, [1, 0, 17, 90], num_q_heads, num_kv_heads, head_size, block_size)
    got = impl.paged_attention_naive(*case.args(), case.scale, out=case.poisoned_out())
    torch.cuda.synchronize()
    assert_exact_zeros(got, [1], "naive")
    assert_matches(got, case.ref, case.host_lens, case.dtype, "naive baseline")
