"""Lab 5, part A (CPU): every launcher refuses bad input with a typed error naming the argument,
before anything runs on a GPU. All tests here use CPU tensors, so they grade without a GPU: a
valid batch of CPU tensors gets as far as the last check (the device) and no further.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from labs.lab05_prefill_kernels._cases import KERNELS, launcher, make_batch
from reference.errors import DeviceMismatchError, UnsupportedConfigError
from reference.expect import raises_naming

#: Every launcher validates the same way, the Hopper one (Task 5.6) too: these tests need no GPU.
LAUNCHERS = (*KERNELS, "wgmma")


def cpu_batch(**kw):
    args = dict(seed=5, query_lens=[7, 1, 20], history_lens=[9, 30, 6], num_q_heads=8,
                num_kv_heads=2, head_size=64, block_size=16, device="cpu")
    args.update(kw)
    return make_batch(args.pop("seed"), args.pop("query_lens"), args.pop("history_lens"),
                      args.pop("num_q_heads"), args.pop("num_kv_heads"), args.pop("head_size"),
                      args.pop("block_size"), **args)


@pytest.mark.points(3)
@pytest.mark.parametrize("kernel", LAUNCHERS)
def test_valid_cpu_batch_fails_only_on_the_device_check(impl, kernel):
    """A valid batch of CPU tensors passes every check and raises DeviceMismatchError, naming
    the device, only at the end: validation happens before the device is even looked at."""
    batch = cpu_batch()
    with pytest.raises(DeviceMismatchError, match="cuda|CUDA"):
        launcher(impl, kernel)(**batch)
    batch = cpu_batch(alibi=True, dtype="bfloat16")
    with pytest.raises(DeviceMismatchError):
        launcher(impl, kernel)(**batch, out=torch.empty_like(batch["query"]))


@pytest.mark.points(3)
@pytest.mark.parametrize("kernel", LAUNCHERS)
@pytest.mark.parametrize("mistake", ["last_offset", "length", "first_offset", "decreasing"])
def test_rejects_mismatched_cu_seqlens_q(impl, kernel, mistake):
    """cu_seqlens_q must start at 0, never decrease, have num_seqs + 1 entries and end at the
    number of query tokens; otherwise ValueError naming cu_seqlens_q."""
    batch = cpu_batch()
    cu = batch["cu_seqlens_q"].clone()
    if mistake == "last_offset":
        cu[-1] -= 1  # the last sequence loses a token the query still has
    elif mistake == "length":
        cu = cu[:-1].clone()
    elif mistake == "first_offset":
        cu[0] = 1
    else:
        first, second = int(cu[1]), int(cu[2])
        cu[1], cu[2] = second + 1, first
    batch["cu_seqlens_q"] = cu
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        launcher(impl, kernel)(**batch)


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", LAUNCHERS)
def test_rejects_history_longer_than_the_cache(impl, kernel):
    """A context longer than the block table can hold (width * block_size) raises ValueError
    naming context_lens, before any kernel could read past the table's row."""
    batch = cpu_batch()
    width = batch["block_tables"].shape[1]
    batch["context_lens"][1] = width * 16 + 1
    with pytest.raises(ValueError, match="context_lens"):
        launcher(impl, kernel)(**batch)


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", LAUNCHERS)
def test_rejects_context_shorter_than_the_query(impl, kernel):
    """context_lens counts history *and* the new tokens, so it is at least the query length; a
    shorter one (negative history) raises ValueError naming context_lens."""
    batch = cpu_batch()
    batch["context_lens"][2] = 19  # 20 query tokens
    with pytest.raises(ValueError, match="context_lens"):
        launcher(impl, kernel)(**batch)


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", LAUNCHERS)
@pytest.mark.parametrize("what, kw, name", [
    ("head_size", dict(head_size=96), "head_size"),
    ("head_size", dict(head_size=32), "head_size"),
    ("head_size", dict(head_size=512), "head_size"),
    ("head_size", dict(head_size=192), "head_size"),
    ("head_size", dict(head_size=256), "head_size"),
    ("block_size", dict(block_size=12), "block_size"),
])
def test_rejects_unsupported_sizes(impl, kernel, what, kw, name):
    """Sizes the kernels have no code for raise UnsupportedConfigError (a ValueError) naming
    the size: head_size in (64, 128) exactly (not every multiple of 64: 192 and 256 too are
    refused), block_size a power of two in 8..128."""
    batch = cpu_batch(**kw)
    with pytest.raises(UnsupportedConfigError, match=name):
        launcher(impl, kernel)(**batch)


