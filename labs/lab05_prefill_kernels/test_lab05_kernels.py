"""Lab 5, part C (GPU): the three prefill kernels against the float64 oracle.

Every batch is seeded, its cache poisoned (unused blocks and the tail of each partial last
block are NaN) and its physical blocks shuffled; outputs start as NaN. Tolerances are in
``_cases.py``. Without a GPU these tests skip with the reason, or run on the emulated device
with ``PAGEDLAB_DEVICE=emulate`` (shorter lengths that end at the same place in their tiles and
blocks: ``_cases.emulated_length``).
"""

from __future__ import annotations


import numpy as np
import pytest

from labs.lab05_prefill_kernels._cases import (KERNELS, check_close, launcher, make_batch,
                                               oracle, poison_allocator)
from labs.lab05_prefill_kernels._launch import TcTiling
from reference.emulate import TORCH_STREAM, emulating, recorded_streams
from reference.gpu import array_module, kernel_skip_reason, run_behind_busy_stream, synchronize
from reference.sanitizer import find_compute_sanitizer, racecheck_summary, run_racecheck

pytestmark = [pytest.mark.emulated,
              pytest.mark.skipif(kernel_skip_reason() is not None, reason=kernel_skip_reason() or "")]

# (id, dtype, query_lens, history_lens, num_q_heads, num_kv_heads, head_size, block_size, alibi, causal)
CASES = [
    ("f16-d128-bs16-gqa4", "float16", [1, 37, 300, 64, 129], [0, 0, 0, 0, 0], 8, 2, 128, 16, False, True),
    ("f16-d64-bs32-mha-history", "float16", [65, 1, 200, 17], [130, 257, 33, 0], 4, 4, 64, 32, False, True),
    ("bf16-d128-bs32-gqa8-history-alibi", "bfloat16", [113, 3, 250], [61, 400, 0], 8, 1, 128, 32, True, True),
    ("bf16-d64-bs16-gqa4-alibi", "bfloat16", [31, 290, 2, 77], [500, 9, 0, 63], 8, 2, 64, 16, True, True),
    ("f16-d128-bs16-gqa4-noncausal", "float16", [40, 131, 5], [20, 0, 77], 8, 2, 128, 16, False, False),
    ("f32-d128-bs16-gqa4-history", "float32", [70, 9, 130], [33, 200, 0], 8, 2, 128, 16, True, True),
    ("f32-d64-bs32-mha", "float32", [100, 1], [0, 64], 4, 4, 64, 32, False, True),
]


def _params():
    out = []
    for kernel in KERNELS:
        for case in CASES:
            if kernel == "tc" and case[1] == "float32":
                continue  # float32 is refused by the tensor-core kernel (a CPU test checks it)
            out.append(pytest.param(kernel, case, id=f"{kernel}-{case[0]}"))
    return out


def run_case(impl, kernel, seed, q_lens, hist, hq, hkv, d, bs, *, dtype="float16", alibi=False,
             causal=True, what=""):
    batch = make_batch(seed, q_lens, hist, hq, hkv, d, bs, dtype=dtype, alibi=alibi, kernel=kernel)
    ref = oracle(batch, causal=causal)
    poison_allocator(batch["query"].numel() * batch["query"].element_size())
    out = launcher(impl, kernel)(**batch, causal=causal)
    check_close(out, ref, batch, dtype=dtype, what=f"{kernel} kernel, {what}")
    return batch, out


@pytest.mark.points(12)
@pytest.mark.parametrize("kernel, case", _params())
def test_matches_oracle_on_random_varlen_batches(impl, kernel, case):
    """Varlen batches mixing fp16/bf16/fp32, head sizes 64 and 128, block sizes 16 and 32, GQA
    groups 1/4/8, ALiBi on and off, causal and not, with and without history, query lengths
    1..300 (rarely a multiple of the tile): every output matches the float64 oracle."""
    name, dtype, q_lens, hist, hq, hkv, d, bs, alibi, causal = case
    run_case(impl, kernel, 11, q_lens, hist, hq, hkv, d, bs, dtype=dtype, alibi=alibi,
             causal=causal, what=name)


@pytest.mark.points(6)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("block_size", [16, 32])
def test_chunked_prefill_with_history(impl, kernel, block_size):
    """Chunked prefill: each sequence's new tokens (1..300) sit after 0..700 tokens of history
    already in the cache, so query i is at position history + i and sees exactly the keys
    0 .. history + i — not one more, not one fewer."""
    rng = np.random.default_rng(23 + block_size)
    q_lens = rng.integers(1, 301, size=6).tolist()
    hist = rng.integers(0, 701, size=6).tolist()
    hist[0] = 0
    run_case(impl, kernel, 29, q_lens, hist, 8, 2, 128, block_size,
             what=f"query_lens {q_lens} over history {hist}")


