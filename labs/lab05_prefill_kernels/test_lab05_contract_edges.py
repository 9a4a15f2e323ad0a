"""Lab 5, the contract's edges: every argument the docstring describes is checked as described
(each dtype, each 16-byte boundary, ``out`` in full, the scale as float32), in the order the
TODOs give, with the first bad entry named; the checks read no values; an empty batch is still
validated; and a launcher's plan replays what the one call computes.

The tests before the last two use CPU tensors and need no GPU. The last two run kernels (on a
GPU, or emulated with ``PAGEDLAB_DEVICE=emulate``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from labs.lab05_prefill_kernels._cases import (KERNELS, check_close, fill_array_out, launcher,
                                               make_batch, oracle)
from labs.lab05_prefill_kernels.test_lab05_validation import (LAUNCHERS, assert_plan_error_says,
                                                          cpu_batch)
from reference.errors import UnsupportedConfigError
from reference.expect import raises_naming
from reference.gpu import kernel_skip_reason, synchronize
from reference.grader.proxy import given


def _check(impl, changes: dict, error, name: str, what: str, kernel: str = "tiled", **kw):
    batch = cpu_batch(**kw)
    batch.update(changes)
    raises_naming(lambda: impl.check_prefill_inputs(**batch, kernel=kernel), error, name, what,
                  accepted_hint=": check_prefill_inputs let it through")


def _misaligned(x: torch.Tensor, elements: int = 1) -> torch.Tensor:
    """``x``'s values in a view starting ``elements`` elements past a 16-byte boundary."""
    flat = torch.empty(x.numel() + elements, dtype=x.dtype)
    view = flat[elements:].view(x.shape)
    view.copy_(x)
    return view


@pytest.mark.points(1)
def test_value_cache_must_have_key_caches_shape_in_every_dimension(impl):
    """value_cache must have key_cache's shape, head size included: a value head of 32 beside
    key heads of 64 raises ValueError naming value_cache (the kernel would read V rows 64 wide)."""
    b = cpu_batch()
    _check(impl, {"value_cache": b["value_cache"][..., :32].clone()}, ValueError, "value_cache",
           "value_cache with head size 32, key_cache and query 64")


@pytest.mark.points(1)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_alibi_slopes_must_be_float32(impl, dtype):
    """alibi_slopes is [num_q_heads] float32: any other float dtype raises TypeError naming
    alibi_slopes (the kernels read 4-byte floats)."""
    b = cpu_batch(alibi=True)
    _check(impl, {"alibi_slopes": b["alibi_slopes"].to(dtype)}, TypeError, "alibi_slopes",
           f"{dtype} alibi_slopes", alibi=True)


@pytest.mark.points(1)
@pytest.mark.parametrize("mistake", ["one per KV head", "not contiguous", "a list"])
def test_alibi_slopes_are_checked_like_every_array(impl, mistake):
    """alibi_slopes goes through check_array like every other argument, with shape
    [num_q_heads]: one slope per KV head, a strided view or a Python list is refused (ValueError,
    ValueError, TypeError), naming alibi_slopes."""
    slopes, error = {"one per KV head": (torch.ones(2), ValueError),
                     "not contiguous": (torch.ones(16)[::2], ValueError),
                     "a list": ([0.5] * 8, TypeError)}[mistake]
    _check(impl, {"alibi_slopes": slopes}, error, "alibi_slopes", f"alibi_slopes {mistake}",
           alibi=True)


@pytest.mark.points(1)
@pytest.mark.parametrize("mistake", ["same size, other shape", "not contiguous", "a list"])
def test_out_is_checked_in_full(impl, mistake):
    """out is a torch tensor or CuPy array of query's exact shape (not merely as many elements),
    contiguous: otherwise ValueError naming out, or TypeError naming out for a list (checked
    before its address is read)."""
    q = cpu_batch()["query"]
    t, h, d = q.shape
    out, error = {"same size, other shape": (torch.empty(t, d, h, dtype=q.dtype), ValueError),
                  "not contiguous": (torch.empty(h, t, d, dtype=q.dtype).transpose(0, 1),
                                     ValueError),
                  "a list": ([0.0], TypeError)}[mistake]
    _check(impl, {"out": out}, error, "out", f"out {mistake}")


