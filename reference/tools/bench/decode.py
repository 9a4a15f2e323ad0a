"""``pagedlab bench decode``: Lab 4's decode kernels against the copy ceiling, torch SDPA and
FlashInfer, in one run on one GPU.

For each workload of ``reference/tools/bench/decode_workloads.py`` it measures, in this order:

* the device copy ceiling (a 2 GiB device-to-device copy; bytes read + written per second);
* torch SDPA on contiguous K/V (no paging: the reference a paged kernel should approach);
* gather the pages into contiguous K/V, then SDPA (the "just use torch" baseline);
* FlashInfer's batch decode, CUDA-core and tensor-core paths, when FlashInfer imports;
* the naive baseline and every kernel version of the lab (``LAB_IMPL`` picks starter or
  solution), and ``paged_attention``, the production entry point (v6 from a GQA group of
  ``V6_MIN_GROUP``, else v4; each of its rows records which as ``kernel``);
  ``--variants`` adds a few compile-time variants of v4 and v6; ``--methods`` picks versions.

Bytes counted = the K and V rows of every cached token (sum of context_lens x kv heads x head
size x 2 bytes x 2) + the query + the output. Each method's output is compared with SDPA's.
Timing: CUDA events around a captured CUDA graph of back-to-back calls (no launch gaps, no
Python overhead), median of repeats; a method whose capture fails is timed eagerly, and the
row says so. ``paged_attention``, ``paged_attention plan.run`` (``plan_decode`` made once, then
``run`` into a preallocated output) and FlashInfer's wrappers also get ``eager µs`` (CUDA events
around back-to-back eager calls: what an uncaptured loop sees) and ``host µs`` (CPU time per
call without a sync: ``time.perf_counter`` around 200 calls queued behind 50 ms of GPU work,
``_gpu.host_us_per_call``). The table goes to stdout, JSON and a PNG to ``--out``.

Targets (``decode_workloads.py``), checked at the end of the run: ``plan.run`` at least 1.0 x
FlashInfer's best path, as graph replays and as eager calls, with at most 25 µs of host time per
call; ``paged_attention`` at its share of the copy ceiling. The "× FlashInfer" of a verdict
is not the table's (each method timed once, one after another) but the median of rounds in
which ``plan.run``, ``paged_attention`` and both FlashInfer paths are timed in turn, in
orders balanced for position and predecessor (8 rounds as graphs, 6 eager; ``paired.py`` says
why); the JSON's ``paired`` keeps every round and its order.
"""

from __future__ import annotations

import argparse
import inspect
import math
import time

import numpy as np

from reference.tools.bench._common import DEFAULT_OUT, format_table, machine_info, try_pyplot, write_results
from reference.tools.bench._gpu import copy_ceiling_gbps, flashinfer_or_reason, launch_costs, measure
from reference.tools.bench.decode_workloads import (DECODE_WORKLOADS, HOST_US_TARGET, SWEEP_CONTEXT_LENS,
                                        SWEEP_NUM_SEQS, TARGET_OF_CEILING, TARGET_VS_FLASHINFER,
                                        DecodeWorkload)
from reference.tools.bench.paired import graph_and_eager_rounds, mark, round_ratios, summary, verdict
from reference.loader import describe_impl, load_impl

LAB = "lab04_decode_kernels"
VERSIONS = ("naive", "v0", "v1", "v2", "v3", "v4", "v5", "v6")
SPLIT_K = ("v3", "v4", "v5", "v6", "paged_attention")
#: v4 compile-time variants measured beside the default (``tuning=`` of paged_attention_v4; the
#: names its kernel description, _launch.V4_KERNEL, lists as tunable).
V4_VARIANTS = (
    {"VECS_PER_LANE": 8},
    {"NUM_WARPS": 8},
    {"MAX_HEADS_PER_CTA": 4},
    {"MAX_HEADS_PER_CTA": 2, "VECS_PER_LANE": 8},
)
#: v6 variants: compile-time options (``tuning=`` of paged_attention_v6) and PARTITION, a forced
#: split-K partition length in tokens.
V6_VARIANTS = (
    {"NUM_STAGES": 2},
    {"NUM_STAGES": 4},
    {"NUM_WARPS": 8},
    {"NUM_WARPS": 2},
    {"PARTITION": 1024},
    {"PARTITION": 2048},
    {"NUM_STAGES": 2, "PARTITION": 2048},
)
ERR_LIMIT = 2e-2  # max |out - SDPA| accepted for fp16 (both round to fp16)