@pytest.mark.points(4)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_gqa_group_reads_its_kv_head(impl, kernel, group):
    """With num_q_heads = group * num_kv_heads, query head h reads KV head h // group: every
    head of every group matches the oracle (a wrong mapping shows up as a bad head). A group of
    3 does not divide a tile's rows: a tile can start in the middle of a token's heads."""
    num_kv_heads = 2
    run_case(impl, kernel, 31 + group, [45, 160, 3], [70, 0, 33], group * num_kv_heads,
             num_kv_heads, 64, 16, what=f"group {group}")


def scores_far_from_zero(batch: dict, sign: int) -> dict:
    """The batch with every score near sign * 128 (head size 64): query sign * 16 everywhere,
    keys 1 + 0.05 * noise (the NaN poison kept)."""
    import torch

    return {**batch, "query": torch.full_like(batch["query"], 16.0 * sign),
            "key_cache": 1.0 + 0.05 * batch["key_cache"]}


def check_scores_far_from_zero(impl, kernel: str, sign: int) -> None:
    """Runs ``kernel`` on a batch whose every score is near sign * 128; checks it against the
    oracle (part C's test and the Hopper kernel's twin)."""
    batch = scores_far_from_zero(make_batch(47, [5, 70, 1], [0, 30, 9], 8, 2, 64, 16,
                                            kernel=kernel), sign)
    out = launcher(impl, kernel)(**batch)
    check_close(out, oracle(batch), batch, dtype="float16",
                what=f"{kernel} kernel, every score near {128 * sign} — likely cause: a running "
                     "max that starts at 0 (or no max at all)")


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("sign", [-1, 1], ids=["below", "above"])
def test_scores_far_from_zero(impl, kernel, sign):
    """Every score near -128, or near +128: a softmax is shift-invariant, so the output is the
    oracle's either way. The running max starts at -inf and is the scores' (not 0): else every
    exp underflows to 0 (far below) or overflows to inf (far above), and the output is 0 or NaN."""
    check_scores_far_from_zero(impl, kernel, sign)


@pytest.mark.points(2)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tc_runs_with_another_cta_shape(impl, dtype):
    """paged_prefill_tc honours tc_tiling: with TcTiling(8, 16) (8 warps of 16 rows, the other
    shape prefill_tc.cu compiles) every element matches the oracle, so the launch's block is
    32 * tc_tiling.warps threads and its kernel, plan and shared memory are that shape's."""
    batch = make_batch(43, [45, 160, 3], [70, 0, 33], 8, 2, 64, 16, dtype=dtype, kernel="tc")
    out = impl.paged_prefill_tc(**batch, tc_tiling=TcTiling(8, 16))
    check_close(out, oracle(batch), batch, dtype=dtype,
                what="tc kernel with tc_tiling=TcTiling(8, 16) (block 32 * tc_tiling.warps threads?)")


@pytest.mark.points(3)
@pytest.mark.parametrize("kernel", KERNELS)
def test_alibi_bias_matches_oracle(impl, kernel):
    """ALiBi adds slope[h] * (key_pos - query_pos), never positive under the causal mask: far
    keys are penalised, per query head, with history counted in the distance."""
    run_case(impl, kernel, 37, [96, 200, 1], [40, 0, 300], 8, 2, 128, 16, alibi=True,
             what="ALiBi")


@pytest.mark.points(4)
@pytest.mark.parametrize("kernel", KERNELS)
def test_partial_tiles_and_poisoned_padding(impl, kernel):
    """Query and context lengths that end mid-tile and mid-block (1, 63, 65, 127, 129 ...): the
    kernel must neither read the NaN-poisoned tail of a partial last block nor let rows past a
    sequence's end touch another sequence's output."""
    q_lens = [1, 63, 65, 127, 129, 2, 191]
    hist = [0, 1, 62, 3, 0, 125, 17]
    run_case(impl, kernel, 41, q_lens, hist, 8, 2, 128, 16, what="partial tiles")
    run_case(impl, kernel, 43, q_lens, hist, 8, 8, 64, 32, what="partial tiles, MHA")


