"""Lab 5, part D (Hopper GPU or the emulated device): the wgmma kernel (Task 5.6) against the float64 oracle, and its
refusal on other GPUs.

The kernel tests run on a Hopper GPU (compute capability 9.0: H100, H200) and on the emulated
device (``PAGEDLAB_DEVICE=emulate``), which models wgmma, TMA, mbarriers and named barriers;
on any other GPU they skip with the reason, and the launcher must refuse there with
``ComputeCapabilityError`` (an ``UnsupportedConfigError``) naming sm_90a. Batches, poisoning
and tolerances are Part C's (``_cases.py``; lengths shrunk on the emulated device).
"""

from __future__ import annotations

import numpy as np
import pytest

from labs.lab05_prefill_kernels._cases import check_close, launcher, make_batch, oracle
from labs.lab05_prefill_kernels.test_lab05_kernels import (CASES, check_scores_far_from_zero,
                                                            run_case)
from reference.emulate import emulating
from reference.errors import UnsupportedConfigError
from reference.gpu import kernel_skip_reason, synchronize


def hopper_skip_reason() -> str | None:
    """Why the wgmma kernel cannot run here, or None on a Hopper GPU or the emulated device."""
    if emulating():
        return None
    reason = kernel_skip_reason()
    if reason:
        return reason
    from reference.cuda import device_capability

    major, minor = device_capability()
    if (major, minor) != (9, 0):
        return (f"Task 5.6 needs a Hopper GPU (compute capability 9.0); this GPU is {major}.{minor}: "
                "run with PAGEDLAB_DEVICE=emulate to test it on the CPU")
    return None


HOPPER_SKIP = hopper_skip_reason()
#: Part C's 16-bit batches, and what only the Hopper kernel's 128-row tile, 128-key KV tiles and
#: TMA boxes can get wrong: GQA groups that do not divide 128 (5, 7; 40 query heads over 8 KV
#: heads is a real model), block sizes 8 (16 boxes a tile), 32, 64 and 128 (one box a tile),
#: each of 8, 16, 32, 64 and 128 at head size 128 (K's and V's whole-row boxes of one to 16
#: 8-row groups, where Q's and K's descriptors need different strides),
#: contexts that end on and off a page and a tile boundary, non-causal with bf16, and a batch
#: of far more work items than a GPU has SMs (the persistent CTAs' loop).
HOPPER_CASES = [c for c in CASES if c[1] != "float32"] + [
    ("f16-d128-bs32-gqa5-history", "float16", [70, 250, 3, 191], [300, 0, 129, 5], 10, 2, 128, 32, False, True),
    ("bf16-d128-bs128-gqa4-history", "bfloat16", [130, 1, 255], [128, 383, 1], 8, 2, 128, 128, False, True),
    ("bf16-d64-bs64-gqa7-alibi", "bfloat16", [97, 40], [64, 200], 14, 2, 64, 64, True, True),
    ("f16-d64-bs8-gqa6-noncausal", "float16", [33, 120], [10, 0], 12, 2, 64, 8, False, False),
    ("f16-d128-bs8-gqa4-history", "float16", [90, 17, 200], [40, 300, 0], 8, 2, 128, 8, False, True),
    ("bf16-d128-bs64-gqa2-history", "bfloat16", [150, 64, 3], [70, 0, 500], 4, 2, 128, 64, False, True),
    ("bf16-d128-bs16-gqa4-noncausal-alibi", "bfloat16", [150, 7], [0, 90], 8, 2, 128, 16, True, False),
    # 426 work items: every persistent CTA takes several, both Q buffers turn over, and the
    # K/V rings run on from one item into the next.
    ("f16-d128-bs16-gqa4-many-items", "float16", [(37 * i) % 250 + 1 for i in range(48)],
     [(53 * i) % 400 for i in range(48)], 8, 2, 128, 16, False, True),
    # 600 items of one KV tile each (prompts of at most 32 tokens over short histories): a CTA
    # runs through its items faster than through any K/V ring, so only q_empty stops the
    # producer from writing an item's Q into the buffer the item before last still reads
    # (a race that never showed on an H100 without that wait: the handout's NOTE).
    ("f16-d64-bs16-gqa4-one-tile-items", "float16", [(7 * i) % 32 + 1 for i in range(150)],
     [(11 * i) % 61 for i in range(150)], 16, 4, 64, 16, False, True),
]
needs_hopper = pytest.mark.skipif(HOPPER_SKIP is not None, reason=HOPPER_SKIP or "")
KERNEL = "wgmma"
#: The batch tensors plan_prefill and plan.run take, in their order.
PLAN_INPUTS = ("query", "key_cache", "value_cache", "block_tables", "cu_seqlens_q",
               "context_lens")