@pytest.mark.points(1)
@pytest.mark.parametrize("name, elements", [("out", 1), ("value_cache", 1), ("query", 4),
                                            ("key_cache", 4)])
def test_every_input_is_checked_for_16_byte_alignment(impl, name, elements):
    """query, key_cache, value_cache and out each must start on a 16-byte boundary: 2 or 8 bytes
    past one raises ValueError naming the argument (data_ptr % 16, not % 8)."""
    b = cpu_batch()
    x = b[name] if name != "out" else torch.empty_like(b["query"])
    _check(impl, {name: _misaligned(x, elements)}, ValueError, name,
           f"{name} {2 * elements} bytes past a 16-byte boundary")


@pytest.mark.points(1)
@pytest.mark.parametrize("scale, becomes", [(1e39, "inf"), (1e-50, "0")])
def test_scale_is_checked_as_the_float32_the_kernels_take(impl, scale, becomes):
    """The scale is checked as float32 (check_scale(scale, dtype=np.float32)): a finite double
    that becomes inf or 0 in float32 raises ValueError naming scale."""
    _check(impl, {"scale": scale}, ValueError, "scale", f"scale={scale} ({becomes} in float32)")


@pytest.mark.points(1)
def test_check_prefill_inputs_reads_no_metadata_values(impl):
    """check_prefill_inputs reads no values (but the ALiBi slopes): lengths that disagree with
    the query, negative context lengths and block ids out of range are the plan's and the
    launcher's to refuse, so check_prefill_inputs returns the batch's sizes for them."""
    b = cpu_batch()
    b["cu_seqlens_q"] = b["cu_seqlens_q"].clone()
    b["cu_seqlens_q"][-1] += 5
    b["context_lens"] = -b["context_lens"]
    b["block_tables"] = b["block_tables"] + 10_000
    try:
        shapes = impl.check_prefill_inputs(**b, kernel="tiled")
    except (TypeError, ValueError, IndexError) as exc:
        pytest.fail(f"check_prefill_inputs refused a batch whose shapes are right: {exc!r}. It "
                    "checks structure only; values are plan_query_tiles' (and the launcher's "
                    "block-id check's) to refuse")
    assert shapes is not None, "check_prefill_inputs returns the batch's sizes"


@pytest.mark.points(1)
def test_an_unknown_kernel_is_a_value_error(impl):
    """kernel must be one of KERNEL_DTYPES: any other name raises ValueError naming kernel (not a
    KeyError from the dtype table)."""
    _check(impl, {}, ValueError, "kernel", "kernel='fast'", kernel="fast")


@pytest.mark.points(1)
@pytest.mark.parametrize("name", ["cu_seqlens_q", "context_lens"])
def test_metadata_arrays_must_be_int32(impl, name):
    """cu_seqlens_q and context_lens are int32 (the kernels read 4-byte ints): int64 raises
    TypeError naming the array."""
    b = cpu_batch()
    _check(impl, {name: b[name].long()}, TypeError, name, f"int64 {name}")


@pytest.mark.points(1)
@pytest.mark.parametrize("block_size", [4, 256])
def test_block_sizes_outside_8_to_128_are_unsupported(impl, block_size):
    """Block sizes are powers of two from 8 to 128: 4 and 256 raise UnsupportedConfigError
    naming block_size."""
    _check(impl, {}, UnsupportedConfigError, "block_size", f"block_size={block_size}",
           block_size=block_size)