@pytest.mark.points(3)
@pytest.mark.parametrize("kernel", KERNELS)
def test_every_output_element_is_written(impl, kernel):
    """Into a caller's NaN-filled out= buffer, every element is overwritten (and the buffer
    itself is returned); no output element is left to chance."""
    import torch

    batch = make_batch(47, [33, 1, 150], [0, 90, 7], 8, 2, 128, 32, kernel=kernel)
    out = torch.full_like(batch["query"], float("nan"))
    got = launcher(impl, kernel)(**batch, out=out)
    assert got is out, "with out= the launcher must write into it and return it"
    check_close(out, oracle(batch), batch, dtype="float16", what=f"{kernel} kernel, out=")


@pytest.mark.points(3)
@pytest.mark.parametrize("kernel", KERNELS)
def test_output_is_deterministic_across_runs(impl, kernel):
    """Five runs on a large batch give bit-identical outputs that match the oracle. Without
    split-K or atomics a correct kernel is deterministic; a changing result means a race
    (a missing barrier between writing a shared-memory tile and reading or overwriting it)."""
    import torch

    # NOTE: the emulator schedules threads in one fixed order, so repeated emulated runs can
    # only differ through state left from a previous run (the allocator): two runs of two
    # sequences prove that; the GPU keeps five runs of eight for its real races.
    num_seqs, num_runs = (2, 2) if emulating() else (8, 5)
    batch = make_batch(53, [300] * num_seqs, [400] * num_seqs, 8, 2, 128, 16, kernel=kernel)
    ref = oracle(batch)
    fn = launcher(impl, kernel)
    outs = []
    for run in range(num_runs):
        poison_allocator(batch["query"].numel() * 2)
        outs.append(fn(**batch))
    synchronize()
    for run, out in enumerate(outs):
        check_close(out, ref, batch, dtype="float16", what=f"{kernel} kernel, run {run}")
        diff = (out != outs[0]).sum().item()
        assert diff == 0, (f"run {run} differs from run 0 in {diff} elements: the kernel races "
                           f"(likely a missing __syncthreads() around a shared-memory tile)")


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", KERNELS)
def test_cupy_inputs_give_cupy_output(impl, kernel):
    """CuPy arrays work as well as torch tensors, the ALiBi slopes too, and the output comes back
    as a CuPy array. Emulated, NumPy arrays stand in for CuPy arrays
    (``reference.gpu.array_module``): the same contract, met through the given ``as_torch`` and
    ``like_input`` (a torch method called on the caller's array fails there)."""
    xp = array_module()
    batch = make_batch(59, [20, 70], [5, 0], 8, 2, 64, 16, alibi=True)
    as_xp = {k: (xp.from_dlpack(v) if hasattr(v, "data_ptr") else v) for k, v in batch.items()}
    out = launcher(impl, kernel)(**as_xp)
    synchronize()
    assert isinstance(out, xp.ndarray), (
        f"{xp.__name__} inputs gave a {type(out).__name__}: return like_input(out_t, query), "
        "which gives the result back as the caller's kind")
    check_close(out, oracle(batch), batch, dtype="float16", what=f"{kernel} kernel, {xp.__name__}")


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", KERNELS)
def test_launches_on_the_current_torch_stream(impl, kernel):
    """The kernel runs on torch's *current* stream: on a side stream that is still busy
    writing the query, it waits its turn instead of reading the query before it is ready.
    Emulated (launches are synchronous there), the launch must be *given* torch's current
    stream: it goes through ``reference.cuda.launch``, not a direct kernel call."""
    import torch

    batch = make_batch(61, [50, 7, 120], [0, 30, 9], 8, 2, 128, 16, kernel=kernel)
    ref = oracle(batch)
    if emulating():
        with recorded_streams() as launches:
            out = launcher(impl, kernel)(**batch)
        check_close(out, ref, batch, dtype="float16", what=f"{kernel} kernel (emulated)")
        wrong = [(name, stream) for name, stream in launches if stream != TORCH_STREAM]
        assert launches and not wrong, (
            f"{kernel} kernel: launches {wrong or 'none recorded'} were not given torch's "
            f"current stream; launch through reference.cuda.launch (it uses "
            f"torch.cuda.current_stream()) instead of calling the kernel object, which uses "
            f"CuPy's default stream")
        return
    plan = impl.plan_for_kernel(kernel, batch["cu_seqlens_q"], batch["context_lens"],
                                num_q_heads=8, num_kv_heads=2)
    fn = launcher(impl, kernel)
    real_query = batch["query"]
    query = torch.empty_like(real_query)
    out = run_behind_busy_stream(poison=lambda: query.fill_(float("nan")),
                                 write=lambda: query.copy_(real_query),
                                 launch=lambda: fn(**{**batch, "query": query}, plan=plan))
    check_close(out, ref, batch, dtype="float16",
                what=f"{kernel} kernel on a side stream (NaN here: it ran on another stream)")


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", KERNELS)
def test_empty_sequences_and_empty_batch(impl, kernel):
    """Sequences with no new tokens contribute nothing and disturb no neighbour; a batch with
    no query token at all returns an empty output without launching anything."""
    import torch

    run_case(impl, kernel, 67, [0, 12, 0, 0, 40, 0], [5, 3, 0, 17, 0, 9], 8, 2, 64, 16,
             what="empty sequences")
    batch = make_batch(71, [0, 0], [4, 0], 8, 2, 64, 16, kernel=kernel)
    out = launcher(impl, kernel)(**batch)
    assert tuple(out.shape) == (0, 8, 64)
    synchronize()


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", KERNELS)
def test_debug_mode_checks_block_ids_on_the_gpu(impl, kernel):
    """With debug=True the launcher reads the GPU block table back and refuses an id outside
    the cache with IndexError naming block_tables, instead of letting the kernel read it."""
    batch = make_batch(73, [10, 20], [30, 0], 8, 2, 64, 16, kernel=kernel)
    batch["block_tables"][0, 1] = 10_000
    with pytest.raises(IndexError, match="block_tables"):
        launcher(impl, kernel)(**batch, debug=True)


