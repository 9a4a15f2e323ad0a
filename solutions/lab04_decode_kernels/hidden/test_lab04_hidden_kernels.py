"""Lab 4, hidden kernel tests (instructor-only; stripped from the student release, run at grading).

Drawn from the test-design rules of issue #11 with shapes and seeds the public tests do not use:
head and block sizes at the corners the kernels claim (64 with block 32, 256 with block 8), GQA
groups 3, 10 and 24 (CTAs of 3, 5 and 8 heads), contexts ending exactly on a block and on a
partition boundary, single-token contexts, many partitions, logits large enough to overflow
2^x without the max subtracted, the default scale, and PAD entries past each context. Every
cache is NaN past each context and in unused blocks; every output buffer starts as NaN.

Sizes are kept small so that every test also runs on the emulated device
(``PAGEDLAB_DEVICE=emulate``, the ``emulated`` marker) in seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from labs.lab04_decode_kernels._cases import GpuCase, assert_exact_zeros, assert_matches
from reference.gpu import kernel_skip_reason, synchronize

pytestmark = [pytest.mark.emulated, pytest.mark.skipif(kernel_skip_reason() is not None,
                                                       reason=f"GPU-REQ: {kernel_skip_reason()}")]

VERSIONS = ["v1", "v2", "v3", "v4", "v5", "v6"]
SPLIT_VERSIONS = ["v3", "v4", "v5", "v6"]


def run(impl, version, case: GpuCase, **kwargs):
    """Runs one kernel version on a case into a NaN-filled buffer and waits for it."""
    result = impl.KERNELS[version](*case.args(), case.scale, out=case.poisoned_out(), **kwargs)
    synchronize()
    return result


def check_lse(lse, case: GpuCase, what: str) -> None:
    """The log-sum-exp matches the oracle's (and is -inf exactly for empty sequences)."""
    lse = lse.detach().float().cpu().numpy()
    full = case.host_lens > 0
    assert np.isneginf(lse[~full]).all(), f"{what}: lse of an empty sequence must be -inf"
    np.testing.assert_allclose(lse[full], case.lse[full], rtol=1e-3, atol=1e-3, err_msg=(
        f"{what}: log-sum-exp differs from the oracle (the merge must put every partition on "
        "the common max before adding them, and add that max back)"))


@pytest.mark.points(2)
@pytest.mark.parametrize("version", VERSIONS)
def test_hidden_contexts_ending_on_block_boundaries_at_the_size_corners(impl, version):
    """Block size 8 with head size 64 and block size 32 with head size 64 (and 256 with block
    size 8 where the kernel has it): contexts of exactly 1, 2, 3 blocks and one token, with PAD
    entries after each context's last block, match the oracle."""
    corners = [(64, 8), (64, 32)] + ([(256, 8)] if version in ("v1", "v2", "v3", "v4") else [])
    for head_size, block_size in corners:
        lens = [block_size, 1, 3 * block_size, 2 * block_size]
        case = GpuCase(401 + head_size + block_size, lens, 4, 2, head_size, block_size)
        assert_matches(run(impl, version, case), case.ref, case.host_lens, case.dtype,
                       f"{version} head_size={head_size} block_size={block_size}, contexts that "
                       "end exactly on a block boundary (a last-block formula off by one?)")


@pytest.mark.points(2)
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("num_q_heads, num_kv_heads", [(6, 2), (20, 2), (24, 1)])
def test_hidden_gqa_groups_of_3_10_and_24(impl, version, num_q_heads, num_kv_heads):
    """Groups 3, 10 and 24 (CTAs of 3, 5 and 8 heads; 2 and 3 CTAs per KV head): query head h
    reads KV head h // group, whichever CTA serves it."""
    case = GpuCase(411 + num_q_heads, [23, 1, 40], num_q_heads, num_kv_heads, 64, 16)
    assert_matches(run(impl, version, case), case.ref, case.host_lens, case.dtype,
                   f"{version} with {num_q_heads} query heads over {num_kv_heads} KV heads "
                   "(the KV head is q_head // group, not the CTA's index)")


@pytest.mark.points(2)
@pytest.mark.parametrize("version", SPLIT_VERSIONS)
def test_hidden_partition_boundaries_and_many_partitions(impl, version):
    """A forced plan of five 64-token partitions that exactly covers max_context_len=320:
    contexts of exactly 1, 2 and 5 partitions, one token past a partition, one token, and an
    empty one merge to the oracle's output and log-sum-exp."""
    case = GpuCase(421, [64, 128, 320, 65, 1, 0], 4, 1, 64, 16)
    plan = impl.SplitKVPlan(5, 64)
    got, lse = run(impl, version, case, plan=plan, max_context_len=320, return_lse=True)
    assert_exact_zeros(got, [5], version)
    assert_matches(got, case.ref, case.host_lens, case.dtype,
                   f"{version} with {plan} (a partition count rounded down drops the last, "
                   "partial partition; rounded up past the context reads an unwritten one)")
    check_lse(lse, case, f"{version} with {plan}")


@pytest.mark.points(2)
@pytest.mark.parametrize("version", SPLIT_VERSIONS)
def test_hidden_split_merge_of_logits_that_overflow_exp2(impl, version):
    """Queries scaled by 60 make scores of several hundred (log2 domain): 2^score overflows
    float32, so only a merge that subtracts the common max first stays finite and exact. Split
    into 64-token partitions and unsplit, output and log-sum-exp match the oracle."""
    case = GpuCase(431, [200, 130, 77], 4, 2, 64, 16, q_scale=60.0)
    assert float(np.abs(case.lse).max()) > 100, "the case must have scores that overflow 2^x"
    for kwargs in ({"plan": impl.SplitKVPlan(4, 64), "max_context_len": 256}, {}):
        got, lse = run(impl, version, case, return_lse=True, **kwargs)
        what = f"{version} {'split' if kwargs else 'unsplit'}, scores in the hundreds"
        assert_matches(got, case.ref, case.host_lens, case.dtype,
                       f"{what} (inf/NaN: 2^m exponentiated without subtracting the max?)")
        check_lse(lse, case, what)


@pytest.mark.points(1)
@pytest.mark.parametrize("version", VERSIONS)
def test_hidden_default_scale_is_one_over_sqrt_head_size(impl, version):
    """With the scale omitted the kernels use 1 / sqrt(head_size): head size 64 gives 0.125,
    not the conventional 128's value."""
    case = GpuCase(441, [30, 9], 4, 4, 64, 16)
    assert math.isclose(case.scale, 1 / 8), "the case's oracle uses 1 / sqrt(64)"
    got = impl.KERNELS[version](*case.args(), out=case.poisoned_out())
    synchronize()
    assert_matches(got, case.ref, case.host_lens, case.dtype,
                   f"{version} without a scale argument (default must be 1/sqrt(head_size))")


@pytest.mark.points(1)
@pytest.mark.parametrize("version", VERSIONS)
def test_hidden_single_token_contexts_and_bfloat16(impl, version):
    """A batch of single-token contexts (the output is that token's value row) and a bf16
    batch with a context one short of a block both match the oracle."""
    case = GpuCase(451, [1, 1, 1, 1, 1], 8, 2, 128, 16)
    assert_matches(run(impl, version, case), case.ref, case.host_lens, case.dtype,
                   f"{version}, five one-token contexts")
    case = GpuCase(452, [15, 31, 2], 8, 1, 128, 16, dtype="bfloat16")
    assert_matches(run(impl, version, case), case.ref, case.host_lens, case.dtype,
                   f"{version}, bf16, contexts one short of a block")
