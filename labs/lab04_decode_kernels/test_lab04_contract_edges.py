"""Lab 4, the contract's edges: the checks run in the TODO's order and read what they say, the
split launcher hands its options through (max_context_len, tuning, the kernel's plan limits),
``plan_split_kv`` converts and checks every argument, and the launchers handle an empty batch
and arrays of the caller's kind.

The tests before the last three use CPU tensors and need no GPU. The last three run kernels
(on a GPU, or emulated with ``PAGEDLAB_DEVICE=emulate``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from labs.lab04_decode_kernels.test_lab04_validation import call, cpu_batch
from reference.errors import DeviceMismatchError
from reference.expect import raises_naming
from reference.grader.proxy import given
from reference.gpu import kernel_skip_reason, synchronize

SPLIT_VERSIONS = ["v3", "v4", "v5", "v6"]


def _error(impl, batch, version=None, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        call(impl, batch, version, **kwargs)
    return str(info.value)


@pytest.mark.points(1)
def test_values_are_checked_on_cpu_tensors_even_with_debug_false(impl):
    """On CPU tensors the value checks always run (reading them costs no synchronisation):
    debug=False does not turn them off, so a context longer than its row is still refused."""
    batch = cpu_batch()
    batch["context_lens"][1] = 65
    msg = _error(impl, batch, debug=False)
    assert "context_lens[1]=65" in msg, f"{msg!r}: debug=False must not skip the CPU value checks"


@pytest.mark.points(1)
@pytest.mark.parametrize("scale", [1e39, 1e-50])
def test_scale_is_checked_as_the_float32_the_kernels_take(impl, scale):
    """The scale is checked as float32 (check_scale(..., dtype=np.float32)): 1e39 would reach
    the kernel as inf and 1e-50 as 0, so both raise ValueError naming scale."""
    raises_naming(lambda: call(impl, cpu_batch(), scale=scale), ValueError, "scale",
                  f"scale={scale}")


@pytest.mark.points(1)
def test_context_errors_report_negatives_first_then_the_first_too_long(impl):
    """A negative length is reported before a length that is too long (the first negative
    sequence), and among lengths too long the first one, not the longest."""
    batch = cpu_batch()  # rows of 64 tokens
    batch["context_lens"][0], batch["context_lens"][1] = 70, -1
    msg = _error(impl, batch)
    assert "context_lens[1]=-1" in msg and "negative" in msg, (
        f"{msg!r}: lengths (70, -1, 23) must report the negative one first")
    batch = cpu_batch()
    batch["context_lens"][0], batch["context_lens"][1] = 65, 100
    msg = _error(impl, batch)
    assert "context_lens[0]=65" in msg, (
        f"{msg!r}: lengths (65, 100, 23) in 64-token rows: the first too long is sequence 0 "
        "(np.argmax of lens > limit, not of lens)")


@pytest.mark.points(1)
def test_max_context_len_zero_is_a_limit(impl):
    """max_context_len=0 is a limit like any other (not 'no limit'): a context of 5 tokens is
    longer than it allows."""
    msg = _error(impl, cpu_batch(), max_context_len=0)
    assert "context_lens[0]=5" in msg and "max_context_len allows" in msg, (
        f"{msg!r}: test `max_context_len is None`, not its truth value")


@pytest.mark.points(1)
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_max_context_len_may_be_a_numpy_or_torch_integer(impl, kind):
    """check_int accepts NumPy and torch integer scalars and returns the Python int: use what it
    returns, so max_context_len=np.int64(20) or torch.tensor(20) limits like 20."""
    value = np.int64(20) if kind == "numpy" else torch.tensor(20)
    msg = _error(impl, cpu_batch(), max_context_len=value)
    assert "context_lens[2]=23" in msg and "max_context_len allows" in msg, (
        f"{msg!r}: rebind max_context_len = check_int(...)")


@pytest.mark.points(1)
def test_structure_is_checked_before_values(impl):
    """Structure before values: with a bad context too, a misaligned query is reported as
    misaligned and a negative scale as a bad scale."""
    batch = cpu_batch()
    batch["context_lens"][1] = 65
    q = batch["query"]
    flat = torch.zeros(q.numel() + 1, dtype=q.dtype)
    raises_naming(lambda: call(impl, {**batch, "query": flat[1:].view(q.shape)}), ValueError,
                  "16-byte", "a misaligned query and a context too long")
    raises_naming(lambda: call(impl, batch, scale=-1.0), ValueError, "scale",
                  "scale=-1 and a context too long")


@pytest.mark.points(1)
def test_out_shape_is_compared_in_full(impl):
    """out is [num_seqs, num_q_heads, head_size] like query, not merely as many elements: an
    out of shape [8, 3, 128] for a [3, 8, 128] query raises ValueError naming out."""
    raises_naming(lambda: call(impl, cpu_batch(), out=torch.zeros(8, 3, 128, dtype=torch.float16)),
                  ValueError, "out", "out [8, 3, 128] for query [3, 8, 128]")


@pytest.mark.points(1)
@pytest.mark.parametrize("version", ["v4", "v6"])
@pytest.mark.parametrize("tuning", [{"NOPE": 1}, {"NUM_WARPS": 0}])
def test_tuning_is_checked_before_the_device(impl, version, tuning):
    """The split launcher checks tuning= (kernel.defines_for) before the device: an unknown
    option or a value below 1 raises ValueError naming it on CPU tensors too."""
    raises_naming(lambda: call(impl, cpu_batch(), version, tuning=tuning), ValueError, "tuning",
                  f"{version} with tuning={tuning}",
                  crashed_hint=" (defines_for after check_on_cuda?)")


@pytest.mark.points(1)
@pytest.mark.parametrize("version", SPLIT_VERSIONS)
def test_split_launchers_pass_max_context_len_to_the_checks(impl, version):
    """v3..v6 hand max_context_len to check_decode_args: a context of 23 tokens with
    max_context_len=20 is refused before the device check."""
    msg = _error(impl, cpu_batch(), version, max_context_len=20)
    assert "context_lens[2]=23" in msg, f"{version}: {msg!r}"


@pytest.mark.points(1)
def test_split_plan_converts_its_keyword_arguments_too(impl):
    """target_ctas_per_sm and max_partition_size as NumPy integers give the plan Python ints
    give (each rebound to what check_int returns: no wrapping uint8 / uint16 arithmetic)."""
    want = impl.plan_split_kv(1, 1, 100_000, 132, target_ctas_per_sm=4)
    got = impl.plan_split_kv(1, 1, 100_000, 132, target_ctas_per_sm=np.uint8(4))
    assert got == want, f"target_ctas_per_sm=np.uint8(4): {got}, with 4: {want}"
    want = impl.plan_split_kv(1, 1, 300_000, 1, target_ctas_per_sm=1, max_partition_size=4096)
    try:
        got = impl.plan_split_kv(1, 1, 300_000, 1, target_ctas_per_sm=1,
                                 max_partition_size=np.uint16(4096))
    except (OverflowError, ValueError) as exc:
        pytest.fail(f"max_partition_size=np.uint16(4096) raised {exc!r}: rebind it to check_int's int")
    assert got == want, f"max_partition_size=np.uint16(4096): {got}, with 4096: {want}"


@pytest.mark.points(1)
@pytest.mark.parametrize("kwargs, error, name", [
    (dict(block_size=16.0), TypeError, "block_size"),
    (dict(max_context_len=0, block_size=12), ValueError, "block_size"),
    (dict(max_context_len=0, num_sms=0), ValueError, "num_sms"),
    (dict(max_context_len=0, target_ctas_per_sm=0), ValueError, "target_ctas_per_sm"),
])
def test_split_plan_checks_every_argument_first(impl, kwargs, error, name):
    """plan_split_kv checks every argument before it plans, an empty context included:
    block_size=16.0 is a TypeError, and a bad block size, SM count or target is refused even
    when max_context_len is 0."""
    args = dict(num_seqs=2, num_kv_heads=2, max_context_len=1000, num_sms=132)
    args.update(kwargs)
    raises_naming(lambda: impl.plan_split_kv(**args), error, name, f"plan_split_kv({kwargs})")


@pytest.mark.points(1)
def test_an_empty_context_plans_one_partition_of_partition_align(impl):
    """max_context_len=0 gives one partition of PARTITION_ALIGN (256) tokens."""
    got = impl.plan_split_kv(4, 8, 0, 132)
    assert (got.num_partitions, got.partition_size) == (1, 256), f"{got}"


@pytest.mark.points(1)
def test_paged_attention_refuses_a_list_query_by_name(impl):
    """paged_attention's dispatch reads shapes only and lets the launcher validate: a list
    query raises TypeError naming query, not an AttributeError from the dispatch."""
    batch = cpu_batch()
    batch["query"] = batch["query"].tolist()
    raises_naming(lambda: impl.paged_attention(**batch), TypeError, "query", "a list query",
                  crashed_hint=" (_prefers_v6 read query.shape or .dim() of a list?)")


# ----------------------------------------------------------------------------- with kernels
needs_device = pytest.mark.skipif(kernel_skip_reason() is not None,
                                  reason=kernel_skip_reason() or "")


@needs_device
@pytest.mark.emulated
@pytest.mark.points(1)
@pytest.mark.parametrize("version", ["v1", "v2", *SPLIT_VERSIONS])
def test_an_empty_batch_launches_nothing(impl, version):
    """A batch of no sequences is valid: the launcher launches nothing (a grid of 0 CTAs is an
    error on a GPU) and returns an empty output and, v3..v6 with return_lse, an empty float32
    lse."""
    from labs.lab04_decode_kernels._cases import GpuCase

    case = GpuCase(17, [9], 8, 2, 128, 16)
    q, k, v, bt, cl = case.args()
    if version in SPLIT_VERSIONS:
        out, lse = impl.KERNELS[version](q[:0], k, v, bt[:0], cl[:0], case.scale,
                                        return_lse=True)
        assert tuple(lse.shape) == (0, 8) and lse.dtype == torch.float32, (
            f"{version}: lse {tuple(lse.shape)} {lse.dtype}, expected (0, 8) float32")
    else:
        out = impl.KERNELS[version](q[:0], k, v, bt[:0], cl[:0], case.scale)
    synchronize()
    assert tuple(out.shape) == (0, 8, 128), f"{version}: out {tuple(out.shape)}"


@needs_device
@pytest.mark.emulated
@pytest.mark.points(1)
@pytest.mark.parametrize("version", ["v1", "v4", "v6"])
def test_an_array_out_is_filled_and_lse_comes_back_as_an_array(impl, version):
    """With CuPy arrays (emulated: NumPy), an array out= is filled (through as_tensor, like
    every input), and v3..v6's return_lse gives lse back as an array of the same kind
    (finish(lse, query))."""
    from labs.lab04_decode_kernels._cases import GpuCase, assert_matches, fill_array_out

    case = GpuCase(93, [17, 64], 8, 2, 128, 16)
    out, lse_is_array = given(impl, fill_array_out)(version, list(case.args()), case.scale,
                                                    version in SPLIT_VERSIONS)
    if version in SPLIT_VERSIONS:
        assert lse_is_array, f"{version}: CuPy (emulated: NumPy) inputs gave lse as a torch tensor"
    assert_matches(out, case.ref, case.host_lens, case.dtype, f"{version} into an array out=")


@needs_device
@pytest.mark.emulated
@pytest.mark.points(1)
@pytest.mark.parametrize("version", ["v4", "v6"])
def test_split_launcher_plans_and_launches_with_the_kernels_limits(impl, version):
    """The split launcher plans with the kernel's target_ctas_per_sm and max_partition_size for
    max_context_len (default: the table), and launches with its options: NUM_WARPS sets the
    threads, MAX_HEADS_PER_CTA caps the heads per CTA, the cap reaches the kernel as
    -DMAX_PARTITION_SIZE."""
    from labs.lab04_decode_kernels._cases import GpuCase, record_launches_of
    from labs.lab04_decode_kernels._launch import V4_KERNEL, V6_KERNEL
    from reference import cuda as rcuda

    kernel = {"v4": V4_KERNEL, "v6": V6_KERNEL}[version]
    # NOTE: 100,000 tokens on one row: long enough that a target of 1 or 4 CTAs per SM and a
    # cap of 1,024 or 4,096 tokens give different plans on 8 SMs (emulated) and on 132 (an
    # H200). The launches are only recorded: nothing runs.
    case = GpuCase(19, [100000], 16, 1, 128, 16)
    q, k, v, bt, cl = case.args()
    table_tokens = bt.shape[1] * 16
    for max_len in (None, 100000):
        want = impl.plan_split_kv(1, 1, table_tokens if max_len is None else max_len,
                                  rcuda.num_sms(q.device), block_size=16,
                                  target_ctas_per_sm=kernel.target_ctas_per_sm,
                                  max_partition_size=kernel.max_partition_size)
        launches = given(impl, record_launches_of)(
            version, [q, k, v, bt, cl], case.scale, max_context_len=max_len,
            tuning={"NUM_WARPS": 2, "MAX_HEADS_PER_CTA": 4})
        grid, block, options = launches[0]
        assert tuple(grid) == (1, 16 // 4, want.num_partitions), (
            f"{version}, max_context_len={max_len}: grid {grid}, expected (1, 4, "
            f"{want.num_partitions}) from plan_split_kv with the kernel's target and cap "
            "(and MAX_HEADS_PER_CTA=4 capping heads_per_cta)")
        assert tuple(block) == (64,), f"{version}: NUM_WARPS=2 gives 64 threads, got {block}"
        assert f"-DMAX_PARTITION_SIZE={kernel.max_partition_size}" in options, (
            f"{version}: options {options} lack -DMAX_PARTITION_SIZE={kernel.max_partition_size}")


@needs_device
@pytest.mark.emulated
@pytest.mark.points(1)
def test_paged_attention_passes_scale_and_out_on(impl):
    """``paged_attention`` hands the kernel it picks the ``scale`` it was given (not the default
    1/sqrt(head_size)) and fills the ``out`` it was given."""
    from labs.lab04_decode_kernels._cases import GpuCase, assert_matches
    from reference.oracle import paged_decode_ref

    case = GpuCase(143, [23, 10], 8, 2, 128, 16)
    q, k, v, bt, cl = case.args()
    half = case.scale / 2
    ref, _ = paged_decode_ref(q.float().cpu().numpy(), k.float().cpu().numpy(),
                              v.float().cpu().numpy(), case.host_tables, case.host_lens, half)
    out = case.poisoned_out()
    impl.paged_attention(q, k, v, bt, cl, half, out=out)
    synchronize()
    assert_matches(out, ref, case.host_lens, case.dtype,
                   "paged_attention(scale=default / 2, out=buffer), read from the buffer")


@needs_device
@pytest.mark.emulated
@pytest.mark.points(1)
@pytest.mark.parametrize("version", ["v1", "v4"])
def test_an_out_on_another_device_is_refused(impl, version):
    """An ``out`` on another device than the inputs is a ``DeviceMismatchError`` naming ``out``
    (check_decode_args: every tensor on one CUDA device), before any kernel writes through it."""
    from labs.lab04_decode_kernels._cases import GpuCase

    case = GpuCase(144, [9, 30], 8, 2, 128, 16)
    other = "meta" if case.query.device.type == "cpu" else "cpu"
    out = torch.empty(case.query.shape, dtype=case.query.dtype, device=other)
    raises_naming(lambda: impl.KERNELS[version](*case.args(), case.scale, out=out),
                  DeviceMismatchError, "out", f"{version} with out on {other}",
                  crashed_hint=" — likely cause: out left out of the device check")


@needs_device
@pytest.mark.emulated
@pytest.mark.points(1)
def test_a_decode_plan_covers_the_tables_reach_and_keeps_a_forced_plan(impl):
    """Without ``max_context_len`` a plan covers what the block table can address, not the
    example lengths it was made with (its runs may have longer contexts); a forced ``plan`` is
    the one used (its number of partitions is the grid's)."""
    from labs.lab04_decode_kernels._cases import GpuCase

    case = GpuCase(6, [4000], 8, 2, 128, 16)  # a table of 250 blocks: 4000 tokens
    q, k, v, bt, cl = case.args()
    short = torch.full_like(cl, 300)
    default = impl.plan_decode(q, k, v, bt, short, version="v4")
    explicit = impl.plan_decode(q, k, v, bt, short, version="v4", max_context_len=4000)
    assert default.num_partitions == explicit.num_partitions, (
        f"plan_decode on example lengths of 300 (table: 4000 tokens) chose {default.num_partitions} "
        f"partitions, with max_context_len=4000 {explicit.num_partitions}: without "
        "max_context_len, size the plan from what the block table can address, never from "
        "context_lens (a later run with 4000 tokens would skip partitions)")
    case = GpuCase(5, [1000], 8, 2, 128, 16)
    forced = impl.plan_decode(*case.args(), version="v4", plan=impl.SplitKVPlan(6, 256))
    assert forced.num_partitions == 6, (
        f"with plan=SplitKVPlan(6, 256) the launcher used {forced.num_partitions} partitions: "
        "a forced plan replaces plan_split_kv's")


@needs_device
@pytest.mark.emulated
@pytest.mark.points(1)
def test_v6_sizes_its_shared_memory_for_its_tuning(impl):
    """v6 with ``tuning={"NUM_STAGES": 4}`` sizes its dynamic shared memory for 4 stages (the
    ring the kernel is compiled for), not the default, and still matches the oracle."""
    from labs.lab04_decode_kernels._cases import GpuCase, assert_matches

    case = GpuCase(10, [300, 77], 8, 2, 128, 16)
    out = impl.paged_attention_v6(*case.args(), case.scale, tuning={"NUM_STAGES": 4})
    synchronize()
    assert_matches(out, case.ref, case.host_lens, case.dtype,
                   "paged_attention_v6(tuning={'NUM_STAGES': 4}) — likely cause: shared memory "
                   "sized from the default defines, not this call's")