def build_batch(w: DecodeWorkload, seed: int = 0) -> dict:
    """Random fp16 paged K/V for a workload on the GPU: shuffled physical blocks."""
    import torch

    lens = w.context_lens()
    per_seq = -(-lens.astype(np.int64) // w.block_size)
    num_blocks = int(per_seq.sum()) + 8
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (num_blocks, w.num_kv_heads, w.block_size, w.head_size)
    key_cache = torch.randn(shape, dtype=torch.float16, device="cuda", generator=gen)
    value_cache = torch.randn(shape, dtype=torch.float16, device="cuda", generator=gen)
    query = torch.randn((w.num_seqs, w.num_q_heads, w.head_size), dtype=torch.float16,
                        device="cuda", generator=gen)
    perm = np.random.default_rng(seed).permutation(num_blocks).astype(np.int32)
    table = np.full((w.num_seqs, int(per_seq.max())), -1, dtype=np.int32)
    start = 0
    for s, n in enumerate(per_seq):
        table[s, :n] = perm[start:start + n]
        start += n
    return dict(query=query, key_cache=key_cache, value_cache=value_cache,
                block_tables=torch.from_numpy(table).cuda(), context_lens=torch.from_numpy(lens).cuda(),
                lens=lens, host_table=table, scale=1.0 / math.sqrt(w.head_size))


def gather_contiguous(cache, block_tables):
    """[num_blocks, Hkv, bs, D] pages -> [num_seqs, Hkv, max_blocks * bs, D] (padding: block 0)."""
    pages = cache[block_tables.clamp(min=0).long()]  # [S, nb, Hkv, bs, D]
    s, nb, h, bs, d = pages.shape
    return pages.permute(0, 2, 1, 3, 4).reshape(s, h, nb * bs, d)


def sdpa_fn(batch, w: DecodeWorkload, gather: bool):
    """SDPA on contiguous K/V (gathered once), or gathering inside every call."""
    import torch
    import torch.nn.functional as F

    lens = batch["lens"]
    max_len = batch["host_table"].shape[1] * w.block_size
    mask = None
    if (lens != max_len).any():
        pos = torch.arange(max_len, device="cuda")
        mask = (pos[None, :] < batch["context_lens"][:, None].long())[:, None, None, :]
    q4 = batch["query"].unsqueeze(2)  # [S, Hq, 1, D]
    gqa = w.num_q_heads != w.num_kv_heads

    def attend(k, v):
        return F.scaled_dot_product_attention(q4, k, v, attn_mask=mask, scale=batch["scale"],
                                              enable_gqa=gqa).squeeze(2)

    if gather:
        return lambda: attend(gather_contiguous(batch["key_cache"], batch["block_tables"]),
                              gather_contiguous(batch["value_cache"], batch["block_tables"]))
    k = gather_contiguous(batch["key_cache"], batch["block_tables"])
    v = gather_contiguous(batch["value_cache"], batch["block_tables"])
    return lambda: attend(k, v)


def flashinfer_fns(fi, batch, w: DecodeWorkload) -> dict:
    """FlashInfer's paged decode (HND layout = ours), CUDA-core and tensor-core paths."""
    import torch

    lens = batch["lens"].astype(np.int64)
    pages = -(-lens // w.block_size)
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32, device="cuda")
    indices = torch.tensor(np.concatenate([batch["host_table"][s, :n] for s, n in enumerate(pages)]),
                           dtype=torch.int32, device="cuda")
    last = torch.tensor(lens - (pages - 1) * w.block_size, dtype=torch.int32, device="cuda")
    out = {}
    for tc in (False, True):
        name = "flashinfer-tc" if tc else "flashinfer"
        try:
            ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
            wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=tc)
            wrapper.plan(indptr, indices, last, w.num_q_heads, w.num_kv_heads, w.head_size,
                         w.block_size, pos_encoding_mode="NONE", q_data_type=torch.float16,
                         kv_data_type=torch.float16, sm_scale=batch["scale"])
            kv = (batch["key_cache"], batch["value_cache"])
            out[name] = (lambda wr=wrapper, kv=kv: wr.run(batch["query"], kv), None)
        except Exception as exc:  # noqa: BLE001 — recorded in the results instead
            out[name] = (None, f"{type(exc).__name__}: {exc}"[:300])
    return out