@pytest.mark.points(1)
def test_tensor_core_kernel_rejects_float32(impl):
    """The mma.sync kernel takes 16-bit operands: float32 raises UnsupportedConfigError naming
    the dtype; the naive and tiled kernels accept it."""
    batch = cpu_batch(dtype="float32")
    with pytest.raises(UnsupportedConfigError, match="float32"):
        impl.paged_prefill_tc(**batch)
    for kernel in ("naive", "tiled"):
        with pytest.raises(DeviceMismatchError):
            launcher(impl, kernel)(**batch)


def _break(batch, mistake):
    b = dict(batch)
    if mistake == "block_tables_int64":
        b["block_tables"] = b["block_tables"].long()
    elif mistake == "query_numpy":
        b["query"] = b["query"].numpy()
    elif mistake == "query_float64":
        b["query"] = b["query"].double()
    elif mistake == "value_cache_dtype":
        b["value_cache"] = b["value_cache"].float()
    elif mistake == "query_not_contiguous":
        b["query"] = b["query"].transpose(0, 1).contiguous().transpose(0, 1)
    elif mistake == "query_2d":
        b["query"] = b["query"].reshape(b["query"].shape[0], -1)
    elif mistake == "value_cache_shape":
        b["value_cache"] = b["value_cache"][:-1].clone()
    elif mistake == "key_head_size":
        b["key_cache"] = b["key_cache"][..., :32].clone()
        b["value_cache"] = b["value_cache"][..., :32].clone()
    elif mistake == "num_kv_heads":
        b["key_cache"] = torch.cat([b["key_cache"], b["key_cache"][:, :1]], dim=1)
        b["value_cache"] = torch.cat([b["value_cache"], b["value_cache"][:, :1]], dim=1)
    elif mistake == "context_lens_shape":
        b["context_lens"] = b["context_lens"][:-1].clone()
    elif mistake == "scale_zero":
        b["scale"] = 0.0
    elif mistake == "scale_str":
        b["scale"] = "0.125"
    elif mistake == "alibi_slopes_shape":
        b["alibi_slopes"] = torch.ones(3, dtype=torch.float32)
    elif mistake == "query_misaligned":
        q = b["query"]
        flat = torch.empty(q.numel() + 1, dtype=q.dtype)
        b["query"] = flat[1:].view(q.shape)
    return b


@pytest.mark.points(3)
@pytest.mark.parametrize("kernel", LAUNCHERS)
@pytest.mark.parametrize("mistake, error, name", [
    ("block_tables_int64", TypeError, "block_tables"),
    ("query_numpy", TypeError, "query"),
    ("query_float64", TypeError, "query"),
    ("value_cache_dtype", TypeError, "value_cache"),
    ("query_not_contiguous", ValueError, "query"),
    ("query_2d", ValueError, "query"),
    ("value_cache_shape", ValueError, "value_cache"),
    ("key_head_size", ValueError, "head_size"),
    ("num_kv_heads", ValueError, "num_kv_heads"),
    ("context_lens_shape", ValueError, "context_lens"),
    ("scale_zero", ValueError, "scale"),
    ("scale_str", TypeError, "scale"),
    ("alibi_slopes_shape", ValueError, "alibi_slopes"),
    ("query_misaligned", ValueError, "query"),
])
def test_rejects_malformed_arrays(impl, kernel, mistake, error, name):
    """Wrong kinds, dtypes, ranks, shapes, strides or alignment raise TypeError / ValueError
    naming the argument: the kernel would otherwise read the wrong bytes silently."""
    batch = _break(cpu_batch(), mistake)
    with pytest.raises(error, match=name):
        launcher(impl, kernel)(**batch)