@needs_hopper
@pytest.mark.emulated
@pytest.mark.points(4)
@pytest.mark.parametrize("case", HOPPER_CASES, ids=lambda c: c[0])
def test_hopper_matches_oracle_on_random_varlen_batches(impl, case):
    """Part C's varlen batches in fp16 and bf16 and nine more (head sizes 64 and 128, block
    sizes 8 to 128 at head size 128 and 8 to 64 at 64, GQA groups 1 to 8 including 5 and 7, ALiBi, causal or not, with history):
    every output matches the float64 oracle — the wgmma descriptors, the TMA boxes and the
    swizzled tiles, the pipelined softmax, contexts whose last page is partial (its keys come
    by cp.async), row tiles that split a token's heads, and persistent CTAs that take many
    items one after another (long ones, and short ones of a single KV tile: the two Q buffers
    change hands through their barriers)."""
    name, dtype, q_lens, hist, hq, hkv, d, bs, alibi, causal = case
    run_case(impl, KERNEL, 11, q_lens, hist, hq, hkv, d, bs, dtype=dtype, alibi=alibi,
             causal=causal, what=name)


@needs_hopper
@pytest.mark.emulated
@pytest.mark.points(3)
@pytest.mark.parametrize("block_size", [16, 32])
def test_hopper_chunked_prefill_with_history(impl, block_size):
    """Chunked prefill: new tokens (1..300) after 0..700 tokens of history, GQA 4: query i sees
    exactly the keys 0 .. history + i, across many 128-key tiles (so the pipelined P V of the
    previous tile, the rescale of O and the reuse of both stages are exercised)."""
    rng = np.random.default_rng(83 + block_size)
    q_lens = rng.integers(1, 301, size=6).tolist()
    hist = rng.integers(0, 701, size=6).tolist()
    hist[0] = 0
    run_case(impl, KERNEL, 89, q_lens, hist, 8, 2, 128, block_size,
             what=f"query_lens {q_lens} over history {hist}")


@needs_hopper
@pytest.mark.emulated
@pytest.mark.points(1)
@pytest.mark.parametrize("sign", [-1, 1], ids=["below", "above"])
def test_hopper_scores_far_from_zero(impl, sign):
    """Part C's test_scores_far_from_zero through the wgmma kernel: every score near -128 or
    +128 gives the oracle's output (the running max starts at -inf, not 0)."""
    check_scores_far_from_zero(impl, KERNEL, sign)


@needs_hopper
@pytest.mark.emulated
@pytest.mark.points(2)
def test_hopper_partial_row_tiles_and_poisoned_padding(impl):
    """Lengths that end mid-tile of the 128-row CTA (32 tokens of a GQA-4 group), mid-block and
    mid-KV-tile (the context's last keys come by cp.async, not TMA): no NaN-poisoned key is
    read, and rows past a sequence never touch the next one's output; a batch with no query
    token at all returns an empty output (nothing to launch)."""
    q_lens = [1, 31, 32, 33, 64, 65, 127, 3]
    hist = [0, 5, 64, 63, 0, 129, 1, 300]
    run_case(impl, KERNEL, 97, q_lens, hist, 8, 2, 128, 16, what="partial row tiles")
    run_case(impl, KERNEL, 101, q_lens, hist, 4, 4, 64, 32, what="partial row tiles, MHA")
    empty = make_batch(113, [0, 0], [4, 0], 8, 2, 64, 16, kernel=KERNEL)
    out = launcher(impl, KERNEL)(**empty)
    synchronize()
    assert tuple(out.shape) == (0, 8, 64), "a batch with no query token gives an empty output"


@needs_hopper
@pytest.mark.emulated
@pytest.mark.points(2)
def test_hopper_output_is_complete_and_deterministic(impl):
    """Into a NaN-filled out= buffer every element is written (and the buffer returned); five
    runs on a large batch are bit-identical. A changing result means a race: a stage refilled
    while a warpgroup's asynchronous wgmma still reads it, or a missing fence before one."""
    import torch

    batch = make_batch(103, [300] * 8, [400] * 8, 8, 2, 128, 16, kernel=KERNEL)
    ref = oracle(batch)
    outs = []
    for _ in range(5):
        out = torch.full_like(batch["query"], float("nan"))
        assert launcher(impl, KERNEL)(**batch, out=out) is out, (
            "with out= the launcher must write into it and return it")
        outs.append(out)
    synchronize()
    for run, out in enumerate(outs):
        check_close(out, ref, batch, dtype="float16", what=f"wgmma kernel, run {run}")
        diff = (out != outs[0]).sum().item()
        assert diff == 0, (f"run {run} differs from run 0 in {diff} elements: the kernel races "
                           "(a stage refilled too early, or a missing wgmma_wait / fence)")