@pytest.mark.points(1)
def test_checks_run_in_the_order_of_the_todo(impl):
    """Checks run in the TODO's order: the kernel name before any array (kernel='fast' with a
    list for query: ValueError naming kernel); a float32 query with float16 caches is a dtype
    mismatch (TypeError naming key_cache) before it is a dtype the tensor-core kernel lacks;
    head sizes that disagree (ValueError naming head_size) before an unsupported one; an
    unsupported head size (UnsupportedConfigError) before a bad scale; the scale before the
    ALiBi slopes."""
    b = cpu_batch()
    _check(impl, {"query": b["query"].float()}, TypeError, "key_cache",
           "tc: a float32 query with float16 caches", kernel="tc")
    _check(impl, {"scale": "x"}, UnsupportedConfigError, "head_size",
           "head_size=96 and scale='x'", head_size=96)
    _check(impl, {"query": b["query"].tolist()}, ValueError, "kernel",
           "kernel='fast' and a list for query", kernel="fast")
    _check(impl, {"scale": 0.0, "alibi_slopes": torch.ones(8, dtype=torch.float16)}, ValueError,
           "scale", "scale=0.0 and float16 alibi_slopes")
    q32 = b["query"][..., :32].clone()  # head size 32 beside caches of 64
    try:
        impl.check_prefill_inputs(**{**b, "query": q32}, kernel="tiled")
    except UnsupportedConfigError as exc:
        pytest.fail(f"a query of head size 32 beside caches of 64 raised {exc!r}: that the head "
                    "sizes agree is checked before whether the size is supported (ValueError "
                    "naming head_size, not UnsupportedConfigError)")
    except ValueError as exc:
        assert "head_size" in str(exc), f"the disagreement's message must say head_size: {exc}"
    else:
        pytest.fail("check_prefill_inputs accepted a query of head size 32 beside caches of 64")


@pytest.mark.points(1)
@pytest.mark.parametrize("kw, error, name", [(dict(block_m=0), ValueError, "block_m"),
                                             (dict(block_n="64"), TypeError, "block_n")])
def test_plan_checks_tile_sizes_before_the_metadata(impl, kw, error, name):
    """plan_query_tiles checks rows_per_token, block_m and block_n first: with bad metadata too
    (cu_seqlens_q decreasing), the error is the tile size's."""
    cu, ctx = np.asarray([0, 5, 3], np.int32), np.asarray([9, 9], np.int32)
    raises_naming(lambda: impl.plan_query_tiles(cu, ctx, **kw), error, name,
                  f"{kw} with a decreasing cu_seqlens_q")


@pytest.mark.points(1)
@pytest.mark.parametrize("cu, ctx, message", [
    ([1, 0, 5], [9, 9], "cu_seqlens_q[0] must be 0, got 1"),
    ([1, 5, 9, 12, 13], [9, 9, 9], "so it needs 4"),
    ([0, 4, 14], [3, 2], "context_lens[0]=3"),
    ([0, 5, 4, 9, 1], [9, 9, 9, 9], "cu_seqlens_q[1]=5 > cu_seqlens_q[2]=4"),
])
def test_plan_names_the_first_mistake_when_there_are_several(impl, cu, ctx, message):
    """With several mistakes the plan reports the first in the TODO's order (length, then
    cu_seqlens_q[0], then a decrease, then a short context) and, within one kind, the first
    bad sequence — not the largest drop or the largest shortfall."""
    assert_plan_error_says(impl, cu, ctx, message, "check in the TODO's order; the first bad "
                           "index is np.argmax of the condition")


@pytest.mark.points(1)
def test_a_context_shorter_than_the_query_is_refused_without_causal_too(impl):
    """context_lens >= the query length holds whatever the masking: with causal=False a context
    of 3 keys for 5 query tokens still raises ValueError naming context_lens[0]."""
    with pytest.raises(ValueError) as info:
        impl.plan_query_tiles(np.asarray([0, 5], np.int32), np.asarray([3], np.int32),
                              causal=False)
    assert "context_lens[0]" in str(info.value), (
        f"said {str(info.value)!r}; it should name context_lens[0] (the check does not depend "
        "on causal)")


@pytest.mark.points(1)
def test_plan_arrays_have_their_documented_dtypes(impl):
    """TilePlan's arrays have the dtypes its docstring gives: work and num_kv_tiles int32 (the
    kernels read them), cu_seqlens_q and context_lens the int64 host copies."""
    plan = impl.plan_query_tiles(np.asarray([0, 3, 8], np.int32), np.asarray([10, 20], np.int32))
    got = {n: getattr(plan, n).dtype for n in ("work", "num_kv_tiles", "cu_seqlens_q",
                                               "context_lens")}
    want = {"work": np.int32, "num_kv_tiles": np.int32, "cu_seqlens_q": np.int64,
            "context_lens": np.int64}
    assert got == {n: np.dtype(d) for n, d in want.items()}, f"dtypes {got}, expected {want}"


