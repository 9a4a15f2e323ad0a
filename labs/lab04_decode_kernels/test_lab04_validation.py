"""Lab 4, CPU part: every launcher checks its input before anything runs, and the split-K plan.

These tests need no GPU: the inputs are CPU tensors, so every check *before* the device check
must fire on them, and a valid CPU batch must get as far as the device check and fail there.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference.errors import DeviceMismatchError, UnsupportedConfigError
from reference.layout import PAD_BLOCK_ID

VERSIONS = ["naive", "v0", "v1", "v2", "v3", "v4", "v5", "v6"]


def cpu_batch(num_seqs=3, num_q_heads=8, num_kv_heads=2, head_size=128, block_size=16,
              num_blocks=12, width=4, dtype=torch.float16):
    """A valid decode batch on the CPU (block ids 0.., lengths that fit the table)."""
    query = torch.zeros(num_seqs, num_q_heads, head_size, dtype=dtype)
    key_cache = torch.zeros(num_blocks, num_kv_heads, block_size, head_size, dtype=dtype)
    value_cache = torch.zeros_like(key_cache)
    block_tables = torch.full((num_seqs, width), PAD_BLOCK_ID, dtype=torch.int32)
    context_lens = torch.zeros(num_seqs, dtype=torch.int32)
    for s in range(num_seqs):
        context_lens[s] = 5 + 9 * s
        n = -(-int(context_lens[s]) // block_size)
        block_tables[s, :n] = torch.arange(s * width, s * width + n, dtype=torch.int32) % num_blocks
    return dict(query=query, key_cache=key_cache, value_cache=value_cache,
                block_tables=block_tables, context_lens=context_lens)


def call(impl, batch, version=None, **kwargs):
    if version is None:
        return impl.check_decode_args(**batch, **kwargs)
    return impl.KERNELS[version](**batch, **kwargs)


@pytest.mark.points(2)
@pytest.mark.parametrize("version", [None, *VERSIONS])
def test_valid_cpu_batch_fails_only_at_the_device_check(impl, version):
    """A valid batch of CPU tensors passes every check but the last: it needs CUDA tensors."""
    with pytest.raises(DeviceMismatchError, match="CUDA"):
        call(impl, cpu_batch(), version)


@pytest.mark.points(2)
@pytest.mark.parametrize("arg, value, name", [
    ("query", torch.zeros(3, 8, 128, dtype=torch.float32), "query"),
    ("query", torch.zeros(3, 8, 128, dtype=torch.int32), "query"),
    ("key_cache", torch.zeros(12, 2, 16, 128, dtype=torch.bfloat16), "key_cache"),
    ("value_cache", torch.zeros(12, 2, 16, 128, dtype=torch.float32), "value_cache"),
    ("block_tables", torch.zeros(3, 4, dtype=torch.int64), "block_tables"),
    ("context_lens", torch.zeros(3, dtype=torch.int64), "context_lens"),
])
def test_wrong_dtype_raises_type_error_naming_the_argument(impl, arg, value, name):
    """A wrong dtype (or a cache whose dtype differs from the query's) is a TypeError naming it."""
    batch = cpu_batch()
    batch[arg] = value
    with pytest.raises(TypeError, match=name):
        call(impl, batch)


@pytest.mark.points(2)
@pytest.mark.parametrize("arg, value, name", [
    ("query", torch.zeros(3, 8 * 128, dtype=torch.float16), "query"),
    ("key_cache", torch.zeros(12, 2, 16 * 128, dtype=torch.float16), "key_cache"),
    ("value_cache", torch.zeros(12, 2, 8, 128, dtype=torch.float16), "value_cache"),
    ("query", torch.zeros(3, 8, 64, dtype=torch.float16), "head_size"),
    ("query", torch.zeros(3, 7, 128, dtype=torch.float16), "num_kv_heads"),
    ("block_tables", torch.zeros(2, 4, dtype=torch.int32), "block_tables"),
    ("context_lens", torch.zeros(4, dtype=torch.int32), "context_lens"),
    ("out", torch.zeros(3, 8, 64, dtype=torch.float16), "out"),
])
def test_wrong_shape_raises_value_error_naming_the_argument(impl, arg, value, name):
    """Ranks and shapes must agree (caches equal, head sizes equal, Hq a multiple of Hkv, one
    table row and one length per sequence, out like query); the ValueError names the culprit."""
    batch = cpu_batch()
    batch[arg] = value
    with pytest.raises(ValueError, match=name):
        call(impl, batch)


@pytest.mark.points(1)
@pytest.mark.parametrize("kwargs, name", [(dict(head_size=96), "head_size"),
                                          (dict(head_size=32), "head_size"),
                                          (dict(block_size=12), "block_size"),
                                          (dict(block_size=64), "block_size")])
def test_unsupported_head_or_block_size_raises(impl, kwargs, name):
    """Head sizes other than 64/128/256 and block sizes other than 8/16/32 are refused before
    any kernel is compiled (UnsupportedConfigError, a ValueError)."""
    with pytest.raises(UnsupportedConfigError, match=name) as info:
        call(impl, cpu_batch(**kwargs))
    assert isinstance(info.value, ValueError)


@pytest.mark.points(1)
@pytest.mark.parametrize("arg", ["query", "key_cache", "block_tables", "context_lens"])
def test_non_contiguous_input_raises(impl, arg):
    """A strided view (transposed, sliced) is refused: the kernels compute addresses from the
    shape alone, so they would read the wrong elements."""
    batch = cpu_batch()
    x = batch[arg]
    if arg == "query":
        x = torch.zeros(8, 3, 128, dtype=x.dtype).transpose(0, 1)
    elif arg == "key_cache":
        x = torch.zeros(12, 2, 16, 256, dtype=x.dtype)[..., :128]
    elif arg == "block_tables":
        x = torch.zeros(3, 8, dtype=torch.int32)[:, ::2]
    else:
        x = torch.zeros(6, dtype=torch.int32)[::2]
    batch[arg] = x
    assert not x.is_contiguous()
    with pytest.raises(ValueError, match=f"{arg}.*contiguous"):
        call(impl, batch)


@pytest.mark.points(1)
@pytest.mark.parametrize("arg", ["query", "key_cache", "value_cache"])
def test_misaligned_tensor_raises(impl, arg):
    """A contiguous view that starts 2 bytes into its storage cannot be read with 16-byte loads:
    ValueError naming the tensor, before any kernel runs."""
    batch = cpu_batch()
    x = batch[arg]
    storage = torch.zeros(x.numel() + 1, dtype=x.dtype)
    batch[arg] = storage[1:].view(x.shape)
    assert batch[arg].is_contiguous()
    with pytest.raises(ValueError, match=f"{arg}.*16-byte"):
        call(impl, batch)


@pytest.mark.points(1)
@pytest.mark.parametrize("arg", ["query", "key_cache", "block_tables"])
def test_not_a_tensor_raises_type_error(impl, arg):
    """NumPy arrays and lists are not device memory: TypeError naming the argument."""
    batch = cpu_batch()
    batch[arg] = batch[arg].float().numpy()
    with pytest.raises(TypeError, match=arg):
        call(impl, batch)


@pytest.mark.points(1)
@pytest.mark.parametrize("scale, error", [(0.0, ValueError), (-0.1, ValueError),
                                          (float("nan"), ValueError), (float("inf"), ValueError),
                                          ("0.1", TypeError), (True, TypeError)])
def test_bad_scale_raises(impl, scale, error):
    """The softmax scale must be a finite float > 0 (None means 1/sqrt(head_size))."""
    with pytest.raises(error, match="scale"):
        call(impl, cpu_batch(), scale=scale)


@pytest.mark.points(2)
@pytest.mark.parametrize("bad_id", [12, 1000, -1])
def test_block_id_out_of_range_raises_index_error(impl, bad_id):
    """A block id outside [0, num_blocks) in a slot the context needs is an IndexError naming
    block_tables[seq, slot] (checked on CPU tensors always, on GPU tensors with debug)."""
    batch = cpu_batch()
    batch["block_tables"][2, 1] = bad_id  # sequence 2 has 23 tokens: it needs slots 0 and 1
    with pytest.raises(IndexError, match=r"block_tables\[2, 1\]"):
        call(impl, batch)
    # Padding beyond the blocks a sequence uses is never read, so it may hold anything.
    batch = cpu_batch()
    batch["block_tables"][0, 3] = bad_id
    with pytest.raises(DeviceMismatchError):
        call(impl, batch)


@pytest.mark.points(1)
@pytest.mark.parametrize("length", [65, 1000, -3])
def test_context_the_table_cannot_hold_raises(impl, length):
    """context_lens[s] must be in [0, max_blocks_per_seq * block_size]: a longer context would
    send the kernel past the end of the block-table row."""
    batch = cpu_batch()
    batch["context_lens"][1] = length
    with pytest.raises(ValueError, match=r"context_lens\[1\]"):
        call(impl, batch)


@pytest.mark.points(1)
def test_v0_refuses_tables_longer_than_its_shared_memory(impl):
    """v0 keeps a score per token of the table in shared memory: beyond 32768 tokens it says
    so (ValueError naming block_tables) instead of failing at launch."""
    batch = cpu_batch(width=2049)
    with pytest.raises(ValueError, match="block_tables"):
        call(impl, batch, "v0")


@pytest.mark.points(1)
@pytest.mark.parametrize("num_q_heads, num_kv_heads, head_size, expected", [
    (8, 8, 128, "v6"), (8, 2, 128, "v6"), (16, 2, 128, "v6"), (64, 8, 64, "v6"),
    (16, 2, 256, "v4"), (8, 8, 256, "v4")])
def test_paged_attention_dispatch(impl, monkeypatch, num_q_heads, num_kv_heads, head_size,
                                  expected):
    """paged_attention hands head sizes 64 and 128 to v6 (MHA and every GQA group) and head
    size 256, which v6 has no code for, to v4."""
    called = []
    for version in ("v4", "v5", "v6"):
        monkeypatch.setattr(impl, f"paged_attention_{version}",
                            lambda *a, _v=version, **k: called.append(_v))
    impl.paged_attention(**cpu_batch(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                                     head_size=head_size))
    assert called == [expected]


@pytest.mark.points(1)
def test_v5_refuses_head_size_256_and_paged_attention_falls_back(impl):
    """v5's and v6's tensor-core tiles exist for head sizes 64 and 128: 256 is an
    UnsupportedConfigError before the device check, and paged_attention then uses v4 (reaching
    the device check)."""
    batch = cpu_batch(head_size=256)
    for version in ("v5", "v6"):
        with pytest.raises(UnsupportedConfigError, match="head_size"):
            call(impl, batch, version)
    with pytest.raises(DeviceMismatchError):
        impl.paged_attention(**batch)
    with pytest.raises(DeviceMismatchError):
        impl.paged_attention(**cpu_batch())


# ----------------------------------------------------------------------------- split-K plan


@pytest.mark.points(1)
@pytest.mark.parametrize("num_seqs, num_kv_heads, max_len", [(256, 8, 512), (128, 8, 1000),
                                                             (1024, 1, 900)])
def test_split_plan_keeps_one_partition_when_the_grid_is_full(impl, num_seqs, num_kv_heads,
                                                             max_len):
    """Many sequences already give every SM several CTAs: no split, no reduce kernel."""
    plan = impl.plan_split_kv(num_seqs, num_kv_heads, max_len, 132, block_size=16)
    assert plan.num_partitions == 1, plan
    assert plan.partition_size >= max_len


@pytest.mark.points(2)
@pytest.mark.parametrize("num_seqs, num_kv_heads, max_len, num_sms", [
    (4, 8, 32768, 132), (1, 8, 4096, 132), (8, 8, 4096, 132), (2, 1, 100000, 108),
    (16, 4, 2048, 78)])
def test_split_plan_splits_few_long_sequences_to_fill_the_gpu(impl, num_seqs, num_kv_heads,
                                                               max_len, num_sms):
    """Few long sequences: the plan cuts each context so the grid reaches TARGET_CTAS_PER_SM
    CTAs per SM (or partitions of the minimum size), in whole aligned partitions."""
    plan = impl.plan_split_kv(num_seqs, num_kv_heads, max_len, num_sms, block_size=16)
    ctas = num_seqs * num_kv_heads * plan.num_partitions
    assert plan.num_partitions > 1, f"{plan}: {num_seqs * num_kv_heads} CTAs cannot fill {num_sms} SMs"
    assert (ctas >= impl.TARGET_CTAS_PER_SM * num_sms
            or plan.partition_size == impl.PARTITION_ALIGN), (
        f"{plan} gives {ctas} CTAs for {num_sms} SMs: the GPU is not filled")
    assert plan.partition_size <= impl.MAX_PARTITION_SIZE
    assert plan.partition_size % impl.PARTITION_ALIGN == 0


@pytest.mark.points(2)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # impl is a module: stateless
@given(num_seqs=st.integers(0, 600), num_kv_heads=st.integers(1, 16),
       max_len=st.integers(0, 300_000), num_sms=st.integers(1, 200),
       block_size=st.sampled_from([8, 16, 32]))
def test_split_plan_partitions_cover_every_token_exactly_once(impl, num_seqs, num_kv_heads,
                                                              max_len, num_sms, block_size):
    """For any batch: partitions are whole blocks, at most MAX_PARTITION_SIZE, and together cover
    the longest context with no partition left empty for it."""
    plan = impl.plan_split_kv(num_seqs, num_kv_heads, max_len, num_sms, block_size=block_size)
    assert plan.num_partitions >= 1
    assert plan.partition_size % block_size == 0
    assert 0 < plan.partition_size <= impl.MAX_PARTITION_SIZE
    assert plan.num_partitions * plan.partition_size >= max_len
    assert max_len == 0 or (plan.num_partitions - 1) * plan.partition_size < max_len


@pytest.mark.points(1)
@pytest.mark.parametrize("args, error, name", [
    ((-1, 8, 100, 132), ValueError, "num_seqs"), ((4, 0, 100, 132), ValueError, "num_kv_heads"),
    ((4, 8, -5, 132), ValueError, "max_context_len"), ((4, 8, 100, 0), ValueError, "num_sms"),
    ((4.0, 8, 100, 132), TypeError, "num_seqs"), ((4, 8, True, 132), TypeError, "max_context_len")])
def test_split_plan_rejects_bad_arguments(impl, args, error, name):
    """The plan's inputs are checked like any API's: typed errors naming the argument."""
    with pytest.raises(error, match=name):
        impl.plan_split_kv(*args, block_size=16)
    with pytest.raises(ValueError, match="block_size"):
        impl.plan_split_kv(4, 8, 100, 132, block_size=12)


@pytest.mark.points(1)
@pytest.mark.parametrize("num_seqs, num_kv_heads, max_len, expected", [
    (8, 8, 4096, (3, 1536)), (64, 8, 4096, (1, 4096)), (4, 8, 32768, (8, 4096)),
    (128, 8, 8192, (2, 4096))])
def test_split_plan_takes_the_kernels_target_and_cap(impl, num_seqs, num_kv_heads, max_len,
                                                     expected):
    """v6 asks for one CTA per SM and partitions up to 4096 tokens: the plan honours both
    keywords (and still refuses a cap that is not a multiple of PARTITION_ALIGN)."""
    plan = impl.plan_split_kv(num_seqs, num_kv_heads, max_len, 132, block_size=16,
                              target_ctas_per_sm=1, max_partition_size=4096)
    assert (plan.num_partitions, plan.partition_size) == expected, plan
    with pytest.raises(ValueError, match="max_partition_size"):
        impl.plan_split_kv(4, 8, 100, 132, max_partition_size=1000)
    with pytest.raises(ValueError, match="target_ctas_per_sm"):
        impl.plan_split_kv(4, 8, 100, 132, target_ctas_per_sm=0)


@pytest.mark.points(1)
@pytest.mark.parametrize("version", ["v3", "v4", "v5", "v6"])
def test_forced_plan_is_checked_before_launch(impl, version):
    """A plan passed in must be a SplitKVPlan of whole tiles covering max_context_len (and, for
    v4..v6, partitions they can stage); it is refused before the device check."""
    batch = cpu_batch()
    bad = [impl.SplitKVPlan(1, 100), impl.SplitKVPlan(1, 32), impl.SplitKVPlan(2, 64)]
    for plan in bad:
        with pytest.raises(ValueError, match="plan"):
            call(impl, batch, version, plan=plan, max_context_len=200)
    with pytest.raises(TypeError, match="plan"):
        call(impl, batch, version, plan=(2, 64), max_context_len=64)
    if version in ("v4", "v5", "v6"):
        too_long = 2 * (impl.V6_MAX_PARTITION_SIZE if version == "v6" else impl.MAX_PARTITION_SIZE)
        with pytest.raises(ValueError, match="plan"):
            call(impl, batch, version, plan=impl.SplitKVPlan(1, too_long), max_context_len=64)
    with pytest.raises(DeviceMismatchError):
        call(impl, batch, version, plan=impl.SplitKVPlan(4, 64), max_context_len=200)


@pytest.mark.points(1)
def test_heads_per_cta_divides_the_group(impl):
    """A GQA CTA serves a divisor of the group (so all its heads share one KV head), at most 8."""
    for group in range(1, 65):
        hpc = impl.heads_per_cta(group)
        assert group % hpc == 0 and 1 <= hpc <= impl.MAX_HEADS_PER_CTA
        assert hpc == max(d for d in range(1, 9) if group % d == 0)


@pytest.mark.points(1)
@pytest.mark.parametrize("group, error", [(0, ValueError), (-4, ValueError), (2.5, TypeError),
                                          ("4", TypeError)])
def test_heads_per_cta_rejects_a_bad_group(impl, group, error):
    """heads_per_cta refuses a group that is not an int >= 1 with a typed error naming group."""
    with pytest.raises(error, match="group") as info:
        impl.heads_per_cta(group)
    assert "group" in str(info.value), (
        f"heads_per_cta({group!r}) raised {info.value!r}: check group with check_int(..., "
        "min_value=1) first, instead of letting max()/range() fail without naming it")


@pytest.mark.points(1)
@pytest.mark.parametrize("kind", [np.uint8, np.int16, np.uint32, np.int64])
def test_split_plan_is_the_same_for_numpy_integer_arguments(impl, kind):
    """plan_split_kv computes in Python ints: NumPy integer arguments (a scheduler's counters)
    give exactly the plan that Python ints give, with no wrap-around in the products."""
    args = (16, 32, 100, 120)  # num_seqs * num_kv_heads = 512: wraps to 0 in uint8
    want = impl.plan_split_kv(*args)
    got = impl.plan_split_kv(*(kind(a) for a in args))
    assert (got.num_partitions, got.partition_size) == (want.num_partitions,
                                                        want.partition_size), (
        f"plan_split_kv with {kind.__name__} arguments gave {got}, Python ints {want}: keep the "
        "Python int that check_int returns (num_seqs = check_int(...)) so the arithmetic never "
        f"happens in {kind.__name__}")