@needs_hopper
@pytest.mark.emulated
@pytest.mark.points(1)
def test_hopper_plan_run_follows_new_caches(impl):
    """A plan made on one batch and run on another of the same shape (new caches, query and
    block tables) computes the new batch: the TMA maps name a cache's address, so a run must
    use maps of the run's caches, not the plan's (launch with tensor_map(<the input cache>));
    and the run gives the one-call output bit for bit, run after run (four runs, the last three
    into a NaN-poisoned out=). The batch has more work items than a GPU has SMs, so the CTAs
    take items from the work counter, which every run must find at zero again (the kernel's
    last CTA resets it)."""
    import torch

    a = make_batch(127, [40, 200] + [150] * 24, [100, 0] + [50] * 24, 8, 2, 128, 16,
                   kernel=KERNEL)
    # New tensors (new addresses) with other values; the poisoned padding stays poisoned.
    b = {**a, "query": a["query"] * 0.5, "key_cache": -a["key_cache"],
         "value_cache": a["value_cache"] * 2}
    plan = impl.plan_prefill(*(a[n] for n in PLAN_INPUTS), a["scale"], kernel=KERNEL)
    out = plan.run(*(b[n] for n in PLAN_INPUTS))
    one_call = launcher(impl, KERNEL)(**b)
    synchronize()
    check_close(out, oracle(b), b, dtype="float16", what="plan made on batch a, run on batch b")
    diff = (out != one_call).sum().item()
    assert diff == 0, f"plan.run differs from the one-call launch in {diff} elements"
    want_a = launcher(impl, KERNEL)(**a)
    for run in (2, 3, 4):  # (a counter left half-reset shows only from the third run on)
        # NOTE: into a NaN out=: a fresh output could reuse the last run's memory, whose right
        # values would hide items a run skipped.
        poisoned = torch.full_like(want_a, float("nan"))
        got = plan.run(*(a[n] for n in PLAN_INPUTS), out=poisoned)
        assert torch.equal(got, want_a), (
            f"run {run} of the plan, on its own batch, must give the one-call output (did the "
            "last launch leave the work counter — both of its ints — at zero?)")


@needs_hopper
@pytest.mark.emulated
@pytest.mark.points(1)
def test_hopper_launch_is_persistent(impl):
    """The launch is the one the handout specifies: a single kernel launch with grid
    (min(num_items, num_sms),) — at most one CTA per SM, each looping over its items —, block
    (WGMMA_THREADS,) and shared memory wgmma_shared_bytes(head_size), for a batch with more
    items than SMs and for one with fewer. (One CTA per item computes the same outputs, but
    pays a CTA's start-up per item and never runs the persistent loop.)"""
    from labs.lab05_prefill_kernels._launch import WGMMA_THREADS, wgmma_shared_bytes
    from reference.cuda import num_sms

    for q_lens, d in (([300] * 40, 128), ([50, 7], 64)):
        batch = make_batch(131, q_lens, [100] * len(q_lens), 8, 2, d, 16, kernel=KERNEL)
        plan = impl.plan_prefill(*(batch[n] for n in PLAN_INPUTS), batch["scale"], kernel=KERNEL)
        num_items = len(plan.tile_plan.work) * 2
        sms = num_sms(batch["query"].device)
        want = ((min(num_items, sms),), (WGMMA_THREADS,), wgmma_shared_bytes(d))
        assert len(plan.launches) == 1, f"one kernel launch per call, got {len(plan.launches)}"
        got = (tuple(plan.launches[0].grid), tuple(plan.launches[0].block),
               plan.launches[0].shared_mem)
        assert got == want, (
            f"{num_items} work items on {sms} SMs, head size {d}: launched (grid, block, "
            f"shared memory) {got}, expected {want} — the grid is min(num_items, num_sms): "
            "persistent CTAs, not one per item")


@pytest.mark.emulated
@pytest.mark.points(1)
@pytest.mark.skipif(not emulating() and (HOPPER_SKIP is None or kernel_skip_reason() is not None),
                    reason="on a Hopper GPU the kernel runs (or no device to refuse on)")
def test_wgmma_refuses_off_hopper(impl):
    """On a GPU that is not Hopper the launcher refuses with UnsupportedConfigError naming
    sm_90a — after validating its inputs, and before any kernel is compiled or launched — even
    for a batch with no query token. Emulated, the device reports compute capability 8.0 for
    this test (reference.emulate.emulated_capability)."""
    import contextlib

    from reference import emulate

    as_other_gpu = emulate.emulated_capability(8, 0) if emulating() else contextlib.nullcontext()
    batch = make_batch(107, [5, 9], [0, 3], 4, 2, 64, 16)
    empty = make_batch(109, [0, 0], [4, 0], 4, 2, 64, 16)
    with as_other_gpu:
        with pytest.raises(UnsupportedConfigError, match="sm_90a"):
            launcher(impl, KERNEL)(**batch)
        with pytest.raises(UnsupportedConfigError, match="sm_90a"):
            launcher(impl, KERNEL)(**empty)
