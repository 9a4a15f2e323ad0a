"""``pagedlab grade --speed``: speed points for the kernel stages, earned on a GPU, unforgeable.

Per stage of :data:`SPEED_STAGES` (a launcher of Lab 4 or 5, one workload, tiers of points):

1. **Record** (:mod:`reference.grader.speed_record`), where student Python runs — the isolated
   worker when grading isolated, a child process otherwise: the launcher is called once with
   its launches recorded; what comes back is plain data (files, kernel names, options, grids,
   scratch sizes, which argument is which input).
2. **Check** (:func:`check_recording`, here): at most :data:`MAX_LAUNCHES` launches of kernels
   in ``.cu`` files of the graded implementation's own folder or its lab's, ``-D`` options
   only, sizes within CUDA's limits, scratch within :data:`MAX_SCRATCH_BYTES`.
3. **Time** (:func:`replay`, in a fresh child process that imports no student Python: its
   crash or hang costs the stage, nothing else): the trusted side compiles the named files
   itself and replays the launches on its own inputs. Each of :data:`PASSES` passes refills the
   K/V pools with new random values (so nothing a kernel kept from an earlier pass is still
   right), gives each of :data:`NUM_SETS` launches its own K/V pools, query, random block table
   and NaN-filled output (no launch reads memory an earlier one of its pass read, so neither L2
   nor anything a kernel derived and kept helps it), times the launches back to back with CUDA
   events, then compares **every** launch's output with a float64 oracle computed on this side
   before the launches ran. A pass with one wrong output scores the stage 0; a kernel that returns
   early, writes nothing, or replays a result it cached scores 0 (``tests/test_speed_gpu.py``
   runs such mutants).
4. **Score**: the median pass's time as a fraction of a ceiling measured in the same child —
   the copy ceiling (bytes of K/V read per second over device-to-device copy bandwidth) for
   decode, the fp16 GEMM ceiling (attention FLOP/s over matrix-product FLOP/s) for prefill —
   and one record per tier reached.

NOTE: the timing child runs the student's *CUDA* (never their Python). A kernel can read and
write its process's device memory; the oracle is computed before it runs and kept in host
memory, outputs are compared there, and the timing comes from CUDA events the kernel cannot
reach. What it could still do is covered in the README's threat model.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from reference.paths import LABS_DIR, REPO_ROOT

#: Launches (kernels) a stage may record per call.
MAX_LAUNCHES = 8
#: Scratch bytes a stage may ask for, all buffers together.
MAX_SCRATCH_BYTES = 4 << 30
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
#: Seconds the recording and the timing child may take per stage.
RECORD_TIMEOUT_S = 300
REPLAY_TIMEOUT_S = 600

#: Bytes of scratch content a recording may carry, all buffers together.
MAX_CONTENT_BYTES = 64 << 20
#: Dynamic shared memory a launch may ask for (sm_90's per-block opt-in maximum, 227 KiB).
MAX_SHARED_MEM = 227 * 1024

_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*include\b(.*)$", re.M)
_OPTION_RE = re.compile(r"-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.:+-]*)?")
_OPTIONS_ALLOWED = frozenset({"-lineinfo", "--use_fast_math", "-use_fast_math"})
_ARG_KINDS = {"in": 3, "scratch": 3, "null": 1, "i32": 2, "i64": 2, "f32": 2}


class SpeedRecordingError(ValueError):
    """A recorded stage that the trusted side will not replay (the stage scores 0)."""


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
        """Bytes of K/V a decode step reads, or attention FLOPs of a causal prefill."""
        if self.kind == "decode":
            return self.num_seqs * self.context_len * self.num_kv_heads * self.head_size * 4.0
        history = self.context_len - self.query_len
        pairs = self.query_len * history + self.query_len * (self.query_len + 1) // 2
        return 4.0 * self.num_seqs * pairs * self.num_q_heads * self.head_size


@dataclass(frozen=True)
class SpeedStage:
    """A kernel stage that earns speed points.

    Attributes:
        lab: its lab folder.
        stage: the handout's name of the stage.
        launcher: the public launcher recorded.
        workload: what it is timed on.
        tiers: ``(fraction of the ceiling, points)``: each tier reached earns its points.
    """

    lab: str
    stage: str
    launcher: str
    workload: SpeedWorkload
    tiers: tuple

    @property
    def ceiling(self) -> str:
        return "copy" if self.workload.kind == "decode" else "gemm"


D1 = SpeedWorkload("D1", "decode", 64, 32, 8, 4096)
D3 = SpeedWorkload("D3", "decode", 4, 32, 8, 32768)
P2 = SpeedWorkload("P2", "prefill", 8, 32, 8, 2048, query_len=512)

#: Every stage graded for speed, with its tiers (the handouts' "Speed points" tables).
SPEED_STAGES = (
    SpeedStage("lab04_decode_kernels", "v3", "paged_attention_v3", D3, ((0.25, 1), (0.40, 1))),
    SpeedStage("lab04_decode_kernels", "v4", "paged_attention_v4", D1, ((0.50, 1), (0.70, 1))),
    SpeedStage("lab04_decode_kernels", "v6", "paged_attention_v6", D1, ((0.70, 1), (0.90, 1))),
    SpeedStage("lab05_prefill_kernels", "tiled", "paged_prefill_tiled", P2,
               ((0.015, 1), (0.025, 1))),
    SpeedStage("lab05_prefill_kernels", "tc", "paged_prefill_tc", P2, ((0.15, 1), (0.25, 1))),
)


# ----------------------------------------------------------------------------- checking


def allowed_dirs(lab: str) -> tuple[Path, ...]:
    """Folders whose ``.cu`` files a recording of ``lab`` may name: the graded implementation's
    own (the lab folder for the starter, ``solutions/<lab>`` or a mutant's copy) and the lab's."""
    from reference.loader import impl_file

    mutant = os.environ.get("PAGEDLAB_IMPL_DIR")
    own = Path(mutant) if mutant else impl_file(lab).parent
    return tuple({own.resolve(), (LABS_DIR / lab).resolve()})


def check_recording(recording, lab: str, dirs: tuple[Path, ...] | None = None) -> dict:
    """Checks an untrusted recording before anything of it is compiled or launched.

    Args:
        recording: what :func:`reference.grader.speed_record.record` returned (any value).
        lab: the stage's lab.
        dirs: folders the kernel files must be in (default :func:`allowed_dirs`).

    Returns:
        The recording, its paths resolved.

    Raises:
        SpeedRecordingError: naming what is wrong.
    """
    dirs = dirs or allowed_dirs(lab)
    if not isinstance(recording, dict):
        raise SpeedRecordingError(f"the recording is a {type(recording).__name__}, not a dict")
    if "error" in recording:
        raise SpeedRecordingError(str(recording["error"])[:500])
    inputs, scratch, launches = (recording.get(k) for k in ("inputs", "scratch", "launches"))
    if not (isinstance(inputs, list) and isinstance(scratch, list) and isinstance(launches, list)):
        raise SpeedRecordingError("the recording needs lists 'inputs', 'scratch', 'launches'")
    if not 1 <= len(launches) <= MAX_LAUNCHES:
        raise SpeedRecordingError(f"{len(launches)} launches recorded; a stage may make 1 to "
                                  f"{MAX_LAUNCHES}")
    total = content_total = 0
    for s in scratch:
        if not (isinstance(s, dict) and _is_int(s.get("nbytes")) and s["nbytes"] > 0):
            raise SpeedRecordingError("a scratch buffer needs a positive 'nbytes'")
        content = s.get("content")
        if content is not None and (not isinstance(content, str)
                                    or len(content) != 2 * s["nbytes"]):
            raise SpeedRecordingError("a scratch buffer's content must be hex of its nbytes")
        total += s["nbytes"]
        content_total += s["nbytes"] if content is not None else 0
    if total > MAX_SCRATCH_BYTES or content_total > MAX_CONTENT_BYTES:
        raise SpeedRecordingError(f"{total} bytes of scratch ({content_total} with content); at "
                                  f"most {MAX_SCRATCH_BYTES} ({MAX_CONTENT_BYTES})")
    checked = [_check_launch(launch, inputs, len(scratch), dirs) for launch in launches]
    for folder in sorted(dirs):  # the kernels' folders, and the lab's headers they include
        check_includes(folder)
    return {"inputs": list(inputs), "scratch": scratch, "launches": checked}


def check_includes(folder: Path) -> None:
    """Refuses kernel sources whose ``#include`` could reach outside the workbook's folders.

    Every ``.cu``, ``.cuh`` and ``.h`` file of ``folder`` may include ``<name>`` or
    ``"name"`` with a relative path free of ``..``: the file's folder, its lab's, the
    workbook's ``reference/include`` and the CUDA toolkit's headers are all the compiler
    searches. NOTE: an absolute or ``..`` path could compile someone else's kernel (a library's
    headers installed on the grading machine) as the student's.

    Raises:
        SpeedRecordingError: naming the file and the include.
    """
    for source in sorted(folder.iterdir()):
        if source.suffix not in (".cu", ".cuh", ".h") or not source.is_file():
            continue
        text = source.read_text(errors="replace").replace("\\\n", "")
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        for match in _INCLUDE_RE.finditer(text):
            target = match.group(1).split("//")[0].strip()
            name = target[1:-1] if len(target) > 2 and (target[0], target[-1]) in (
                ("<", ">"), ('"', '"')) else None
            if name is None or name.startswith(("/", "\\")) or ".." in Path(name).parts:
                raise SpeedRecordingError(f"{source.name}: #include {target} — only relative "
                                          "header names without '..' are compiled for speed")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_launch(launch, inputs: list, num_scratch: int, dirs: tuple[Path, ...]) -> dict:
    if not isinstance(launch, dict):
        raise SpeedRecordingError("a launch must be a dict")
    path = launch.get("path")
    if not isinstance(path, str):
        raise SpeedRecordingError("a launch needs its kernel file's 'path'")
    resolved = Path(path).resolve()
    if resolved.suffix != ".cu" or resolved.parent not in dirs or not resolved.is_file():
        raise SpeedRecordingError(f"kernel file {path!r} is not a .cu file of the graded "
                                  f"implementation's folder or its lab's")
    name = launch.get("name")
    if not (isinstance(name, str) and name.isidentifier()):
        raise SpeedRecordingError(f"kernel name {name!r} is not an identifier (extern \"C\" "
                                  "kernels only)")
    options = launch.get("options")
    if not (isinstance(options, list) and all(isinstance(o, str) and (
            _OPTION_RE.fullmatch(o) or o in _OPTIONS_ALLOWED) for o in options)):
        raise SpeedRecordingError(f"compiler options {options!r}: only -DNAME[=VALUE], "
                                  f"{sorted(_OPTIONS_ALLOWED)}")
    if launch.get("backend") not in ("nvrtc", "nvcc") or launch.get("name_expressions"):
        raise SpeedRecordingError("kernels must be compiled by NVRTC or nvcc, without name "
                                  "expressions")
    grid, block, smem = launch.get("grid"), launch.get("block"), launch.get("shared_mem")
    for what, dims, limits in (("grid", grid, (2**31 - 1, 65535, 65535)),
                               ("block", block, (1024, 1024, 64))):
        if not (isinstance(dims, list) and 1 <= len(dims) <= 3
                and all(_is_int(d) and 1 <= d <= lim for d, lim in zip(dims, limits))):
            raise SpeedRecordingError(f"{what} {dims!r} is outside CUDA's limits")
    if math.prod(block) > 1024 or not (_is_int(smem) and 0 <= smem <= MAX_SHARED_MEM):
        raise SpeedRecordingError(f"block {block} or shared memory {smem!r} outside CUDA's limits")
    args = launch.get("args")
    if not isinstance(args, list) or len(args) > 64:
        raise SpeedRecordingError("a launch needs at most 64 'args'")
    for arg in args:
        if not (isinstance(arg, list) and arg and _ARG_KINDS.get(arg[0]) == len(arg)):
            raise SpeedRecordingError(f"argument {arg!r} is not one of {sorted(_ARG_KINDS)}")
        kind = arg[0]
        if kind == "in" and not (arg[1] in inputs and _is_int(arg[2]) and arg[2] >= 0):
            raise SpeedRecordingError(f"argument {arg!r} names no input")
        if kind == "scratch" and not (_is_int(arg[1]) and 0 <= arg[1] < num_scratch
                                      and _is_int(arg[2]) and arg[2] >= 0):
            raise SpeedRecordingError(f"argument {arg!r} names no scratch buffer")
        if kind in ("i32", "i64") and not _is_int(arg[1]):
            raise SpeedRecordingError(f"argument {arg!r} is not an integer")
        if kind == "f32" and not isinstance(arg[1], (int, float)):
            raise SpeedRecordingError(f"argument {arg!r} is not a number")
    return {**launch, "path": str(resolved)}


# ----------------------------------------------------------------------------- recording


def record_stage(stage: SpeedStage, isolated: bool) -> dict:
    """Records ``stage``'s launcher where student code may run (never in this process).

    Returns:
        The recording (untrusted), or ``{"error": ...}``.
    """
    from reference.grader import speed_record

    spec = stage.workload.spec()
    if isolated:
        from reference.grader import proxy

        from reference.grader.sandbox import ISOLATED_ENV, ensure_worker_user, kill_worker_processes

        try:
            client = proxy.WorkerClient(stage.lab)
        except Exception as exc:  # noqa: BLE001 — e.g. the student's module does not import
            return {"error": f"recording failed: {type(exc).__name__}: {exc}"[:500]}
        try:
            result = proxy.gather(speed_record.record, client.module, stage.launcher, spec)
        except Exception as exc:  # noqa: BLE001 — the stage scores 0 with the reason
            result = {"error": f"recording failed: {type(exc).__name__}: {exc}"[:500]}
        finally:
            client.kill("speed recording done")
        # NOTE: and whatever it started: nothing of the student's may share the GPU with the
        # timing.
        how = os.environ.get(ISOLATED_ENV)
        try:
            kill_worker_processes(how if how in ("root", "sudo") else ensure_worker_user())
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


# ----------------------------------------------------------------------------- timing (child)


def _pool_inputs(spec: dict, num_sets: int):
    """K/V pools, one pair per launch of a pass, and the batch's shared int inputs.

    NOTE: a pair per launch, not one shared pool: a kernel that derived something from the
    cache in one launch (a compressed copy, say) and reused it in the next would have its
    work done outside the time; with its own pool, each timed launch reads memory no earlier
    launch of the pass read, and every pass refills them all.
    """
    import torch

    bs, hkv, d = spec["block_size"], spec["num_kv_heads"], spec["head_size"]
    lens = np.asarray(spec["context_lens"], dtype=np.int64)
    needed = int((-(-lens // bs)).sum())
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

    lens = np.asarray(spec["context_lens"], dtype=np.int64)
    per_seq = -(-lens // spec["block_size"])
    chosen = torch.randperm(num_pool_blocks, generator=gen)[:needed].to(torch.int32)
    table = torch.full((len(lens), int(per_seq.max())), -1, dtype=torch.int32)
    start = 0
    for s, n in enumerate(per_seq):
        table[s, :n] = chosen[start:start + n]
        start += n
    rows = len(lens) if spec["kind"] == "decode" else int(sum(spec["query_lens"]))
    q = torch.randn((rows, spec["num_q_heads"], spec["head_size"]), generator=gen)
    return {"query": q.to(torch.float16).cuda(), "block_tables": table.cuda(),
            "out": torch.empty((rows, spec["num_q_heads"], spec["head_size"]),
                               dtype=torch.float16, device="cuda")}


def oracle(spec: dict, inputs: dict):
    """The float64 attention of one launch's inputs, on the GPU, returned in host memory.

    Decode: one query token per sequence attends to its whole context; prefill: each new
    token attends causally to the history and the new tokens up to itself.
    """
    import torch

    q, kc, vc = inputs["query"], inputs["key_cache"], inputs["value_cache"]
    table, scale, bs = inputs["block_tables"], spec["scale"], spec["block_size"]
    hq, hkv = spec["num_q_heads"], spec["num_kv_heads"]
    group, d = hq // hkv, spec["head_size"]
    out = torch.empty(q.shape, dtype=torch.float64, device="cuda")
    q_start = 0
    for s, ctx in enumerate(spec["context_lens"]):
        blocks = table[s, :-(-ctx // bs)].long()

        def gather(cache):  # [Hkv, ctx, D]
            return cache[blocks].double().permute(1, 0, 2, 3).reshape(hkv, -1, d)[:, :ctx]

        k, v = gather(kc), gather(vc)
        q_len = 1 if spec["kind"] == "decode" else spec["query_lens"][s]
        rows = q[q_start:q_start + q_len].double()  # [q_len, Hq, D]
        qg = rows.view(q_len, hkv, group, d).permute(1, 2, 0, 3)  # [Hkv, G, q_len, D]
        scores = torch.einsum("hgqd,hkd->hgqk", qg, k) * scale
        if spec["kind"] == "prefill":
            history = ctx - q_len
            visible = (torch.arange(ctx, device="cuda")[None, :]
                       <= history + torch.arange(q_len, device="cuda")[:, None])
            scores = scores.masked_fill(~visible, -math.inf)
        o = torch.einsum("hgqk,hkd->hgqd", scores.softmax(-1), v)  # [Hkv, G, q_len, D]
        out[q_start:q_start + q_len] = o.permute(2, 0, 1, 3).reshape(q_len, hq, d)
        q_start += q_len
    return out.cpu()


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
        if launch["shared_mem"] and kernel.max_dynamic_shared_size_bytes < launch["shared_mem"]:
            kernel.max_dynamic_shared_size_bytes = launch["shared_mem"]
    # NOTE: fresh seeds per run: the inputs cannot be known when the kernel is written.
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    device_gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    pools, shared, needed = _pool_inputs(spec, NUM_SETS + 1)  # [0]: the warm-up's
    # Scratch with recorded content (a work list, a zeroed counter) is the launcher's per call:
    # each launch gets its own copy, restored every pass. Scratch without is shared, 0xFF.
    contents = [None if s["content"] is None else
                torch.frombuffer(bytearray.fromhex(s["content"]), dtype=torch.uint8)
                for s in rec["scratch"]]
    scratch = [[torch.full((s["nbytes"],), 0xFF, dtype=torch.uint8, device="cuda")
                for s in rec["scratch"]] for _ in range(NUM_SETS + 1)]
    for per_set in scratch:
        for i, c in enumerate(contents):
            if c is None:
                per_set[i] = scratch[0][i]
            else:
                per_set[i].copy_(c)
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
        # NOTE: the oracle's buffers go back to the driver (unmapped, unreadable), so no kernel
        # can find an answer in memory torch kept cached.
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
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
            else:
                args.append(np.float32(arg[1]))
        out.append(tuple(args))
    return out


def _launch_all(kernels: list, launches: list, calls: list) -> None:
    from reference import cuda as rcuda

    for kernel, launch, args in zip(kernels, launches, calls):
        rcuda.launch(kernel, tuple(launch["grid"]), tuple(launch["block"]), args,
                     launch["shared_mem"])


def run_replay_child(stage: SpeedStage, recording: dict) -> dict:
    """Runs :func:`replay` in a fresh child process (no student Python is ever imported there).

    Returns:
        :func:`replay`'s result, or ``{"ok": False, "message"}`` when the child crashed (an
        illegal address kills its CUDA context), hung past REPLAY_TIMEOUT_S or printed no result.
    """
    job = {"spec": stage.workload.spec(), "recording": recording, "ceiling": stage.ceiling,
           "work": stage.workload.work()}
    with tempfile.TemporaryDirectory(prefix="pagedlab-speed-") as tmp:
        job_path, result_path = Path(tmp, "job.json"), Path(tmp, "result.json")
        job_path.write_text(json.dumps(job))
        try:
            done = subprocess.run([sys.executable, "-m", "reference.grader.speed", str(job_path),
                                   str(result_path)], capture_output=True, text=True,
                                  timeout=REPLAY_TIMEOUT_S, cwd=REPO_ROOT)
        except subprocess.TimeoutExpired:
            return {"ok": False, "message": f"the timed launches took over {REPLAY_TIMEOUT_S} s "
                                            "(a kernel that never finishes?)"}
        if result_path.is_file():
            return json.loads(result_path.read_text())
        return {"ok": False, "message": f"the timing process died (exit {done.returncode}): "
                                        f"{done.stderr.strip()[-400:]}"}


def _child_main(job_path: str, result_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    try:
        result = replay(job)
    except Exception as exc:  # noqa: BLE001 — e.g. a compile error: reported, the stage scores 0
        result = {"ok": False, "message": f"{type(exc).__name__}: {exc}"[:600]}
    Path(result_path).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- grading


def grade_stage(stage: SpeedStage, isolated: bool) -> dict:
    """Records, checks and times one stage.

    Returns:
        ``{"stage", "lab", "workload", "ok", "us", "fraction", "points", "max_points",
        "message"}``.
    """
    result = {"lab": stage.lab, "stage": stage.stage, "workload": stage.workload.name,
              "ceiling_kind": stage.ceiling, "max_points": sum(p for _, p in stage.tiers)}
    try:
        recording = check_recording(record_stage(stage, isolated), stage.lab)
    except SpeedRecordingError as exc:
        return {**result, "ok": False, "points": 0, "message": f"not timed: {exc}"}
    timed = run_replay_child(stage, recording)
    points = sum(p for t, p in stage.tiers if timed.get("ok") and timed["fraction"] >= t)
    return {**result, **timed, "points": points}


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
            if not r.get("ok"):
                rec.fail(r.get("message") or "not timed")
            elif r["fraction"] < threshold:
                rec.fail(f"{r['us']:.1f} µs = {r['fraction']:.1%} of the {stage.ceiling} "
                         f"ceiling; this tier needs {threshold:.1%}")
            records.append(rec)
    return records


def grade_speed(labs: list[str], isolated: bool, *, stages: list[str] | None = None) -> list[dict]:
    """Grades every speed stage of ``labs`` (optionally only the named stages).

    Raises:
        RuntimeError: no CUDA GPU here (speed is graded on a GPU runner).
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("speed is graded on a CUDA GPU; this machine has none")
    return [grade_stage(s, isolated) for s in SPEED_STAGES
            if s.lab in labs and (stages is None or s.stage in stages)]


def load_speed_mutants(lab: str | None = None) -> list:
    """The speed mutants (``solutions/<lab>/speed_mutants/*.toml``): kernels that would look
    fast to a careless timer — they return early, write nothing, skip work or replay a cached
    result — each of which speed grading must score 0 (``tests/test_speed_gpu.py``).

    Returns:
        :class:`reference.grader.mutants.Mutant` items, ``caught_by`` = ``["speed:<stage>"]``.

    Raises:
        MutantSpecError: a spec lacks its stage, mistake or edits.
    """
    from reference.grader.mutants import Edit, Mutant, MutantSpecError
    from reference.paths import SOLUTIONS_DIR, load_toml

    out = []
    for path in sorted(SOLUTIONS_DIR.glob(f"{lab or 'lab*'}/speed_mutants/*.toml")):
        data = load_toml(path.read_text())
        try:
            edits = [Edit(e["file"], e["old"], e["new"]) for e in data["edit"]]
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


if __name__ == "__main__":
    sys.exit(_child_main(*sys.argv[1:3]))