RACE_EXIT = 86  # compute-sanitizer's exit code when it reports an error

RACECHECK_SCRIPT = """
import torch
from labs.lab05_prefill_kernels._cases import launcher, make_batch
from reference.loader import load_impl
impl = load_impl("lab05_prefill_kernels")
batch = make_batch(79, [70, 5], [60, 100], 2, 1, 64, 16)
launcher(impl, "{kernel}")(**batch)
torch.cuda.synchronize()
print("KERNEL_DONE")
"""


@pytest.mark.points(2)
@pytest.mark.parametrize("kernel", ["naive", "tiled"])
def test_shared_memory_has_no_races_under_racecheck(impl, kernel):
    """Under compute-sanitizer's racecheck, a small batch (several KV tiles, partial tiles)
    shows no shared-memory hazard: what one thread writes to a tile, others read only after a
    __syncthreads(), and nobody overwrites a tile before everyone has read it. Unlike a timing
    test this is deterministic: a missing barrier is reported even when the race happens to
    give the right answer. Emulated, the emulator's racecheck runs the same batch."""
    if emulating():
        from reference.emulate import racecheck

        batch = make_batch(79, [70, 5], [60, 100], 2, 1, 64, 16)
        with racecheck() as report:
            launcher(impl, kernel)(**batch)
        assert report.launches > 0, f"the {kernel} kernel never launched under racecheck"
        if report.hazards:
            pytest.fail(
                f"the emulated racecheck found shared-memory hazards in the {kernel} kernel — a "
                "thread reads (or overwrites) shared memory another thread wrote with no "
                f"__syncthreads() in between:\n{report.summary()}")
        return
    tool = find_compute_sanitizer()
    if tool is None:
        pytest.skip("compute-sanitizer (CUDA toolkit) not found on PATH or under CUDA_HOME")
    # NOTE: the script runs the implementation: graded isolated, as the worker user.
    proc = run_racecheck(tool, RACECHECK_SCRIPT.format(kernel=kernel),
                         tool_args=("--print-limit", "5", "--error-exitcode", str(RACE_EXIT)),
                         timeout=170)
    out = proc.stdout + proc.stderr
    assert "KERNEL_DONE" in out, (f"the {kernel} kernel did not run to completion under "
                                  f"racecheck (exit {proc.returncode}):\n{out[-3000:]}")
    summary = racecheck_summary(out)
    assert summary is not None, (f"racecheck printed {out.count('RACECHECK SUMMARY')} summary "
                                 f"lines, expected exactly one:\n{out[-3000:]}")
    errors = summary[1]
    # NOTE: exit 0 too: a sanitizer killed (by the script, or for flooding its output) never
    # prints its own summary, so a lone summary line from a failed run is not trusted.
    assert errors == 0 and proc.returncode == 0, (
        f"racecheck (exit {proc.returncode}) found {errors} shared-memory hazard(s) in the "
        f"{kernel} kernel — a thread "
        f"reads (or overwrites) shared memory another thread wrote with no __syncthreads() in "
        f"between:\n{out[:3000]}")
