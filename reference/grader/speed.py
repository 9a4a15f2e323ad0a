"""``pagedlab grade --speed``: speed points for the kernel stages, earned on a GPU, unforgeable.

Per stage of :data:`SPEED_STAGES` (a launcher of Lab 4 or 5, one workload, tiers of points):

1. **Record** (:mod:`reference.grader.speed_record`) where student Python runs — the isolated
   worker when grading isolated, a child process otherwise: the launcher is called once with
   its launches recorded; what comes back is plain data (files, kernel names, options, grids,
   scratch, which argument is which input). Isolated, the worker user's processes are then
   killed: nothing of the student's shares the GPU with the timing.
2. **Check** (:mod:`reference.grader.speed_check`, here): files, options, includes, limits.
3. **Time** (:mod:`reference.grader.speed_replay`, a fresh child process per stage that imports
   no student Python: a crash or a hang costs that stage only): it compiles the files itself,
   replays the launches on its own fresh inputs, checks every output vector against a float64
   oracle and times the passes. One wrong output scores the stage 0, so a kernel that returns
   early, skips work, never stores, or replays a cached result scores 0
   (``tests/test_speed_gpu.py`` runs such mutants: ``solutions/<lab>/speed_mutants/``).
4. **Score**: the median pass's time as a fraction of a ceiling the child measured — the copy
   ceiling (bytes of K/V read per second over device-to-device copy bandwidth) for decode, the
   fp16 GEMM ceiling (attention FLOP/s over matrix-product FLOP/s) for prefill — and one
   record per tier reached (:func:`speed_records`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from reference.grader.speed_check import SpeedRecordingError, check_recording
from reference.paths import REPO_ROOT

#: Seconds the recording and the timing child may take per stage.
RECORD_TIMEOUT_S = 300
REPLAY_TIMEOUT_S = 600


@dataclass(frozen=True)
class SpeedWorkload:
    """One batch a stage is timed on (fp16, head size 128, 16-token blocks).

    Attributes:
        name: the benchmark's name for it (``D1``, ``P2``: ``pagedlab bench`` times the same).
        kind: ``"decode"`` or ``"prefill"``.
        num_seqs: sequences.
        num_q_heads: query heads.
        num_kv_heads: KV heads.
        context_len: every sequence's context length.
        query_len: new tokens per sequence (prefill; the rest of the context is history).
    """

    name: str
    kind: str
    num_seqs: int
    num_q_heads: int
    num_kv_heads: int
    context_len: int
    query_len: int = 1
    head_size: int = 128
    block_size: int = 16

    def spec(self) -> dict:
        """The plain-data description both sides build inputs from."""
        return {"kind": self.kind, "dtype": "float16", "num_q_heads": self.num_q_heads,
                "num_kv_heads": self.num_kv_heads, "head_size": self.head_size,
                "block_size": self.block_size, "context_lens": [self.context_len] * self.num_seqs,
                "query_lens": [self.query_len] * self.num_seqs,
                "scale": 1.0 / math.sqrt(self.head_size)}

    def work(self) -> float:
        """Bytes of K/V a decode step reads, or attention FLOPs of a causal prefill (counted as
        ``pagedlab bench`` counts them)."""
        if self.kind == "decode":
            return float(_decode_workload(self.name).kv_bytes())
        from reference.tools.bench.prefill import visible_pairs

        pairs = visible_pairs(self.query_len, self.context_len - self.query_len)
        return 4.0 * self.num_seqs * pairs * self.num_q_heads * self.head_size


def _decode_workload(name: str):
    from reference.tools.bench.decode_workloads import DECODE_WORKLOADS

    return next(w for w in DECODE_WORKLOADS if w.name == name)


def bench_workload(name: str) -> SpeedWorkload:
    """The ``pagedlab bench`` workload ``name`` (``D1``, ``P2``, ...) as a speed workload: speed
    is graded on the shapes the benchmarks report, defined once, there."""
    if name.startswith("D"):
        w = _decode_workload(name)
        if isinstance(w.context_len, tuple):
            raise ValueError(f"{name} has ragged lengths; speed workloads have one length")
        return SpeedWorkload(name, "decode", w.num_seqs, w.num_q_heads, w.num_kv_heads,
                             w.context_len, head_size=w.head_size, block_size=w.block_size)
    from reference.tools.bench.prefill import load_workloads, settings_of

    common, workloads = load_workloads()
    wl = next(w for w in workloads if w["name"] == name)
    cfg = settings_of(common, wl)
    return SpeedWorkload(name, "prefill", wl["num_seqs"], cfg["num_q_heads"], cfg["num_kv_heads"],
                         wl["query_len"] + wl["history_len"], query_len=wl["query_len"],
                         head_size=cfg["head_size"], block_size=cfg["block_size"])


@dataclass(frozen=True)
class SpeedStage:
    """A kernel stage that earns speed points.

    Attributes:
        lab: its lab folder.
        stage: the handout's name of the stage.
        launcher: the public launcher recorded.
        workload: what it is timed on.
        tiers: ``(fraction of the ceiling, points)``: each tier reached earns its points.
        files: the ``.cu`` files its launches may use (a v3 launcher running v6's kernel would
            earn v3's points with v6's work).
        capability: the compute capability the stage needs, or None: on another GPU it is not
            graded (its records are skipped, as the stage's tests skip there).
    """

    lab: str
    stage: str
    launcher: str
    workload: SpeedWorkload
    tiers: tuple
    files: tuple
    capability: tuple | None = None

    @property
    def ceiling(self) -> str:
        return "copy" if self.workload.kind == "decode" else "gemm"


D1, D3, P2 = bench_workload("D1"), bench_workload("D3"), bench_workload("P2")

#: Every stage graded for speed, with its tiers (the handouts' "Speed points" tables).
SPEED_STAGES = (
    SpeedStage("lab04_decode_kernels", "v3", "paged_attention_v3", D3, ((0.25, 1), (0.40, 1)),
               ("decode_v3.cu", "decode_reduce.cu")),
    SpeedStage("lab04_decode_kernels", "v4", "paged_attention_v4", D1, ((0.50, 1), (0.70, 1)),
               ("decode_v4.cu", "decode_reduce.cu")),
    SpeedStage("lab04_decode_kernels", "v6", "paged_attention_v6", D1, ((0.70, 1), (0.90, 1)),
               ("decode_v6.cu", "decode_reduce.cu")),
    SpeedStage("lab05_prefill_kernels", "tiled", "paged_prefill_tiled", P2,
               ((0.015, 1), (0.025, 1)), ("prefill_tiled.cu",)),
    SpeedStage("lab05_prefill_kernels", "tc", "paged_prefill_tc", P2, ((0.15, 1), (0.25, 1)),
               ("prefill_tc.cu",)),
    # NOTE: the first tier asks more than mma.sync gives (the tc solution: 36-37 %; the wgmma
    # solution 57-58 %, H100, 2026-11-25).
    SpeedStage("lab05_prefill_kernels", "wgmma", "paged_prefill_wgmma", P2,
               ((0.40, 1), (0.50, 1)), ("prefill_wgmma.cu",), capability=(9, 0)),
)


def record_stage(stage: SpeedStage, isolated: bool, how: str | None = None) -> dict:
    """Records ``stage``'s launcher where student code may run (never in this process).

    Returns:
        The recording (untrusted), or ``{"error": ...}``.
    """
    from reference.grader import speed_record

    spec = stage.workload.spec()
    if isolated:
        from reference.grader import proxy

        from reference.grader.sandbox import kill_worker_processes

        try:
            client = proxy.WorkerClient(stage.lab)
        except Exception as exc:  # noqa: BLE001 — e.g. the student's module does not import
            return {"error": f"recording failed: {type(exc).__name__}: {exc}"[:500]}
        # A launcher that never returns must not hang the grade: the watchdog kills the worker,
        # and gather then fails with WorkerDiedError.
        watchdog = threading.Timer(RECORD_TIMEOUT_S, client.kill,
                                   (f"the recording took over {RECORD_TIMEOUT_S} s",))
        watchdog.start()
        try:
            result = proxy.gather(speed_record.record, client.module, stage.launcher, spec)
        except Exception as exc:  # noqa: BLE001 — the stage scores 0 with the reason
            result = {"error": f"recording failed: {type(exc).__name__}: {exc}"[:500]}
        finally:
            watchdog.cancel()
            client.kill("speed recording done")
        # NOTE: and whatever it started: nothing of the student's may share the GPU with the
        # timing.
        try:
            kill_worker_processes(how or isolation_how())
        except Exception as exc:  # noqa: BLE001 — not timed beside a process we cannot stop
            return {"error": f"not timed: {exc}"}
        return result
    try:
        done = subprocess.run([sys.executable, "-m", "reference.grader.speed_record", stage.lab,
                               stage.launcher], input=json.dumps(spec), capture_output=True,
                              text=True, timeout=RECORD_TIMEOUT_S, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"recording took over {RECORD_TIMEOUT_S} s"}
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"error": f"recording failed (exit {done.returncode}): {done.stderr[-400:]}"}


def run_replay_child(stage: SpeedStage, recording: dict) -> dict:
    """Runs :func:`reference.grader.speed_replay.replay` in a fresh child process (no student
    Python is ever imported there).

    Returns:
        The replay's result, or ``{"ok": False, "message"}`` when the child crashed (an
        illegal address kills its CUDA context), hung past REPLAY_TIMEOUT_S or printed no result.
    """
    job = {"spec": stage.workload.spec(), "recording": recording, "ceiling": stage.ceiling,
           "work": stage.workload.work()}
    with tempfile.TemporaryDirectory(prefix="pagedlab-speed-") as tmp:
        job_path, result_path = Path(tmp, "job.json"), Path(tmp, "result.json")
        job_path.write_text(json.dumps(job))
        try:
            done = subprocess.run([sys.executable, "-m", "reference.grader.speed_replay",
                                   str(job_path), str(result_path)], capture_output=True,
                                  stdin=subprocess.DEVNULL, text=True, timeout=REPLAY_TIMEOUT_S,
                                  cwd=REPO_ROOT)
        except subprocess.TimeoutExpired:
            return {"ok": False, "message": f"the timed launches took over {REPLAY_TIMEOUT_S} s "
                                            "(a kernel that never finishes?)"}
        try:
            result = json.loads(result_path.read_text())
            if isinstance(result, dict) and isinstance(result.get("ok"), bool):
                return result
        except (OSError, ValueError):
            pass
        # NOTE: the compiler's or driver's text is not shown: an #include of a file the grader
        # can read would echo it there.
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"ok": False, "message": f"the timing process died (exit {done.returncode}): "
                                        f"{last[0][:200]}"}


def grade_stage(stage: SpeedStage, isolated: bool, how: str | None = None) -> dict:
    """Records, checks and times one stage.

    Returns:
        ``{"stage", "lab", "workload", "ok", "us", "fraction", "points", "max_points",
        "message"}``.
    """
    result = _result_head(stage)
    try:
        recording = check_recording(record_stage(stage, isolated, how), stage.lab,
                                    files=stage.files)
        timed = run_replay_child(stage, recording)
    except SpeedRecordingError as exc:
        return {**result, "ok": False, "points": 0, "message": f"not timed: {exc}"}
    except Exception as exc:  # noqa: BLE001 — one stage's failure never aborts the grade
        return {**result, "ok": False, "points": 0,
                "message": f"not timed: {type(exc).__name__}: {exc}"[:300]}
    points = sum(p for t, p in stage.tiers if timed.get("ok") and timed.get("fraction", 0) >= t)
    return {**result, **timed, "points": points}


def _result_head(stage: SpeedStage) -> dict:
    """The fields every stage's result starts with."""
    return {"lab": stage.lab, "stage": stage.stage, "workload": stage.workload.name,
            "ceiling_kind": stage.ceiling, "max_points": sum(p for _, p in stage.tiers)}