@pytest.mark.points(1)
@pytest.mark.parametrize("kernel", LAUNCHERS)
def test_rejects_bad_out(impl, kernel):
    """out must be query's shape and dtype; otherwise ValueError / TypeError naming out."""
    batch = cpu_batch()
    with pytest.raises(ValueError, match="out"):
        launcher(impl, kernel)(**batch, out=torch.empty(3, 8, 64, dtype=torch.float16))
    with pytest.raises(TypeError, match="out"):
        launcher(impl, kernel)(**batch, out=torch.empty_like(batch["query"], dtype=torch.float32))


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", LAUNCHERS)
@pytest.mark.parametrize("bad_id", [-1, 10_000])
def test_rejects_block_ids_out_of_range(impl, kernel, bad_id):
    """A block id the kernel would read (within a sequence's context) outside [0, num_blocks)
    raises IndexError naming block_tables; padding past the context is never checked or read."""
    batch = cpu_batch()
    batch["block_tables"][2, 1] = bad_id  # sequence 2 has 26 tokens: blocks 0 and 1 are read
    with pytest.raises(IndexError, match=r"block_tables\[2, 1\]"):
        launcher(impl, kernel)(**batch)
    batch = cpu_batch()
    batch["block_tables"][2, 2:] = bad_id  # past the context: never read, so fine
    with pytest.raises(DeviceMismatchError):
        launcher(impl, kernel)(**batch)


