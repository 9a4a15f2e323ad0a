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
from reference.expect import raises_naming
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
                                          (dict(head_size=512), "head_size"),
                                          (dict(block_size=12), "block_size"),
                                          (dict(block_size=64), "block_size")])
def test_unsupported_head_or_block_size_raises(impl, kwargs, name):
    """Head sizes other than 64/128/256 (32, 96, 512) and block sizes other than 8/16/32 are
    refused before any kernel is compiled (UnsupportedConfigError, a ValueError)."""
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
@pytest.mark.parametrize("group, num_kv_heads, head_size", [
    (1, 8, 128), (2, 4, 128), ("V6_MIN_GROUP-1", 2, 128), ("V6_MIN_GROUP", 2, 128),
    ("V6_MIN_GROUP", 1, 64), (8, 2, 128), (8, 8, 64), (2, 2, 256), (8, 2, 256), (1, 8, 256)])
def test_paged_attention_dispatch(impl, monkeypatch, group, num_kv_heads, head_size):
    """paged_attention hands head sizes 64 and 128 to v6 from a GQA group of V6_MIN_GROUP up
    and to v4 below it (your constant: move it if your GPU disagrees), and head size 256, which
    v6 has no code for, to v4 at any group."""
    if isinstance(group, str):  # at and just below your threshold (capped: 64 is "never v6")
        group = max(1, int(min(impl.V6_MIN_GROUP - group.endswith("-1"), 64)))
    expected = "v6" if head_size != 256 and group >= impl.V6_MIN_GROUP else "v4"
    called = []
    for version in ("v4", "v5", "v6"):
        monkeypatch.setattr(impl, f"paged_attention_{version}",
                            lambda *a, _v=version, **k: called.append(_v))
    impl.paged_attention(**cpu_batch(num_q_heads=group * num_kv_heads, num_kv_heads=num_kv_heads,
                                     head_size=head_size))
    assert called == [expected], (
        f"group {group}, head size {head_size}: paged_attention called {called}, expected "
        f"{expected} (V6_MIN_GROUP = {impl.V6_MIN_GROUP})")


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


# ----------------------------------------------------------------------------- corner cases
# (each kills generated mutants of the checks and the plan: boundaries on both sides, counts
# past 256, asymmetric shapes)


def zero_lens(batch):
    """The batch with every context empty (so any table width or block count holds it)."""
    batch["context_lens"] = torch.zeros_like(batch["context_lens"])
    return batch


def valid_corner_batches():
    """Valid batches at the edges of each shape check (name -> (batch, extra kwargs))."""
    mixed = cpu_batch()
    mixed["context_lens"][1] = 0  # an empty sequence between two others
    full = cpu_batch()
    full["context_lens"][0] = 64  # exactly the 4 blocks of 16 the table row holds
    full["block_tables"][0] = torch.arange(4, dtype=torch.int32)
    return {
        "MQA (1 KV head)": (cpu_batch(num_q_heads=4, num_kv_heads=1), {}),
        "group of 3": (cpu_batch(num_q_heads=6, num_kv_heads=2), {}),
        "one block in the cache": (cpu_batch(num_blocks=1), {}),
        "table one block wide": (cpu_batch(num_seqs=2, width=1), {}),
        "no sequences": (cpu_batch(num_seqs=0), {}),
        "300 sequences": (cpu_batch(num_seqs=300, num_q_heads=1, num_kv_heads=1, head_size=64,
                                    num_blocks=1, width=170), {}),
        "an empty context": (mixed, {}),
        "a context filling its table row": (full, {}),
        "out like query": (cpu_batch(), {"out": torch.zeros(3, 8, 128, dtype=torch.float16)}),
        "bfloat16 with out": (cpu_batch(dtype=torch.bfloat16),
                              {"out": torch.zeros(3, 8, 128, dtype=torch.bfloat16)}),
        "max_context_len=0, empty contexts": (zero_lens(cpu_batch()), {"max_context_len": 0}),
        "max_context_len = longest context": (cpu_batch(), {"max_context_len": 23}),
    }