def not_graded_here(stage: SpeedStage, capability: tuple) -> dict:
    """The result of a stage this GPU cannot run (its records are skipped, not failed)."""
    need = ".".join(map(str, stage.capability))
    have = ".".join(map(str, capability))
    return {**_result_head(stage), "ok": False, "skipped": True, "points": 0,
            "message": f"not graded on this GPU: {stage.stage} needs compute capability {need}, "
                       f"this GPU is {have}"}


def speed_records(results: list[dict]) -> list:
    """One graded record per tier of each stage (``pagedlab grade`` adds them to the tests')."""
    from reference.grader.results import TestResult

    by_stage = {(s.lab, s.stage): s for s in SPEED_STAGES}
    records = []
    for r in results:
        stage = by_stage[(r["lab"], r["stage"])]
        for threshold, pts in stage.tiers:
            what = f"{threshold:.1%} of the {stage.ceiling} ceiling"
            rec = TestResult(nodeid=f"speed::{stage.lab}::{stage.stage}[{stage.workload.name}>="
                                    f"{threshold:g}]", lab=stage.lab,
                             name=f"speed_{stage.stage}[{stage.workload.name}>={threshold:g}]",
                             doc=f"{stage.launcher} on {stage.workload.name} reaches {what} "
                                 f"(timed on the GPU, every output checked)",
                             points=Fraction(pts))
            if r.get("skipped"):
                rec.outcome, rec.message = "skipped", r.get("message", "")
            elif not r.get("ok"):
                rec.fail(r.get("message") or "not timed")
            elif r["fraction"] < threshold:
                rec.fail(f"{r['us']:.1f} µs = {r['fraction']:.1%} of the {stage.ceiling} "
                         f"ceiling; this tier needs {threshold:.1%}")
            records.append(rec)
    return records


