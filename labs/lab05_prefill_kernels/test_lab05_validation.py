"""Lab 5, part A (CPU): every launcher refuses bad input with a typed error naming the argument,
before anything runs on a GPU. All tests here use CPU tensors, so they grade without a GPU: a
valid batch of CPU tensors gets as far as the last check (the device) and no further.
"""

from __future__ import annotations

import pytest
import torch

from labs.lab05_prefill_kernels._cases import KERNELS, launcher, make_batch
from reference.errors import DeviceMismatchError, UnsupportedConfigError


def cpu_batch(**kw):
    args = dict(seed=5, query_lens=[7, 1, 20], history_lens=[9, 30, 6], num_q_heads=8,
                num_kv_heads=2, head_size=64, block_size=16, device="cpu")
    args.update(kw)
    return make_batch(args.pop("seed"), args.pop("query_lens"), args.pop("history_lens"),
                      args.pop("num_q_heads"), args.pop("num_kv_heads"), args.pop("head_size"),
                      args.pop("block_size"), **args)


@pytest.mark.points(3)
@pytest.mark.parametrize("kernel", KERNELS)
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
@pytest.mark.parametrize("kernel", KERNELS)
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
@pytest.mark.parametrize("kernel", KERNELS)
def test_rejects_history_longer_than_the_cache(impl, kernel):
    """A context longer than the block table can hold (width * block_size) raises ValueError
    naming context_lens, before any kernel could read past the table's row."""
    batch = cpu_batch()
    width = batch["block_tables"].shape[1]
    batch["context_lens"][1] = width * 16 + 1
    with pytest.raises(ValueError, match="context_lens"):
        launcher(impl, kernel)(**batch)


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", KERNELS)
def test_rejects_context_shorter_than_the_query(impl, kernel):
    """context_lens counts history *and* the new tokens, so it is at least the query length; a
    shorter one (negative history) raises ValueError naming context_lens."""
    batch = cpu_batch()
    batch["context_lens"][2] = 19  # 20 query tokens
    with pytest.raises(ValueError, match="context_lens"):
        launcher(impl, kernel)(**batch)


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("what, kw, name", [
    ("head_size", dict(head_size=96), "head_size"),
    ("head_size", dict(head_size=32), "head_size"),
    ("block_size", dict(block_size=12), "block_size"),
])
def test_rejects_unsupported_sizes(impl, kernel, what, kw, name):
    """Sizes the kernels have no code for raise UnsupportedConfigError (a ValueError) naming
    the size: head_size in (64, 128), block_size a power of two in 8..128."""
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
@pytest.mark.parametrize("kernel", KERNELS)
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
@pytest.mark.parametrize("kernel", KERNELS)
def test_rejects_bad_out(impl, kernel):
    """out must be query's shape and dtype; otherwise ValueError / TypeError naming out."""
    batch = cpu_batch()
    with pytest.raises(ValueError, match="out"):
        launcher(impl, kernel)(**batch, out=torch.empty(3, 8, 64, dtype=torch.float16))
    with pytest.raises(TypeError, match="out"):
        launcher(impl, kernel)(**batch, out=torch.empty_like(batch["query"], dtype=torch.float32))


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", KERNELS)
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
@pytest.mark.parametrize("kernel", KERNELS)
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
@pytest.mark.parametrize("kernel", KERNELS)
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