@pytest.mark.points(1)
@pytest.mark.parametrize("case", list(valid_corner_batches()))
def test_valid_corner_batches_fail_only_at_the_device_check(impl, case):
    """Batches at the edge of every shape check are valid: MQA, a group of 3, one block, a table
    one block wide, no sequences, 300 sequences, an empty context, a context that fills its
    table row, an ``out`` like the query, ``max_context_len`` 0 or equal to the longest
    context. check_decode_args refuses none of them: only the device check fails."""
    batch, kwargs = valid_corner_batches()[case]
    try:
        call(impl, batch, **kwargs)
    except DeviceMismatchError:
        return
    except (TypeError, ValueError, IndexError, ZeroDivisionError) as e:
        pytest.fail(f"check_decode_args refused a valid batch ({case}): {e!r}. Look for a bound "
                    "off by one (== 1 for == 0, <= for <), a bitwise & for %, or `is` comparing "
                    "two ints (equal ints above 256 are different objects)")
    pytest.fail(f"check_decode_args accepted CPU tensors ({case}) without the device check")


def corner_shape_errors():
    """Invalid batches just past each shape check: (name, changes, name the error must carry)."""
    f16 = torch.float16
    return {
        "value_cache larger than key_cache": (
            {"value_cache": torch.zeros(12, 2, 32, 128, dtype=f16)}, "value_cache"),
        "query head_size larger than the cache's": ({"query": torch.zeros(3, 8, 256, dtype=f16)},
                                                    "head_size"),
        "no KV heads": ({"key_cache": torch.zeros(12, 0, 16, 128, dtype=f16),
                         "value_cache": torch.zeros(12, 0, 16, 128, dtype=f16)}, "num_kv_heads"),
        "fewer query heads than KV heads": ({"query": torch.zeros(3, 1, 128, dtype=f16)},
                                            "num_kv_heads"),
        "no blocks": ({"key_cache": torch.zeros(0, 2, 16, 128, dtype=f16),
                       "value_cache": torch.zeros(0, 2, 16, 128, dtype=f16),
                       "context_lens": torch.zeros(3, dtype=torch.int32)}, "key_cache"),
        "more table rows than sequences": ({"block_tables": torch.zeros(4, 4, dtype=torch.int32)},
                                           "block_tables"),
        "a table 0 blocks wide": ({"block_tables": torch.zeros(3, 0, dtype=torch.int32),
                                   "context_lens": torch.zeros(3, dtype=torch.int32)},
                                  "block_tables"),
        "fewer lengths than sequences": ({"context_lens": torch.zeros(2, dtype=torch.int32)},
                                         "context_lens"),
        "out with more heads": ({"out": torch.zeros(3, 9, 128, dtype=f16)}, "out"),
        "out in bfloat16": ({"out": torch.zeros(3, 8, 128, dtype=torch.bfloat16)}, "out"),
        "out in float32": ({"out": torch.zeros(3, 8, 128, dtype=torch.float32)}, "out"),
        "out not contiguous": ({"out": torch.zeros(8, 3, 128, dtype=f16).transpose(0, 1)}, "out"),
    }


@pytest.mark.points(1)
@pytest.mark.parametrize("case", list(corner_shape_errors()))
def test_shapes_just_past_each_check_raise_value_error_naming_it(impl, case):
    """Shapes one step past each check, in the direction the other tests do not try: a larger
    value_cache, a larger query head, 0 KV heads, fewer query than KV heads, 0 blocks, more
    table rows or fewer lengths than sequences, a table 0 blocks wide, ``out`` with more heads,
    another dtype (either side of float16) or strided. Each is a ValueError naming it."""
    changes, name = corner_shape_errors()[case]
    batch = cpu_batch()
    batch.update(changes)
    raises_naming(lambda: call(impl, batch), ValueError, name, case,
                  crashed_hint=": a check that compares with < or > instead of != lets one "
                  "direction through, and a division by a 0 size crashes before the check that "
                  "refuses it")


