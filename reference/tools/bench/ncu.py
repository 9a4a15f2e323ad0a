"""``pagedlab bench ncu``: Nsight Compute on one launch of a kernel stage, the metrics that matter.

For each stage it runs Nsight Compute (``ncu``, on ``PATH``) on this same module in *target*
mode, which builds one benchmark workload on the GPU and calls the stage twice; ncu skips the
first (compiling, warm-up) launch of the stage's kernel and measures the second. The metrics,
read as the handouts' "Measure it yourself" sections explain:

* ``time`` — the kernel's duration under the profiler (µs; the clocks are left alone:
  ``--clock-control none``, as the benchmarks run);
* ``dram %`` — DRAM throughput, % of the peak: the decode kernels' roofline (they read every
  cached byte once);
* ``occupancy %`` — achieved occupancy, warps resident per SM as % of the maximum;
* ``tensor %`` — the tensor pipe's active cycles, % of peak: the prefill kernels' roofline;
* ``issue %`` — instructions issued, % of the schedulers' peak (one per cycle each): near 100
  the kernel is bound by its own instruction count, not by a pipe it waits on;
* ``L2 %`` — L2 throughput, % of peak: where K/V tiles re-read by many CTAs come from;
* ``smem conflicts`` — shared-memory bank conflicts of loads + stores (``ldmatrix`` and stores
  of an unswizzled tile show up here);
* ``regs`` / ``smem KiB`` — registers per thread and dynamic shared memory per CTA, the usual
  limits of occupancy.

and, from a second pass of ncu on the same launch (so that an ncu without these metrics still
gives the ones above):

* ``inst M`` — instructions executed, in millions: two kernels at the same issue rate take
  time in proportion to it (Lab 5's "The cause: instructions");
* ``wait`` / ``short sb`` / ``long sb`` / ``barrier`` / ``mio`` — warp cycles stalled per issued
  instruction, by reason: a result of fixed latency, shared memory or the special-function
  unit, L1TEX loads (global and local), ``__syncthreads``, a full memory-instruction queue.

Usage: ``pagedlab bench ncu [--stages v4 v6 tiled tc wgmma flashinfer flashinfer_fa2] [--workload P3]``;
results go to ``ncu.json`` with the device and date, each row with the profiled kernel's full
name (``kernel_name``: for ``flashinfer``, which of its backends ran). Needs a GPU whose driver lets ncu read
counters (see the handout's note). The ``flashinfer`` stage profiles FlashInfer's prefill
(its default backend) on the same caches, for reading a stage's counters against it;
``flashinfer_fa2`` its FlashAttention-2 backend (``mma.sync``, the tensor-core stage's peer).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from reference.tools.bench._common import DEFAULT_OUT, format_table, machine_info

#: stage -> (lab, workload, regex of the kernel ncu measures)
STAGES = {
    "v4": ("decode", "D1", "paged_decode_v4"),
    "v6": ("decode", "D1", "paged_decode_v6"),
    "tiled": ("prefill", "P1", "prefill_tiled_"),
    "tc": ("prefill", "P1", "prefill_tc_"),
    "wgmma": ("prefill", "P1", "prefill_wgmma_"),
    # NOTE: FlashInfer's own kernel (its default backend, FlashAttention-3 on Hopper) on the same
    # caches, so a stage's counters can be read against a production kernel's.
    "flashinfer": ("prefill", "P1", "(?i)prefill"),
    "flashinfer_fa2": ("prefill", "P1", "(?i)prefill"),
}

#: column -> Nsight Compute metric
METRICS = {
    "time_us": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "tensor_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "issue_pct": "sm__inst_issued.avg.pct_of_peak_sustained_active",
    "l2_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "smem_ld_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "smem_st_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "regs": "launch__registers_per_thread",
    "smem_bytes": "launch__shared_mem_per_block_dynamic",
}

#: column -> Nsight Compute metric, measured in a second ncu pass (names as ncu printed them on
#: an H200, 2026-11-29; tests/test_bench_ncu.py holds rows of that run).
STALL_METRICS = {
    "instructions": "sm__inst_executed.sum",
    **{f"stall_{col}": f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
       for col, reason in (("wait", "wait"), ("short_sb", "short_scoreboard"),
                           ("long_sb", "long_scoreboard"), ("barrier", "barrier"),
                           ("mio", "mio_throttle"))},
}


def target(stage: str, workload: str | None = None) -> None:
    """Target mode: builds the workload (default: the stage's) and calls the stage twice (ncu
    measures the second)."""
    import torch

    from reference.loader import load_impl

    lab, default, _ = STAGES[stage]
    workload = workload or default
    if lab == "decode":
        from reference.tools.bench.decode import build_batch
        from reference.tools.bench.decode_workloads import DECODE_WORKLOADS

        w = next(w for w in DECODE_WORKLOADS if w.name == workload)
        b = build_batch(w)
        impl = load_impl("lab04_decode_kernels")
        fn = getattr(impl, f"paged_attention_{stage}")
        args = (b["query"], b["key_cache"], b["value_cache"], b["block_tables"],
                b["context_lens"], b["scale"])
        kwargs = {"max_context_len": int(b["lens"].max())}
    else:
        from reference.tools.bench.prefill import build_inputs, load_workloads, settings_of

        common, workloads = load_workloads()
        wl = next(w for w in workloads if w["name"] == workload)
        cfg = settings_of(common, wl)
        b = build_inputs(cfg, wl)
        args, kwargs = (), {}
        if stage in ("flashinfer", "flashinfer_fa2"):
            import flashinfer

            from reference.tools.bench.prefill import flashinfer_fn

            backend = "fa2" if stage == "flashinfer_fa2" else "auto"
            fn, _ = flashinfer_fn(flashinfer, b, cfg, wl, backend=backend)
        else:
            impl = load_impl("lab05_prefill_kernels")
            fn = getattr(impl, f"paged_prefill_{stage}")
            kwargs = b
    for _ in range(2):
        fn(*args, **kwargs)
    torch.cuda.synchronize()


def profile(stage: str, ncu: str, workload: str | None = None) -> dict:
    """Runs ncu on the stage's target (on ``workload``, default the stage's); returns {column:
    value} (None where a metric is n/a)."""
    lab, default, kernel = STAGES[stage]
    workload = workload or default
    names = workload_names(lab)
    if workload not in names:
        raise RuntimeError(f"{workload} is not a {lab} workload ({', '.join(names)})")
    def run(metrics: dict) -> tuple[dict, str | None, object]:
        cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "-k",
               f"regex:{kernel}", "--launch-skip", "1", "--launch-count", "1", "--csv",
               "--metrics", ",".join(metrics.values()), sys.executable, "-m",
               "reference.tools.bench.ncu", "--target", stage, "--workload", workload]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"ncu ran past {e.timeout:.0f} s on {stage}") from e
        return *parse_csv(done.stdout, metrics), done

    values, kernel_name, done = run(METRICS)
    if all(v is None for v in values.values()):
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise RuntimeError(f"ncu measured nothing for {stage} (exit {done.returncode}):\n{tail}")
    # NOTE: a second pass, so that an ncu that lacks one of these metrics (it then measures
    # nothing at all) still gives the first pass's columns; these are then None.
    values.update(run(STALL_METRICS)[0])
    # NOTE: the name says which kernel the regex caught; for the flashinfer stage it is what
    # tells its backends apart (FlashAttention-3's kernels on Hopper spell out their tiling).
    return {"stage": stage, "workload": workload, "kernel": kernel, "kernel_name": kernel_name,
            **values}


def parse_csv(stdout: str, metrics: dict[str, str] = METRICS
              ) -> tuple[dict[str, float | None], str | None]:
    """Reads ``ncu --csv --metrics ...`` output (one launch profiled).

    Args:
        stdout: ncu's standard output; lines that are not CSV rows (the target's own prints,
            ncu's ``==PROF==`` notes) are skipped.
        metrics: {column: ncu metric name} to read (:data:`METRICS` or :data:`STALL_METRICS`).

    Returns:
        ({column of ``metrics``: value, None where ncu gave no number}, the profiled kernel's
        name, or None where no row named one).
    """
    values: dict[str, float | None] = dict.fromkeys(metrics)
    kernel_name = None
    lines = [ln for ln in stdout.splitlines() if ln.startswith('"')]
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        kernel_name = kernel_name or row.get("Kernel Name") or None
        for col, metric in metrics.items():
            if row.get("Metric Name") == metric:
                values[col] = _number(row.get("Metric Value", ""), row.get("Metric Unit", ""))
    return values, kernel_name


def workload_names(lab: str) -> list[str]:
    """The benchmark workloads of ``lab`` (``"decode"``: D1..., ``"prefill"``: P1...)."""
    if lab == "decode":
        from reference.tools.bench.decode_workloads import DECODE_WORKLOADS

        return [w.name for w in DECODE_WORKLOADS]
    from reference.tools.bench.prefill import load_workloads

    return [w["name"] for w in load_workloads()[1]]


def _number(text: str, unit: str) -> float | None:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    # ncu prints durations in ns by default (older versions spell the unit out)
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
             "s": 1e6, "second": 1e6}
    return value * scale[unit] if unit in scale else value


def find_ncu() -> str | None:
    """``ncu`` on PATH, else the newest under the CUDA toolkit or /opt/nvidia (None: absent)."""
    found = shutil.which("ncu")
    if found:
        return found
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates = [Path(home) / "bin" / "ncu",
                  *sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"), reverse=True)]
    return next((str(p) for p in candidates if p.is_file()), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pagedlab bench ncu", description=__doc__.splitlines()[0])
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES))
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for ncu.json")
    parser.add_argument("--workload", help="a workload of the stage's lab (P1-P6, D1-D6; "
                        "default: D1 for decode stages, P1 for prefill)")
    parser.add_argument("--target", choices=list(STAGES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.target:
        target(args.target, args.workload)
        return 0
    ncu = find_ncu()
    if ncu is None:
        print("pagedlab bench ncu needs Nsight Compute's ncu on PATH (CUDA toolkit)")
        return 2
    rows = []
    for stage in args.stages:
        try:
            row = profile(stage, ncu, args.workload)
        except RuntimeError as e:  # e.g. FlashInfer not installed, wgmma off Hopper
            print(f"  {stage}: skipped: {e}", flush=True)
            continue
        conflicts = [row[k] for k in ("smem_ld_conflicts", "smem_st_conflicts")]
        row["smem_conflicts"] = None if None in conflicts else sum(conflicts)
        row["smem_kib"] = None if row["smem_bytes"] is None else row["smem_bytes"] / 1024
        row["inst_m"] = None if row["instructions"] is None else row["instructions"] / 1e6
        rows.append(row)
        print(f"  {stage}: {row}", flush=True)
    cols = [("stage", "stage", ""), ("workload", "workload", ""), ("time_us", "time µs", ".1f"),
            ("dram_pct", "dram %", ".1f"), ("occupancy_pct", "occupancy %", ".1f"),
            ("tensor_pct", "tensor %", ".1f"), ("issue_pct", "issue %", ".1f"),
            ("l2_pct", "L2 %", ".1f"), ("smem_conflicts", "smem conflicts", ".0f"),
            ("regs", "regs", ".0f"), ("smem_kib", "smem KiB", ".1f"),
            ("inst_m", "inst M", ".1f"), ("stall_wait", "wait", ".2f"),
            ("stall_short_sb", "short sb", ".2f"), ("stall_long_sb", "long sb", ".2f"),
            ("stall_barrier", "barrier", ".2f"), ("stall_mio", "mio", ".2f")]
    if not rows:  # keep an earlier ncu.json rather than overwrite it with nothing
        print("pagedlab bench ncu: no stage was measured")
        return 1
    print(format_table(rows, cols))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ncu.json").write_text(json.dumps({"machine": machine_info(),
                                              "metrics": {**METRICS, **STALL_METRICS},
                                              "rows": rows}, indent=1))
    print(f"wrote {out / 'ncu.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