@pytest.mark.points(1)
@pytest.mark.parametrize("kernel", LAUNCHERS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_rejects_non_finite_alibi_slopes(impl, kernel, bad):
    """An ALiBi slope that is NaN or infinite raises ValueError naming alibi_slopes: the kernel
    would turn every score of that head into NaN without a word."""
    batch = cpu_batch(alibi=True)
    batch["alibi_slopes"] = batch["alibi_slopes"].clone()
    batch["alibi_slopes"][3] = bad
    with pytest.raises(ValueError, match="alibi_slopes"):
        launcher(impl, kernel)(**batch)
    with pytest.raises(ValueError, match="alibi_slopes"):
        impl.check_prefill_inputs(**batch, kernel=kernel)


@pytest.mark.points(1)
@pytest.mark.parametrize("kernel", LAUNCHERS)
def test_rejects_zero_query_heads(impl, kernel):
    """A query with zero heads raises ValueError naming num_q_heads in check_prefill_inputs
    (0 is a multiple of every num_kv_heads, so the GQA check alone lets it through)."""
    batch = cpu_batch()
    batch["query"] = torch.zeros(batch["query"].shape[0], 0, 64, dtype=batch["query"].dtype)
    try:
        impl.check_prefill_inputs(**batch, kernel=kernel)
    except ValueError as exc:
        assert "num_q_heads" in str(exc), f"refused, but without naming num_q_heads: {exc}"
    else:
        pytest.fail("check_prefill_inputs accepted a query of zero heads: num_q_heads % "
                    "num_kv_heads == 0 holds for 0 too, so refuse num_q_heads == 0 on its own")


@pytest.mark.points(1)
@pytest.mark.parametrize("kw, error, name", [
    (dict(block_m=0), ValueError, "block_m"), (dict(block_n=0), ValueError, "block_n"),
    (dict(rows_per_token=0), ValueError, "rows_per_token"),
    (dict(block_m=2.5), TypeError, "block_m"), (dict(block_n="64"), TypeError, "block_n")])
def test_plan_rejects_bad_tile_sizes(impl, kw, error, name):
    """plan_query_tiles refuses a tile size that is not an int >= 1 with a typed error naming
    it, before reading the metadata (not a ZeroDivisionError or an empty range)."""
    cu, ctx = torch.tensor([0, 3, 8], dtype=torch.int32), torch.tensor([10, 20], dtype=torch.int32)
    with pytest.raises(error, match=name):
        impl.plan_query_tiles(cu, ctx, **kw)


# ----------------------------------------------------------------------------- corner cases
# check_prefill_inputs on its own: each check must fire there, not be left to a later one
# (the plan, the launch checks) that happens to refuse the same batch.


def _direct_mistakes():
    """(name -> (batch changes, error type, name the error must carry)) for check_prefill_inputs."""
    base = cpu_batch()
    q, k, v = base["query"], base["key_cache"], base["value_cache"]
    wide = cpu_batch(head_size=128)
    cu = base["cu_seqlens_q"]
    storage = torch.zeros(k.numel() + 8, dtype=k.dtype)
    return {
        "query's heads not a multiple of the KV heads": (_break(base, "num_kv_heads"), ValueError,
                                                         "num_kv_heads"),
        "no KV heads": ({"key_cache": k[:, :0].clone(), "value_cache": v[:, :0].clone()},
                        ValueError, "num_kv_heads"),
        "no blocks": ({"key_cache": k[:0].clone(), "value_cache": v[:0].clone()}, ValueError,
                      "key_cache"),
        "a table 0 blocks wide": ({"block_tables": base["block_tables"][:, :0].clone()},
                                  ValueError, "block_tables"),
        "value_cache with one block more": ({"value_cache": torch.cat([v, v[:1]])}, ValueError,
                                            "value_cache"),
        "caches with a larger head_size": ({"key_cache": wide["key_cache"],
                                            "value_cache": wide["value_cache"]}, ValueError,
                                           "head_size"),
        "bfloat16 caches for a float16 query": ({"key_cache": k.bfloat16(),
                                                 "value_cache": v.bfloat16()}, TypeError,
                                                "key_cache"),
        "one context length too many": ({"context_lens": torch.cat([base["context_lens"],
                                                                    base["context_lens"][:1]])},
                                        ValueError, "context_lens"),
        "one context length too few": ({"context_lens": base["context_lens"][:2].clone()},
                                       ValueError, "context_lens"),
        "cu_seqlens_q one entry too long": ({"cu_seqlens_q": torch.cat([cu, cu[-1:]])},
                                            ValueError, "cu_seqlens_q"),
        "cu_seqlens_q one entry too short": ({"cu_seqlens_q": cu[:3].clone()}, ValueError,
                                             "cu_seqlens_q"),
        "alibi_slopes with a slope too many": ({"alibi_slopes": torch.ones(9, dtype=torch.float32)},
                                               ValueError, "alibi_slopes"),
        "out with a token too many": ({"out": torch.zeros(29, 8, 64, dtype=q.dtype)}, ValueError,
                                      "out"),
        "misaligned query": (_break(base, "query_misaligned"), ValueError, "query"),
        "misaligned key_cache": ({"key_cache": storage[1:1 + k.numel()].view(k.shape)},
                                 ValueError, "key_cache"),
    }


@pytest.mark.points(1)
@pytest.mark.parametrize("case", list(_direct_mistakes()))
def test_check_prefill_inputs_itself_refuses_each_mistake(impl, case):
    """check_prefill_inputs alone (not a later check of the launcher) refuses each mistake with
    the documented error naming the argument, in the directions the launcher tests do not try:
    0 KV heads, 0 blocks, a table 0 wide, a larger value_cache or cache head, 16-bit caches of
    the other kind, one length too many or too few, a longer alibi_slopes or out, misalignment."""
    changes, error, name = _direct_mistakes()[case]
    batch = cpu_batch()
    batch.update(changes)
    raises_naming(lambda: impl.check_prefill_inputs(**batch, kernel="tiled"), error, name, case,
                  crashed_hint=" (a division by a 0 size before the check that refuses it?)",
                  accepted_hint=": check_prefill_inputs let it through — a check that compares "
                  "with < or > instead of !=, `and` for `or`, `is` for ==, or a loop that never "
                  "runs")


@pytest.mark.points(1)
def test_cu_seqlens_q_shape_error_states_the_length_it_needs(impl):
    """The cu_seqlens_q shape error states the shape it needs, (num_seqs + 1,)."""
    batch = cpu_batch()  # 3 sequences
    batch["cu_seqlens_q"] = batch["cu_seqlens_q"][:3].clone()
    with pytest.raises(ValueError, match=r"cu_seqlens_q must have shape \(4,\)"):
        impl.check_prefill_inputs(**batch, kernel="tiled")


@pytest.mark.points(1)
@pytest.mark.parametrize("name, changes", [
    ("MQA (1 KV head)", dict(num_q_heads=4, num_kv_heads=1)),
    ("a group of 3", dict(num_q_heads=6, num_kv_heads=2)),
    ("one sequence, a table one block wide", dict(query_lens=[3], history_lens=[2])),
])
def test_valid_corner_batches_pass_check_prefill_inputs(impl, name, changes):
    """MQA, a group of 3 and a table one block wide are valid: check_prefill_inputs returns their
    shapes instead of refusing them."""
    batch = cpu_batch(**changes)
    if name.startswith("one sequence"):  # one block in the cache too
        batch["key_cache"] = batch["key_cache"][:1].clone()
        batch["value_cache"] = batch["value_cache"][:1].clone()
        batch["block_tables"] = torch.zeros(1, 1, dtype=torch.int32)
    try:
        impl.check_prefill_inputs(**batch, kernel="tiled")
    except (TypeError, ValueError, ZeroDivisionError) as e:
        pytest.fail(f"check_prefill_inputs refused a valid batch ({name}): {e!r}. Look for == 1 "
                    "for == 0, or a bitwise & for %")


@pytest.mark.points(1)
@pytest.mark.parametrize("cu, ctx, message", [
    ([0, 5, 3, 9], [9, 9, 9], "cu_seqlens_q[1]=5 > cu_seqlens_q[2]=3"),
    ([0, 0, 5, 4, 9], [1, 9, 9, 9], "cu_seqlens_q[2]=5 > cu_seqlens_q[3]=4"),
    ([-1, 3, 8], [10, 20], "cu_seqlens_q[0] must be 0, got -1"),
    ([0, 4, 9, 12], [9, 5, 2], "context_lens[2]=2"),
    ([0, 5, 9, 12, 13], [9, 9, 9], "so it needs 4"),
    ([0, 5, 9], [9, 9, 9], "so it needs 4"),
])
def test_plan_metadata_errors_name_the_first_bad_entry(impl, cu, ctx, message):
    """The plan's metadata errors name the first bad entry and its value: the first decrease of
    cu_seqlens_q (both entries, after an empty sequence and a drop of 1 too), a first entry
    that is not 0, the first context shorter than its query (after one exactly as long), and
    the number of entries cu_seqlens_q needs (len(context_lens) + 1) when it has more or fewer."""
    assert_plan_error_says(impl, cu, ctx, message, "the first bad index s found with np.argmax of "
                           "the same condition, s + 1 its neighbour")


def assert_plan_error_says(impl, cu, ctx, message: str, hint: str) -> None:
    """plan_query_tiles(cu, ctx) as int32 arrays must raise ValueError containing ``message``."""
    with pytest.raises(ValueError) as info:
        impl.plan_query_tiles(np.asarray(cu, np.int32), np.asarray(ctx, np.int32))
    assert message in str(info.value), (
        f"plan_query_tiles({cu}, {ctx}) said {str(info.value)!r}; it should say {message!r} "
        f"({hint})")


@pytest.mark.points(1)
@pytest.mark.parametrize("rows_per_token, block_m, causal, expected", [
    (1, 1, True, [7, 6, 4, 3, 2]),
    (2, 3, True, [7, 7, 4, 3]),
    (1, 2, False, [7, 4, 4]),
])
def test_plan_counts_kv_tiles_of_one_key_exactly(impl, rows_per_token, block_m, causal, expected):
    """With block_n = 1 a tile's KV-tile count is exactly the number of keys its last row sees:
    history + its last token + 1 (causal), the whole context otherwise. block_m and block_n of 1
    are valid. Two sequences: 3 new tokens after 1 of history, 2 after 5."""
    plan = impl.plan_query_tiles(np.asarray([0, 3, 5], np.int32), np.asarray([4, 7], np.int32),
                                 rows_per_token=rows_per_token, block_m=block_m, block_n=1,
                                 causal=causal)
    assert plan.num_kv_tiles.tolist() == expected, (
        f"KV tiles {plan.num_kv_tiles.tolist()}, expected {expected}: a tile's last row is "
        "min(row_start + block_m, num_rows) - 1, its token that // rows_per_token, and it sees "
        "history + token + 1 keys")


@pytest.mark.points(1)
def test_plan_defaults_and_keyword_arguments(impl):
    """plan_query_tiles defaults to rows_per_token=1, block_m=block_n=64, causal; plan_for_kernel
    to causal. Every argument can be passed by name. A batch of 300 one-token sequences (more
    than CPython's cached small ints) is planned too."""
    cu, ctx = np.asarray([0, 3, 8], np.int32), np.asarray([10, 20], np.int32)
    plan = impl.plan_query_tiles(cu_seqlens_q=cu, context_lens=ctx)
    assert (plan.rows_per_token, plan.block_m, plan.block_n, plan.causal) == (1, 64, 64, True), (
        f"defaults {(plan.rows_per_token, plan.block_m, plan.block_n, plan.causal)}")
    plan = impl.plan_for_kernel("tiled", cu_seqlens_q=cu, context_lens=ctx, num_q_heads=8,
                                num_kv_heads=2)
    assert plan.causal is True, "plan_for_kernel's causal defaults to True"
    plan = impl.plan_query_tiles(np.arange(301, dtype=np.int32), np.ones(300, np.int32))
    assert len(plan.work) == 300, "300 one-token sequences give 300 tiles (compare lengths with !=)"