@pytest.mark.points(1)
@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_default_scale_is_one_over_sqrt_head_size(impl, head_size):
    """scale=None means 1/sqrt(head_size) (the DecodeShape that check_decode_args returns
    carries the scale actually used); a given scale is kept."""
    shape, _ = impl.check_decode_args(**cpu_batch(head_size=head_size), check_device=False)
    assert shape.scale == pytest.approx(1 / np.sqrt(head_size), rel=1e-6), (
        f"default scale for head_size={head_size} is {shape.scale}, not 1/sqrt(head_size)")
    shape, _ = impl.check_decode_args(**cpu_batch(head_size=head_size), scale=0.3,
                                      check_device=False)
    assert shape.scale == pytest.approx(0.3, rel=1e-6), f"scale=0.3 became {shape.scale}"


@pytest.mark.points(1)
@pytest.mark.parametrize("arg", ["query", "key_cache", "value_cache", "out"])
@pytest.mark.parametrize("elements", [1, 3, 7])
def test_misaligned_tensor_error_says_how_far_past_the_boundary(impl, arg, elements):
    """The misalignment error says how many bytes past a 16-byte boundary the tensor starts
    (its address modulo 16), for views 2, 6 and 14 bytes into storages that start on and 16
    bytes past a boundary."""
    for shift in (0, 8):  # 8 float16 elements: a storage start 16 bytes further on
        batch = cpu_batch()
        x = batch["query"] if arg == "out" else batch[arg]
        storage = torch.zeros(x.numel() + 16, dtype=x.dtype)
        view = storage[shift + elements:shift + elements + x.numel()].view(x.shape)
        if arg == "out":
            batch["out"] = view
        else:
            batch[arg] = view
        past = view.data_ptr() % 16
        assert past == 2 * elements  # torch's CPU allocations are 64-byte aligned
        with pytest.raises(ValueError, match=f"{arg}.*16-byte") as info:
            call(impl, batch)
        assert f"is {past} bytes past" in str(info.value), (
            f"{info.value}: the message should say the address is {past} bytes past a 16-byte "
            "boundary (data_ptr() % 16)")


@pytest.mark.points(1)
def test_context_errors_name_the_first_bad_sequence_and_the_limit(impl):
    """A bad context length is reported for the *first* sequence that has one, and the message
    says which limit it broke: ``is negative``, ``the block table covers`` (also for tables of
    more than 256 tokens, and when max_context_len allows more) or ``max_context_len allows``."""
    def error(batch, **kwargs):
        with pytest.raises(ValueError) as info:
            call(impl, batch, **kwargs)
        return str(info.value)

    batch = cpu_batch()
    batch["context_lens"][0] = 0
    batch["context_lens"][1] = -1
    batch["context_lens"][2] = -5
    msg = error(batch)
    assert "context_lens[1]=-1" in msg and "negative" in msg, (
        f"{msg!r}: lengths (0, -1, -5) must report context_lens[1]=-1 as negative (0 is a valid "
        "length; -1 is negative too)")
    batch = cpu_batch()
    batch["context_lens"][1] = -1  # the only negative one
    msg = error(batch)
    assert "context_lens[1]=-1" in msg and "negative" in msg, f"{msg!r}: -1 is negative too"
    batch = cpu_batch()
    batch["context_lens"][0] = 64  # fills its row exactly: fine
    batch["block_tables"][0] = torch.arange(4, dtype=torch.int32)
    batch["context_lens"][1] = 65
    msg = error(batch)
    assert "context_lens[1]=65" in msg and "the block table covers" in msg, (
        f"{msg!r}: lengths (64, 65, 23) in a 64-token row must report context_lens[1], the first "
        "*longer* than the row, as longer than the block table covers")
    msg = error(batch, max_context_len=1000)
    assert "context_lens[1]=65" in msg and "the block table covers" in msg, (
        f"{msg!r}: with max_context_len=1000 the table (64 tokens) is still the limit")
    wide = cpu_batch(width=20, num_blocks=60)  # 320 tokens: past CPython's cached small ints
    wide["context_lens"][1] = 321
    msg = error(wide)
    assert "context_lens[1]=321" in msg and "the block table covers" in msg, (
        f"{msg!r}: compare the limit with the table's tokens by value (==), not identity (is)")
    msg = error(cpu_batch(), max_context_len=20)
    assert "context_lens[2]=23" in msg and "max_context_len allows" in msg, (
        f"{msg!r}: a context longer than max_context_len=20 (but inside its table row) must say "
        "max_context_len allows")


