"""Speed grading: the timing process. It runs the student's CUDA, never their Python.

``python -m reference.grader.speed_replay JOB RESULT`` (started by
:func:`reference.grader.speed.run_replay_child`, one fresh process per stage: a crash or a hang
costs that stage only) compiles the checked recording's ``.cu`` files itself and replays its
launches on its own inputs — a warm-up, then :data:`PASSES` passes of :data:`NUM_SETS` launches,
each launch on K/V pools of its own, a random query and block table and a NaN-filled output,
the pools refilled after each warm-up — times each pass with CUDA events, compares every output
vector with a float64 oracle computed before the launches ran, and writes the result as JSON.

NOTE: a kernel can read and write its process's device memory. The oracle zeroes every device
buffer that held an answer or a step toward one before freeing it, its results are compared in
host memory, and times come from CUDA events. Where HMM lets kernels read host memory (the
open kernel module), a kernel that found the oracle's host address could read it (the README's
threat model).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

#: Timed passes (the median is scored) and launches per pass (each with its own inputs).
PASSES = 3
NUM_SETS = 8
#: Largest relative error of an output vector (one row's one query head) against the float64
#: oracle. NOTE: honest fp16 kernels (fp32 accumulation, P rounded to fp16 for the tensor
#: cores) land near 4e-4; a kernel that skips 0.1 % of the keys, or the V rows of the keys
#: whose weights are below half the mean (2-3 % of them), lands at 1.6e-2 or more (measured
#: on unit-variance inputs, 2,048-32,768 keys). An absolute limit would not do: outputs of
#: thousands of keys are means of ~0.03.
REL_TOLERANCE = 5e-3


def _pool_inputs(spec: dict, num_sets: int):
    """K/V pools, one pair per launch of a pass, and the batch's shared int inputs.

    NOTE: a pair per launch, not one shared pool: a kernel that derived something from the
    cache in one launch (a compressed copy, say) and reused it in the next would have its
    work done outside the time; with its own pool, each timed launch reads memory no earlier
    launch of the pass read, and every pass refills them all.
    """
    import torch

    from reference.grader.speed_record import blocks_needed

    bs, hkv, d = spec["block_size"], spec["num_kv_heads"], spec["head_size"]
    lens = np.asarray(spec["context_lens"], dtype=np.int64)
    needed = blocks_needed(spec)
    shape = (needed + 1, hkv, bs, d)
    pools = [tuple(torch.empty(shape, dtype=torch.float16, device="cuda") for _ in range(2))
             for _ in range(num_sets)]
    shared = {"context_lens": torch.tensor(lens, dtype=torch.int32, device="cuda")}
    if spec["kind"] == "prefill":
        cu = np.concatenate([[0], np.cumsum(spec["query_lens"])])
        shared["cu_seqlens_q"] = torch.tensor(cu, dtype=torch.int32, device="cuda")
    return pools, shared, needed


def _new_set(spec: dict, num_pool_blocks: int, needed: int, gen) -> dict:
    """One launch's own inputs: a random query, a random block table into the pools, out."""
    import torch

    from reference.grader.speed_record import block_table

    chosen = torch.randperm(num_pool_blocks, generator=gen)[:needed].to(torch.int32).numpy()
    table = torch.from_numpy(block_table(spec, chosen))
    rows = (len(spec["context_lens"]) if spec["kind"] == "decode"
            else int(sum(spec["query_lens"])))
    q = torch.randn((rows, spec["num_q_heads"], spec["head_size"]), generator=gen)
    return {"query": q.to(torch.float16).cuda(), "block_tables": table.cuda(),
            "out": torch.empty((rows, spec["num_q_heads"], spec["head_size"]),
                               dtype=torch.float16, device="cuda")}