def isolation_how() -> str:
    """How the worker is started (``"root"`` or ``"sudo"``): the grading run's, else probed.

    Raises:
        IsolationError: neither root nor passwordless sudo.
    """
    from reference.grader.sandbox import ISOLATED_ENV, ensure_worker_user

    how = os.environ.get(ISOLATED_ENV)
    return how if how in ("root", "sudo") else ensure_worker_user()


def grade_speed(labs: list[str], isolated: bool, *, stages: list[str] | None = None) -> list[dict]:
    """Grades every speed stage of ``labs`` (optionally only the named stages).

    Raises:
        RuntimeError: no CUDA GPU here (speed is graded on a GPU runner).
        IsolationError: ``isolated`` and neither root nor passwordless sudo.
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("speed is graded on a CUDA GPU; this machine has none")
    how = isolation_how() if isolated else None  # once: it probes sudo and the worker user
    capability = tuple(torch.cuda.get_device_capability())
    return [grade_stage(s, isolated, how) if s.capability in (None, capability)
            else not_graded_here(s, capability)
            for s in SPEED_STAGES if s.lab in labs and (stages is None or s.stage in stages)]


def load_speed_mutants(lab: str | None = None) -> list:
    """The speed mutants (``solutions/<lab>/speed_mutants/*.toml``): kernels that would look
    fast to a careless timer — they return early, write nothing, skip work or replay a cached
    result — each of which speed grading must score 0 (``tests/test_speed_gpu.py``).

    Returns:
        :class:`reference.grader.mutants.Mutant` items, ``caught_by`` = ``["speed:<stage>"]``.

    Raises:
        MutantSpecError: a spec lacks its stage, mistake or edits.
    """
    from reference.grader.mutants import Mutant, MutantSpecError, read_spec
    from reference.paths import SOLUTIONS_DIR

    out = []
    for path in sorted(SOLUTIONS_DIR.glob(f"{lab or 'lab*'}/speed_mutants/*.toml")):
        data, edits = read_spec(path)
        try:
            out.append(Mutant(lab=path.parent.parent.name, name=path.stem,
                              mistake=data["mistake"], caught_by=[f"speed:{data['stage']}"],
                              requires_gpu=True, edits=edits, path=path))
        except (KeyError, TypeError) as exc:
            raise MutantSpecError(f"{path}: missing or malformed field {exc}") from None
    return out


def format_speed_table(results: list[dict]) -> str:
    """The speed results as a text table (achieved rate, the ceiling measured beside it)."""
    lines = [f"{'lab':<22} {'stage':<6} {'workload':<8} {'µs':>8}  {'achieved / ceiling, max relative error':<44} points",
             "-" * 92]
    for r in results:
        if r.get("ok"):
            scale, unit = (1e9, "GB/s") if r["ceiling_kind"] == "copy" else (1e12, "TFLOP/s")
            rate = r["fraction"] * r["ceiling"] / scale
            got = (f"{r['us']:>8.1f}  {rate:.0f} / {r['ceiling'] / scale:.0f} {unit} "
                   f"= {r['fraction']:.1%}, max err {r.get('max_rel_error', math.nan):.1e}")
        else:
            got = f"{'—':>8}  {r.get('message', '')[:120]}"
        lines.append(f"{r['lab']:<22} {r['stage']:<6} {r['workload']:<8} {got:<44} "
                     f"{r['points']}/{r['max_points']}")
    return "\n".join(lines)