@pytest.mark.points(1)
@pytest.mark.parametrize("value", [-1, -7])
def test_max_context_len_below_zero_is_refused_by_name(impl, value):
    """max_context_len is an int >= 0: -1 is refused as such (ValueError naming it), not
    reported as a context longer than it allows."""
    with pytest.raises(ValueError, match=r"^max_context_len"):
        call(impl, cpu_batch(), max_context_len=value)


@pytest.mark.points(1)
@pytest.mark.parametrize("changes, name", [
    ({"query": torch.zeros(3, 8, dtype=torch.float16)}, "query"),
    ({"key_cache": torch.zeros(12, dtype=torch.float16)}, "key_cache"),
    ({"key_cache": torch.zeros(12, 0, 16, 128, dtype=torch.float16),
      "value_cache": torch.zeros(12, 0, 16, 128, dtype=torch.float16)}, "num_kv_heads"),
    ({"key_cache": torch.zeros(0, 0, 16, 128, dtype=torch.float16),
      "value_cache": torch.zeros(0, 0, 16, 128, dtype=torch.float16)}, "num_kv_heads"),
    ({"key_cache": torch.zeros(12, 0, 0, 128, dtype=torch.float16),
      "value_cache": torch.zeros(12, 0, 0, 128, dtype=torch.float16)}, "num_kv_heads"),
])
def test_paged_attention_refuses_malformed_shapes_like_its_launchers(impl, changes, name):
    """paged_attention chooses its kernel from the shapes before validating them: a query of
    rank 2, a cache of rank 1 or with 0 KV heads still gets the launchers' ValueError naming
    the culprit, never an IndexError or ZeroDivisionError from the choice."""
    batch = cpu_batch()
    batch.update(changes)
    try:
        impl.paged_attention(**batch)
    except ValueError as e:
        assert name in str(e), f"the ValueError {e!r} does not name {name}"
        return
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"paged_attention crashed with {e!r} instead of a ValueError naming {name}: "
                    "_prefers_v6 must check the ranks and num_kv_heads > 0 before it indexes "
                    "the shapes or divides by them")
    pytest.fail(f"paged_attention accepted a malformed batch ({name})")


@pytest.mark.points(1)
@pytest.mark.parametrize("min_group, num_kv_heads, head_size", [(8, 1, 128), (4, 1, 64),
                                                                   (1, 128, 64)])
def test_paged_attention_sends_mqa_and_many_kv_heads_to_v6(impl, monkeypatch, min_group,
                                                           num_kv_heads, head_size):
    """MQA (one KV head) and more KV heads than the head size go to v6 too, from a group of
    V6_MIN_GROUP up: the choice reads num_kv_heads (shape[1] of the cache, any value >= 1) and
    the group num_q_heads // num_kv_heads."""
    group = int(min(max(min_group, impl.V6_MIN_GROUP), 64))  # a threshold past 64: never v6
    expected = "v6" if group >= impl.V6_MIN_GROUP else "v4"
    num_q_heads = group * num_kv_heads
    called = []
    for version in ("v4", "v5", "v6"):
        monkeypatch.setattr(impl, f"paged_attention_{version}",
                            lambda *a, _v=version, **k: called.append(_v))
    impl.paged_attention(**cpu_batch(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                                     head_size=head_size, num_blocks=2, width=4))
    assert called == [expected], (
        f"{num_q_heads} query heads over {num_kv_heads} KV heads, head size {head_size} went to "
        f"{called}, expected {expected}: check num_kv_heads > 0 (not > 1) and divide num_q_heads "
        f"(shape[1]) by it")