def oracle(spec: dict, inputs: dict, device: str = "cuda"):
    """The float64 attention of one launch's inputs, computed on the GPU, returned on the host.

    NOTE: every buffer that holds an answer or a step toward one (scores, probabilities, the
    output) is written in place and zeroed before it is freed: freed memory stays mapped in
    torch's cache, and a kernel of this process could find and copy what it held. What is left
    behind is inputs (gathered pages, their fp64 copies) and cuBLAS's workspace.

    Decode: one query token per sequence attends to its whole context; prefill: each new
    token attends causally to the history and the new tokens up to itself.

    Args:
        spec: the workload (lengths, heads, scale).
        inputs: ``query`` [num_rows, num_q_heads, head_size] (a row per sequence for decode,
            per new token for prefill), ``key_cache`` / ``value_cache`` [num_blocks,
            num_kv_heads, block_size, head_size], ``block_tables`` [num_seqs,
            max_blocks_per_seq].
        device: where the inputs are and the arithmetic runs.

    Returns:
        [num_rows, num_q_heads, head_size] float64 (a CPU tensor).
    """
    import torch

    q, kc, vc = inputs["query"], inputs["key_cache"], inputs["value_cache"]
    table, scale, bs = inputs["block_tables"], spec["scale"], spec["block_size"]
    hq, hkv = spec["num_q_heads"], spec["num_kv_heads"]
    group, d = hq // hkv, spec["head_size"]
    out = torch.empty(q.shape, dtype=torch.float64, device=device)
    q_start = 0
    for s, ctx in enumerate(spec["context_lens"]):
        blocks = table[s, :-(-ctx // bs)].long()

        def gather(cache):  # [Hkv, ctx, D] float64: inputs only
            return cache[blocks].double().permute(1, 0, 2, 3).reshape(hkv, -1, d)[:, :ctx]

        k, v = gather(kc), gather(vc)
        q_len = 1 if spec["kind"] == "decode" else spec["query_lens"][s]
        rows = q[q_start:q_start + q_len].double()  # [q_len, Hq, D]
        qg = rows.view(q_len, hkv, group, d).permute(1, 2, 0, 3)  # [Hkv, G, q_len, D]
        scores = torch.matmul(qg, k.transpose(1, 2).unsqueeze(1))  # [Hkv, G, q_len, ctx]
        scores.mul_(scale)
        if spec["kind"] == "prefill":
            history = ctx - q_len
            visible = (torch.arange(ctx, device=device)[None, :]
                       <= history + torch.arange(q_len, device=device)[:, None])
            scores.masked_fill_(~visible, -math.inf)
        probs = torch.softmax(scores, -1)
        scores.zero_()
        o = torch.matmul(probs, v.unsqueeze(1))  # [Hkv, G, q_len, D]
        probs.zero_()
        # Straight into out (a reshape of the permuted o would copy it to a buffer not zeroed).
        out[q_start:q_start + q_len].view(q_len, hkv, group, d).permute(1, 2, 0, 3).copy_(o)
        o.zero_()
        q_start += q_len
    host = out.to("cpu", copy=True)
    out.zero_()
    if out.is_cuda:
        torch.cuda.synchronize()
    return host


def _compare(out, ref, spec: dict) -> tuple[str | None, float]:
    """Compares one launch's output with the oracle's, vector by vector.

    The test is relative, per (row, query head) vector: ``|out - ref| <= REL_TOLERANCE * |ref|``
    (Euclidean norms over the head dimension); NaN fails.

    Returns:
        ``(None or the first wrong vector and the error, the largest relative error)``.
    """
    got = out.double().cpu()
    rel = (got - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
    bad = ~(rel <= REL_TOLERANCE)  # NaN counts as bad
    worst = float(rel.max())
    if not bool(bad.any()):
        return None, worst
    row, head = (int(i) for i in bad.nonzero()[0])
    unit = "sequence" if spec["kind"] == "decode" else "token"
    return (f"{unit} {row}, query head {head}: relative error "
            f"{float(rel[row, head]):.3g} (limit {REL_TOLERANCE}); {int(bad.sum())} of "
            f"{bad.numel()} output vectors wrong"), worst


def replay(job: dict) -> dict:
    """Times a checked recording (in the timing child). See the module docstring.

    Args:
        job: ``{"spec", "recording" (checked), "ceiling": "copy" | "gemm", "work"}``.

    Returns:
        ``{"ok", "us", "ceiling", "fraction", "message", "passes_us", "max_rel_error"}``.
    """
    import statistics

    import torch

    from reference import cuda as rcuda

    spec, rec = job["spec"], job["recording"]
    kernels = [rcuda.load_module(launch["path"], options=tuple(launch["options"]),
                                 backend=launch["backend"]).get_function(launch["name"])
               for launch in rec["launches"]]
    for kernel, launch in zip(kernels, rec["launches"]):
        rcuda.raise_shared_mem_limit(kernel, launch["shared_mem"])
    # NOTE: fresh seeds per run: the inputs cannot be known when the kernel is written.
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    device_gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    pools, shared, needed = _pool_inputs(spec, NUM_SETS + 1)  # [0]: the warm-up's
    # Scratch with recorded content (a work list, a zeroed counter) is the launcher's per call:
    # each launch gets its own copy, restored every pass. Scratch without is shared by every
    # launch, 0xFF at first and never reset (as a buffer a plan keeps would be).
    contents = [None if s["content"] is None else
                torch.frombuffer(bytearray.fromhex(s["content"]), dtype=torch.uint8)
                for s in rec["scratch"]]
    shared_scratch = [torch.full((s["nbytes"],), 0xFF, dtype=torch.uint8, device="cuda")
                      if c is None else None for s, c in zip(rec["scratch"], contents)]
    scratch = [[buf if c is None else c.to("cuda") for buf, c in zip(shared_scratch, contents)]
               for _ in range(NUM_SETS + 1)]
    ceiling = _ceiling(job["ceiling"])
    warm_set = _new_set(spec, needed + 1, needed, gen)
    warm = _argument_tuples(rec, {**shared, **warm_set, "key_cache": pools[0][0],
                                  "value_cache": pools[0][1]}, scratch[0])
    times, worst = [], 0.0
    for p in range(PASSES):
        # Warm-up (module load, clocks) before the pass's inputs exist: nothing it does can
        # prepare the timed launches.
        _launch_all(kernels, rec["launches"], warm)
        for pair in pools:  # new values each pass: nothing kept from an earlier pass holds
            for pool in pair:
                pool.normal_(generator=device_gen)
        sets = [_new_set(spec, needed + 1, needed, gen) for _ in range(NUM_SETS)]
        named = [{**shared, **one, "key_cache": k, "value_cache": v}
                 for one, (k, v) in zip(sets, pools[1:])]
        refs = [oracle(spec, inputs) for inputs in named]
        for per_set in scratch:
            for buf, c in zip(per_set, contents):
                if c is not None:
                    buf.copy_(c)
        calls = [_argument_tuples(rec, inputs, bufs) for inputs, bufs in zip(named, scratch[1:])]
        for one in sets:
            one["out"].fill_(math.nan)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(20_000_000)  # the launches queue up behind it: no host gaps timed
        start.record()
        for args in calls:
            _launch_all(kernels, rec["launches"], args)
        end.record()
        end.synchronize()
        for i, (one, ref) in enumerate(zip(sets, refs)):
            wrong, err = _compare(one["out"], ref, spec)
            worst = max(worst, err)
            if wrong:
                return {"ok": False, "message": f"pass {p + 1}, launch {i + 1} of {NUM_SETS}: "
                                                f"wrong output at {wrong}"}
        times.append(start.elapsed_time(end) * 1000.0 / NUM_SETS)
    # NOTE: measured again after the passes, and the larger kept: a process slowing the GPU
    # while the ceiling was measured would otherwise inflate every fraction.
    ceiling = max(ceiling, _ceiling(job["ceiling"]))
    us = statistics.median(times)
    fraction = job["work"] / (us * 1e-6) / ceiling
    return {"ok": True, "us": us, "ceiling": ceiling, "fraction": fraction,
            "passes_us": times, "max_rel_error": worst, "message": ""}


def _ceiling(kind: str) -> float:
    """The copy ceiling in bytes/s or the fp16 GEMM ceiling in FLOP/s, measured now."""
    from reference.tools.bench._gpu import copy_ceiling_gbps, gemm_ceiling_tflops

    if kind == "copy":
        return copy_ceiling_gbps() * 1e9
    return gemm_ceiling_tflops(8192, "float16") * 1e12


def _argument_tuples(rec: dict, inputs: dict, scratch: list) -> list[tuple]:
    from reference.tma import tensor_map

    out = []
    for launch in rec["launches"]:
        args = []
        for arg in launch["args"]:
            kind = arg[0]
            if kind == "in":
                args.append(np.uint64(inputs[arg[1]].data_ptr() + arg[2]))
            elif kind == "scratch":
                args.append(np.uint64(scratch[arg[1]].data_ptr() + arg[2]))
            elif kind == "null":
                args.append(np.uint64(0))
            elif kind == "i32":
                args.append(np.int32(arg[1]))
            elif kind == "i64":
                args.append(np.int64(arg[1]))
            elif kind in ("tmap", "tmap_rows"):  # made again here, of this launch's own cache
                args.append(tensor_map(inputs[arg[1]], arg[2], whole_rows=kind == "tmap_rows"))
            else:
                args.append(np.float32(arg[1]))
        out.append(tuple(args))
    return out


def _launch_all(kernels: list, launches: list, calls: list) -> None:
    from reference import cuda as rcuda

    for kernel, launch, args in zip(kernels, launches, calls):
        rcuda.launch(kernel, tuple(launch["grid"]), tuple(launch["block"]), args,
                     launch["shared_mem"])


def _child_main(job_path: str, result_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    try:
        result = replay(job)
    except Exception as exc:  # noqa: BLE001 — e.g. a compile error: reported, the stage scores 0
        result = {"ok": False, "message": f"{type(exc).__name__}: {exc}"[:600]}
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(*sys.argv[1:3]))