@pytest.mark.points(1)
def test_plan_refuses_float_metadata(impl):
    """Metadata is read to the host with host_ints, which refuses a float array with ValueError
    naming it (an astype would silently cut 2.5 to 2)."""
    raises_naming(lambda: impl.plan_query_tiles(np.asarray([0.0, 2.5, 5.0]),
                                                np.asarray([9, 9], np.int32)),
                  ValueError, "cu_seqlens_q", "cu_seqlens_q [0.0, 2.5, 5.0]")


@pytest.mark.points(1)
@pytest.mark.parametrize("kernel", LAUNCHERS)
def test_an_empty_batch_is_still_validated(impl, kernel):
    """A batch with no query tokens is validated like any other: a float32 value_cache beside
    float16 keys raises TypeError naming value_cache, before anything else happens."""
    batch = cpu_batch(query_lens=[0, 0, 0])
    batch["value_cache"] = batch["value_cache"].float()
    raises_naming(lambda: launcher(impl, kernel)(**batch), TypeError, "value_cache",
                  f"{kernel}: a 0-token batch with a float32 value_cache",
                  accepted_hint=" (a 0-token batch returned before the checks?)")


# ----------------------------------------------------------------------------- with kernels
needs_device = pytest.mark.skipif(kernel_skip_reason() is not None,
                                  reason=kernel_skip_reason() or "")
PLAN_INPUTS = ("query", "key_cache", "value_cache", "block_tables", "cu_seqlens_q",
               "context_lens")


@needs_device
@pytest.mark.emulated
@pytest.mark.points(1)
@pytest.mark.parametrize("kernel", ["tiled", "tc"])
def test_plan_prefill_replays_the_one_call(impl, kernel):
    """plan_prefill works on your launcher (it launches through launch(...) with ptr(<the
    input>), no copies, ALiBi slopes included) and its run gives the one-call output bit for
    bit, into a NaN out=, on a batch with other values (and slopes) at other addresses."""
    a = make_batch(83, [40, 3, 70], [9, 30, 0], 8, 2, 64, 16, kernel=kernel, alibi=True)
    b = {**a, "query": a["query"] * 0.5, "key_cache": -a["key_cache"],
         "value_cache": a["value_cache"] * 2, "alibi_slopes": a["alibi_slopes"] * 0.5}
    plan = impl.plan_prefill(*(a[n] for n in PLAN_INPUTS), a["scale"], kernel=kernel,
                             alibi_slopes=a["alibi_slopes"])
    got = plan.run(*(b[n] for n in PLAN_INPUTS), out=torch.full_like(b["query"], float("nan")),
                   alibi_slopes=b["alibi_slopes"])
    want = launcher(impl, kernel)(**b)
    synchronize()
    diff = int((got != want).sum())
    assert diff == 0, (f"{kernel}: plan.run differs from the one-call launch in {diff} elements "
                       "(does the launcher copy an input, or work in torch after the launch?)")


@needs_device
@pytest.mark.emulated
@pytest.mark.points(1)
@pytest.mark.parametrize("kernel", KERNELS)
def test_cupy_out_is_returned_itself(impl, kernel):
    """Given out=, a launcher returns that very object, for CuPy arrays as for torch tensors
    (emulated: NumPy arrays stand in for CuPy's)."""
    batch = make_batch(59, [20, 7], [5, 0], 8, 2, 64, 16, kernel=kernel)
    is_out, out = given(impl, fill_array_out)(kernel, batch)
    assert is_out, (f"{kernel}: given a CuPy (emulated: NumPy) out=, the launcher returned "
                    "another array: return out when one was given")
    check_close(out, oracle(batch), batch, dtype="float16", what=f"{kernel} into an array out=")