@pytest.mark.points(1)
def test_heads_per_cta_honours_and_checks_its_limit(impl):
    """heads_per_cta's limit is the largest CTA it may return, any int >= 1 (1 gives one head
    per CTA); a limit below 1 or not an int is refused with an error naming limit."""
    cases = {(12, 1): 1, (12, 5): 4, (12, 6): 6, (16, 16): 16, (7, 2): 1, (9, 3): 3}
    for (group, limit), want in cases.items():
        got = impl.heads_per_cta(group, limit)
        assert got == want, f"heads_per_cta({group}, limit={limit}) = {got}, want {want}"
    for limit, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError)):
        with pytest.raises(error, match="limit"):
            impl.heads_per_cta(8, limit)


@pytest.mark.points(1)
@pytest.mark.parametrize("args, kwargs, expected", [
    ((1, 1, 300_000, 132), dict(max_partition_size=4096), (586, 512)),
    ((34, 8, 256, 74), dict(target_ctas_per_sm=1, max_partition_size=4096), (1, 256)),
    ((20, 3, 2816, 59), dict(target_ctas_per_sm=1, max_partition_size=4096), (1, 2816)),
    ((5, 3, 33788, 77), dict(target_ctas_per_sm=2, max_partition_size=4096), (11, 3072)),
    ((2, 1, 240_595, 157), {}, (314, 768)),
    ((10, 4, 6450, 103), {}, (13, 512)),
    ((4, 8, 100, 132), dict(max_partition_size=768), (1, 256)),
])
def test_split_plan_exact_lengths(impl, args, kwargs, expected):
    """The plan's arithmetic, exactly (handout, Task 4.3): ``wanted`` = ceil(target * num_sms /
    max(1, num_seqs * num_kv_heads)) partitions, their length ceil(max_context_len / wanted)
    aligned up to PARTITION_ALIGN unless that gives fewer than ``wanted`` partitions, else
    aligned down; clamped to [PARTITION_ALIGN, max_partition_size]; then as many as cover
    max_context_len. Cases: one row, a length that divides exactly, counts past 256, the
    aligned-down branch at 512 tokens and more. Every argument can be passed by name."""
    names = ("num_seqs", "num_kv_heads", "max_context_len", "num_sms")
    plan = impl.plan_split_kv(**dict(zip(names, args)), block_size=16, **kwargs)
    assert (plan.num_partitions, plan.partition_size) == expected, (
        f"plan_split_kv{args} {kwargs} = {plan}, want {expected}: check each ceil division "
        "(-(-a // b)), the align-up test (>=, by value) and the align-down "
        "(size // PARTITION_ALIGN * PARTITION_ALIGN)")
    plan = impl.plan_split_kv(4, 8, 0, 132)
    assert plan.num_partitions == 1, f"an empty longest context needs 1 partition, got {plan}"


@pytest.mark.points(1)
@pytest.mark.parametrize("kwargs, name", [
    (dict(max_context_len=-1), "max_context_len"),
    (dict(max_partition_size=556), "max_partition_size"),
    (dict(max_partition_size=1280 + 44), "max_partition_size"), (dict(block_size=0), "block_size"),
    (dict(num_kv_heads=0), "num_kv_heads")])
def test_split_plan_refuses_values_just_out_of_range(impl, kwargs, name):
    """Values one step out of range are refused (ValueError naming the argument):
    max_context_len -1, a max_partition_size that is not a multiple of PARTITION_ALIGN (556,
    1324), block_size 0, num_kv_heads 0."""
    args = dict(num_seqs=4, num_kv_heads=8, max_context_len=100, num_sms=132, block_size=16)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        impl.plan_split_kv(**args)


@pytest.mark.points(1)
def test_paged_attention_passes_plan_and_max_context_len_on(impl):
    """``paged_attention`` takes its arguments "as paged_attention_v4": a bad forced ``plan`` and
    a context past ``max_context_len`` are refused through it as through v4 (``ValueError``
    naming them), not dropped on the way to the kernel it picks."""
    with pytest.raises(ValueError, match="plan"):
        impl.paged_attention(**cpu_batch(), plan=impl.SplitKVPlan(1, 100), max_context_len=200)
    with pytest.raises(ValueError, match="max_context_len"):
        impl.paged_attention(**cpu_batch(), max_context_len=10)  # contexts 5, 14, 23