def max_err(out, ref) -> float:
    import torch

    if isinstance(out, tuple):
        out = out[0]
    out = torch.as_tensor(out) if not hasattr(out, "float") else out
    diff = (out.float() - ref.float()).abs()
    return float("nan") if not torch.isfinite(out.float()).all() else float(diff.max())


def run_workload(w: DecodeWorkload, impl, fi, ceiling: float, variants: bool,
                 only: list[str] | None = None, paired: list[dict] | None = None) -> list[dict]:
    """Every method (or the kernel versions in ``only``) on one workload; one row per method.

    With ``paired`` (a list), the production path and FlashInfer are then timed again in
    alternation (:func:`paired_rounds`) and the result is appended to it."""
    import torch

    batch = build_batch(w)
    nbytes = w.kv_bytes() + 2 * batch["query"].numel() * 2
    args = (batch["query"], batch["key_cache"], batch["value_cache"], batch["block_tables"],
            batch["context_lens"])
    max_len = int(batch["lens"].max())
    methods: list[tuple[str, object, str | None]] = [
        ("sdpa (contiguous)", sdpa_fn(batch, w, gather=False), None),
        ("gather + sdpa", sdpa_fn(batch, w, gather=True), None),
    ]
    if fi is not None:
        methods += [(name, fn, why) for name, (fn, why) in flashinfer_fns(fi, batch, w).items()]
    for version in (*VERSIONS, "paged_attention"):
        fn = impl.KERNELS.get(version) or getattr(impl, version, None)
        if fn is None or (only is not None and version not in only):
            continue
        kwargs = {"max_context_len": max_len} if version in SPLIT_K else {}
        methods.append((version, lambda fn=fn, kw=kwargs: fn(*args, batch["scale"], **kw), None))
    plan_run = plan_run_method(impl, args, batch["scale"], max_len, only)
    if plan_run is not None:
        methods.append(plan_run)
    if variants:
        for version, tunings in (("v4", V4_VARIANTS), ("v6", V6_VARIANTS)):
            methods += variant_methods(impl, version, tunings, w, args, batch["scale"], max_len)

    rows, ref = [], None
    for name, fn, why in methods:
        row = {"workload": w.name, "method": name, "bytes": nbytes}
        if fn is None:
            row["note"] = why
            rows.append(row)
            continue
        try:
            us, how, out = measure(fn)
            if ref is None:
                ref = out.clone()
            row.update(us=us, gbps=nbytes / (us * 1e-6) / 1e9, timing=how, max_err=max_err(out, ref))
            row["pct_ceiling"] = 100 * row["gbps"] / ceiling
            if name in LAUNCH_COST_METHODS:
                row.update(launch_costs(fn))
        except Exception as exc:  # noqa: BLE001 — a broken method is a row, not a crash
            torch.cuda.synchronize()
            row["note"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(f"  {w.name:3s} {name:28s} "
              + (f"{row['us']:10.1f} us {row['pct_ceiling']:6.1f} %  err {row['max_err']:.1e}  ({row['timing']})"
                 if "us" in row else row.get("note", ""))
              + (f"  eager {row['eager_us']:.1f} us, host {row['host_us']:.1f} us"
                 if "host_us" in row else ""), flush=True)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    for row in rows:
        if row["method"] in SPLIT_K:
            row["plan"] = plan_label(impl, row["method"], w, batch, max_len, num_sms)
        if row["method"] in ("paged_attention", PLAN_RUN):
            row["kernel"] = dispatched_kernel(impl, batch)
    _add_ratios(rows)
    if paired is not None:
        # Only launchers the table timed as graphs: one that failed, or fell back to eager
        # timing (its capture failed, e.g. PAGEDLAB_DEBUG's device reads), is left out.
        graphed = {r["method"] for r in rows if r.get("timing") == "graph"}
        entry = paired_rounds(w.name, {name: fn for name, fn, _ in methods
                                       if fn is not None and name in graphed})
        if entry is not None:
            paired.append(entry)
    del batch, args, methods, ref
    torch.cuda.empty_cache()
    return rows


#: Rows that also get eager and host-µs timings (launch_costs): the production entry point
#: one-call and planned, and FlashInfer's wrappers (whose run is its planned path).
PLAN_RUN = "paged_attention plan.run"
LAUNCH_COST_METHODS = ("flashinfer", "flashinfer-tc", "paged_attention", PLAN_RUN)


def plan_run_method(impl, args, scale: float, max_len: int, only: list[str] | None):
    """(PLAN_RUN, fn, why) timing ``plan_decode(...).run`` into a preallocated output (the plan
    made once, outside the timing), or None for an implementation without plan_decode."""
    if not hasattr(impl, "plan_decode") or (only is not None and PLAN_RUN not in only
                                            and "paged_attention" not in only):
        return None
    try:
        plan = impl.plan_decode(*args, scale, max_context_len=max_len)
    except NotImplementedError:
        return None  # a starter without its TODOs: the one-call rows say which
    out = args[0].new_empty(args[0].shape)
    return PLAN_RUN, lambda: plan.run(*args, out=out), None


def dispatched_kernel(impl, batch: dict) -> str | None:
    """The kernel ``paged_attention`` (and a plan made without ``version``) picks for the batch:
    "v6" or "v4", or None for a starter without its dispatch yet."""
    from reference import cuda as rcuda

    try:
        v6 = (impl._prefers_v6(batch["query"], batch["key_cache"])
              and rcuda.runs_sm80_stages(batch["query"]))
    except (AttributeError, NotImplementedError):
        return None
    return "v6" if v6 else "v4"


def plan_label(impl, method: str, w: DecodeWorkload, batch: dict, max_len: int,
               num_sms: int) -> str | None:
    """The split-K plan a launcher chose, as "partitions x tokens" (v6 plans with its own
    target and cap; paged_attention with its kernel's)."""
    try:
        uses_v6 = method == "v6" or (method == "paged_attention"
                                     and dispatched_kernel(impl, batch) == "v6")
        kwargs = ({"target_ctas_per_sm": impl.V6_TARGET_CTAS_PER_SM,
                   "max_partition_size": impl.V6_MAX_PARTITION_SIZE} if uses_v6 else {})
        plan = impl.plan_split_kv(w.num_seqs, w.num_kv_heads, max_len, num_sms,
                                  block_size=w.block_size, **kwargs)
    except NotImplementedError:
        return None  # a starter without its plan (or its dispatch) yet
    return f"{plan.num_partitions} x {plan.partition_size}"


def variant_methods(impl, version: str, tunings, w: DecodeWorkload, args, scale: float,
                    max_len: int) -> list:
    """(label, fn, None) for each variant of ``version`` (v4 or v6) that applies to the workload.

    A variant is -D options for the kernel, passed as the launcher's ``tuning=`` argument, plus,
    optionally, PARTITION: a forced split-K partition length (its ``plan=``). A launcher without
    a ``tuning`` parameter (an older starter) gets no variants.
    """
    launcher = getattr(impl, f"paged_attention_{version}", None)
    if launcher is None or "tuning" not in inspect.signature(launcher).parameters:
        return []
    group = w.num_q_heads // w.num_kv_heads
    try:
        hpc = impl.heads_per_cta(group)
    except NotImplementedError:  # a starter without task 4.2 yet: its launchers fail anyway
        return []
    out = []
    for tuning in tunings:
        tuning = dict(tuning)
        if "MAX_HEADS_PER_CTA" in tuning and hpc <= tuning["MAX_HEADS_PER_CTA"]:
            continue  # the variant would change nothing here
        size = tuning.pop("PARTITION", None)
        plan = None if size is None else impl.SplitKVPlan(-(-max_len // size), size)

        def run_variant(tuning=tuning, plan=plan):
            return launcher(*args, scale, max_context_len=max_len, plan=plan, tuning=tuning or None)

        label = f"{version} " + ",".join([f"{k.lower()}={v}" for k, v in tuning.items()]
                                         + ([f"partition={size}"] if size else []))
        out.append((label, run_variant, None))
    return out


def _add_ratios(rows: list[dict]) -> None:
    timed = {r["method"]: r["us"] for r in rows if "us" in r}
    sdpa = timed.get("sdpa (contiguous)")
    fi = [timed[m] for m in ("flashinfer", "flashinfer-tc") if m in timed]
    best_fi = min(fi) if fi else None
    for r in rows:
        if "us" in r:
            r["vs_sdpa"] = sdpa / r["us"] if sdpa else None
            r["vs_flashinfer"] = best_fi / r["us"] if best_fi else None
        if r["method"] in ("flashinfer", "flashinfer-tc") and best_fi is not None and "us" in r:
            r["flashinfer_best"] = r["us"] == best_fi
        if "max_err" in r and not (r["max_err"] <= ERR_LIMIT):
            r["note"] = (r.get("note", "") + f" WRONG: max error {r['max_err']:.2e} vs SDPA").strip()


#: ``--groups``: v4 against v6 by GQA group on one batch shape (32 sequences x 2048 tokens, 8 KV
#: heads, query heads 8 x group), to place ``V6_MIN_GROUP`` on your GPU.
GROUP_SWEEP = (1, 2, 3, 4, 6, 8)


def run_group_sweep(impl) -> list[dict]:
    """v4 and v6 timed per GQA group, and the kernel ``paged_attention`` picks for it."""
    import torch

    out = []
    for group in GROUP_SWEEP:
        w = DecodeWorkload(f"group{group}", "group sweep", 32, 8 * group, 8, 2048)
        batch = build_batch(w, seed=group)
        args = (batch["query"], batch["key_cache"], batch["value_cache"], batch["block_tables"],
                batch["context_lens"])
        row = {"group": group, "num_q_heads": w.num_q_heads, "picks": dispatched_kernel(impl, batch)}
        for version in ("v4", "v6"):
            fn = impl.KERNELS[version]
            try:
                row[version] = measure(lambda: fn(*args, batch["scale"], max_context_len=2048))[0]
            except Exception as exc:  # noqa: BLE001 — an unfinished kernel is a note
                torch.cuda.synchronize()
                row[f"{version}_note"] = f"{type(exc).__name__}: {exc}"[:200]
        timed = [v for v in ("v4", "v6") if v in row]
        faster = min(timed, key=row.get) if timed else None
        print(f"  group {group}: " + ", ".join(f"{v} {row[v]:.1f} us" for v in timed)
              + f"; paged_attention picks {row['picks']}"
              + (f" (the faster is {faster})" if faster and row["picks"] != faster else ""),
              flush=True)
        out.append(row)
        del batch, args
        torch.cuda.empty_cache()
    return out


def run_sweep(impl, fi) -> list[dict]:
    """Bandwidth vs context length: 16 sequences, GQA 32q/8kv, for the notebook's plot."""
    import torch

    out = []
    for ctx in SWEEP_CONTEXT_LENS:
        w = DecodeWorkload(f"sweep{ctx}", "sweep", SWEEP_NUM_SEQS, 32, 8, ctx)
        batch = build_batch(w, seed=ctx)
        args = (batch["query"], batch["key_cache"], batch["value_cache"], batch["block_tables"],
                batch["context_lens"])
        nbytes = w.kv_bytes() + 2 * batch["query"].numel() * 2
        fns = {"sdpa (contiguous)": sdpa_fn(batch, w, gather=False)}
        if fi is not None:
            fns.update({k: f for k, (f, _) in flashinfer_fns(fi, batch, w).items() if f is not None})
        for version in ("v1", "v2", "v3", "v4", "v5", "v6"):
            if version not in impl.KERNELS:
                continue
            kw = {"max_context_len": ctx} if version in SPLIT_K else {}
            fns[version] = lambda fn=impl.KERNELS[version], kw=kw: fn(*args, batch["scale"], **kw)
        for name, fn in fns.items():
            try:
                us, how, _ = measure(fn)
                out.append({"context_len": ctx, "method": name, "us": us,
                            "gbps": nbytes / (us * 1e-6) / 1e9, "timing": how})
            except Exception as exc:  # noqa: BLE001
                torch.cuda.synchronize()
                out.append({"context_len": ctx, "method": name, "note": str(exc)[:200]})
        del batch, args, fns
        torch.cuda.empty_cache()
        print(f"  sweep context {ctx}: done", flush=True)
    return out


#: FlashInfer's decode paths; a round's reference is the faster of the two.
FLASHINFER_METHODS = ("flashinfer", "flashinfer-tc")


def paired_rounds(workload: str, fns: dict) -> dict | None:
    """The production path against FlashInfer's best, timed in alternation (``paired.py``).

    Graph replays: ``plan.run``, the one-call ``paged_attention`` and both FlashInfer paths
    (8 rounds); eager calls: ``plan.run`` and both FlashInfer paths (6 rounds).

    Returns:
        ``{"workload", "graph", "one_call_graph", "eager", "times"}`` (each a :func:`summary` of
        "× FlashInfer best" per round; ``times`` keeps every round and its order), None without
        FlashInfer or a plan, or ``{"workload", "error"}`` when the rounds failed.
    """
    refs = [m for m in FLASHINFER_METHODS if m in fns]
    if PLAN_RUN not in fns or not refs:
        return None
    rounds = graph_and_eager_rounds(
        workload, {m: fns[m] for m in (PLAN_RUN, "paged_attention", *refs) if m in fns},
        {m: fns[m] for m in (PLAN_RUN, *refs)})
    if "error" in rounds:
        return rounds
    graph, eager = rounds["graph"], rounds["eager"]
    entry = {"workload": workload, "graph": summary(round_ratios(graph, PLAN_RUN, refs)),
             "eager": summary(round_ratios(eager, PLAN_RUN, refs)),
             "times": {"graph": graph, "eager": eager}}
    if "paged_attention" in graph:
        entry["one_call_graph"] = summary(round_ratios(graph, "paged_attention", refs))
    print(f"  {workload:3s} paired ({entry['graph']['rounds']} balanced rounds): plan.run "
          f"{entry['graph']['x']:.3f} x "
          f"FlashInfer best as graphs ({entry['graph']['low']:.3f}-{entry['graph']['high']:.3f}), "
          f"{entry['eager']['x']:.3f} x eager ({entry['eager']['low']:.3f}-"
          f"{entry['eager']['high']:.3f})", flush=True)
    return entry


def target_report(rows: list[dict], paired: list[dict] | None = None) -> list[dict]:
    """Per workload: ``paged_attention`` against its share of the copy ceiling, and
    ``plan.run`` against FlashInfer's best (paired rounds, graph and eager) and the host-time
    target. Each check is a :func:`paired.verdict` (``met`` None where not measured)."""
    by_workload = {p["workload"]: p for p in paired or () if "graph" in p}
    report = []
    for name in dict.fromkeys(r["workload"] for r in rows
                              if r["method"] in ("paged_attention", PLAN_RUN) and "us" in r):
        one_call = next((r for r in rows if r["workload"] == name
                         and r["method"] == "paged_attention" and "us" in r), None)
        p = by_workload.get(name)
        host = next((x.get("host_us") for x in rows
                     if x["workload"] == name and x["method"] == PLAN_RUN), None)
        entry = {"workload": name, "pct_ceiling": one_call["pct_ceiling"] if one_call else None}
        need = TARGET_OF_CEILING.get(name)
        if need is not None and one_call is not None:
            entry["ceiling"] = verdict(one_call["pct_ceiling"], 100 * need)
        entry["graph"] = verdict(p["graph"]["x"] if p else None, TARGET_VS_FLASHINFER)
        entry["eager"] = verdict(p["eager"]["x"] if p else None, TARGET_VS_FLASHINFER)
        entry["host_us"] = verdict(host, HOST_US_TARGET, at_most=True)
        report.append(entry)
    return report


def print_targets(report: list[dict], paired: list[dict]) -> None:
    """Prints :func:`target_report`, one line per workload."""
    by_workload = {p["workload"]: p for p in paired}
    print(f"targets: plan.run >= {TARGET_VS_FLASHINFER} x FlashInfer's best (median of balanced "
          f"rounds: 8 as graphs, 6 eager), host <= {HOST_US_TARGET:.0f} us per run; "
          f"paged_attention's share of the copy ceiling")
    for t in report:
        p = by_workload.get(t["workload"])
        line = f"  {t['workload']:3s}"
        if p and "error" in p:
            line += f" paired rounds failed ({p['error']})"
        elif p is None:
            line += " not paired (no FlashInfer, or a launcher not timed as a graph)"
        else:
            line += (f" graph {p['graph']['x']:.3f} ({p['graph']['low']:.3f}-{p['graph']['high']:.3f}) "
                     f"{mark(t['graph'])}, eager {p['eager']['x']:.3f} ({p['eager']['low']:.3f}-"
                     f"{p['eager']['high']:.3f}) {mark(t['eager'])}")
        if t["host_us"]["figure"] is not None:
            line += f", host {t['host_us']['figure']:.1f} us {mark(t['host_us'])}"
        if t["pct_ceiling"] is not None:
            line += f", {t['pct_ceiling']:.1f} % of the copy ceiling"
        if "ceiling" in t:
            line += f" (target {t['ceiling']['target']:.0f} %: {mark(t['ceiling'])})"
        print(line)


def plot(payload: dict, path) -> None:
    plt = try_pyplot()
    if plt is None:
        return
    rows = [r for r in payload["rows"]  # tuning variants stay in the table, out of the plot
            if "pct_ceiling" in r and not r["method"].startswith(("v4 ", "v6 "))]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5.6), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / max(1, len(methods))
    colors = plt.get_cmap("tab20").colors  # one colour per method: the default cycle has 10
    for i, m in enumerate(methods):
        ys = [next((r["pct_ceiling"] for r in rows if r["workload"] == wl and r["method"] == m), 0)
              for wl in workloads]
        ax1.bar(np.arange(len(workloads)) + i * width, ys, width, label=m,
                color=colors[i % len(colors)])
    ax1.set_xticks(np.arange(len(workloads)) + 0.4 - width / 2, workloads)
    ax1.set_ylabel("% of device copy ceiling")
    ax1.set_ylim(0, 110)
    ax1.axhline(100, color="gray", lw=0.8, ls="--")
    ax1.legend(fontsize=7, ncol=7, loc="upper center", bbox_to_anchor=(0.5, -0.07))
    m = payload["machine"]
    ax1.set_title(f"decode, fp16, head 128, block 16 — {m.get('device')} {m.get('date')}", fontsize=9)
    sweep = [r for r in payload.get("sweep", []) if "gbps" in r]
    for i, name in enumerate(dict.fromkeys(r["method"] for r in sweep)):
        pts = [(r["context_len"], r["gbps"]) for r in sweep if r["method"] == name]
        ax2.plot(*zip(*pts), marker="o", label=name, color=colors[i % len(colors)])
    ax2.axhline(payload["copy_ceiling_gbps"], color="gray", lw=0.8, ls="--", label="copy ceiling")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("context length (16 seqs, 32q/8kv)")
    ax2.set_ylabel("GB/s")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


COLUMNS = [("workload", "wl", ""), ("method", "method", ""), ("us", "µs", ".1f"),
           ("eager_us", "eager µs", ".1f"), ("host_us", "host µs", ".1f"),
           ("gbps", "GB/s", ".0f"), ("pct_ceiling", "% copy", ".1f"), ("vs_sdpa", "× SDPA", ".2f"),
           ("vs_flashinfer", "× FI best", ".2f"), ("max_err", "max err", ".1e"),
           ("plan", "split", ""), ("note", "note", "")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pagedlab bench decode", description=__doc__)
    parser.add_argument("--workloads", nargs="*", default=[w.name for w in DECODE_WORKLOADS],
                        help="workloads to time (none: only the sweeps)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the context-length sweep")
    parser.add_argument("--groups", action="store_true",
                        help="also time v4 against v6 for GQA groups 1-8 (where V6_MIN_GROUP "
                             "belongs on this GPU)")
    parser.add_argument("--variants", action="store_true",
                        help="also time v4's and v6's tuning variants")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="time only these kernel versions (e.g. v4 v6 paged_attention); the "
                             "references (SDPA, FlashInfer) always run")
    parser.add_argument("--no-flashinfer", action="store_true")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for decode.json / .png")
    args = parser.parse_args(argv)
    from reference.gpu import gpu_skip_reason

    if gpu_skip_reason():
        print(f"pagedlab bench decode needs a GPU: {gpu_skip_reason()}")
        return 2
    impl = load_impl(LAB)
    fi, fi_reason = (None, "disabled (--no-flashinfer)") if args.no_flashinfer else flashinfer_or_reason()
    t0 = time.time()
    ceiling = copy_ceiling_gbps()
    print(f"Lab 4 decode ({describe_impl()}); copy ceiling {ceiling:.0f} GB/s; FlashInfer: "
          f"{getattr(fi, '__version__', 'yes') if fi else fi_reason}", flush=True)
    rows: list[dict] = []
    paired: list[dict] = []
    for w in DECODE_WORKLOADS:
        if w.name in args.workloads:
            rows += run_workload(w, impl, fi, ceiling, args.variants, args.methods, paired)
            # NOTE: written after every workload, so a run cut short still leaves its figures.
            write_results("decode", {"implementation": describe_impl(), "copy_ceiling_gbps": ceiling,
                                     "rows": rows, "paired": paired, "partial": True}, args.out)
    sweep = [] if args.no_sweep else run_sweep(impl, fi)
    groups = run_group_sweep(impl) if args.groups else []
    payload = {
        "implementation": describe_impl(),
        "copy_ceiling_gbps": ceiling,
        "flashinfer": getattr(fi, "__version__", "unknown") if fi else None,
        "flashinfer_reason": None if fi else fi_reason,
        "workloads": [{"name": w.name, "description": w.description, "num_seqs": w.num_seqs,
                       "num_q_heads": w.num_q_heads, "num_kv_heads": w.num_kv_heads,
                       "context_len": w.context_len, "kv_bytes": w.kv_bytes()}
                      for w in DECODE_WORKLOADS if w.name in args.workloads],
        "rows": rows,
        "sweep": sweep,
        "groups": groups,
        "paired": paired,
        "targets": target_report(rows, paired),
        "seconds": time.time() - t0,
    }
    path = write_results("decode", payload, args.out)
    payload["machine"] = machine_info()
    plot(payload, path.with_suffix(".png"))
    print()
    print(format_table(rows, COLUMNS))
    print()
    print_targets(payload["targets"], paired)
    print(f"\nwrote {path} and {path.with_suffix('.png')} ({payload['seconds']:.0f} s)")
    return 0
