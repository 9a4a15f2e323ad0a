"""``pagedlab bench prefill``: the Lab 5 kernels against the GEMM ceiling, torch SDPA and
FlashInfer's paged prefill, all measured in one run on one GPU.

Workloads (``prefill_workloads.toml``): fp16, head 128, block 16, 32 query / 8 KV heads, causal —
P1 4 x 1024 prompts, P2 8 x 512 new tokens over 1536 of history, P3 1 x 8192, P4 16 x 256 new
over 3840 of history, P5 2 x 4096 MHA (32 heads), P6 32 x 128 short prompts.

FLOPs count only what causal attention must do: 4 * num_q_heads * head_size per visible
(query, key) pair (2 for Q K^T, 2 for P V), so a kernel that computes the masked half gets no
credit for it. Each contender reads the same values: the paged cache for FlashInfer and the
lab kernels, a contiguous copy of it for SDPA (GQA through ``enable_gqa``, and a bottom-right
aligned causal mask when queries follow history, P2).

Targets, on P1-P5 (P6's tiny kernels are reported only): the Hopper stage (wgmma) at least
1.0 x FlashInfer's default backend (on Hopper its FlashAttention-3 kernels), the tensor-core
stage (mma.sync) at least 0.85 x FlashInfer's fa2 backend, the same instruction (on a GPU
where FlashInfer's default is fa2 anyway, the two references are one backend), and at most
35 µs of host time per ``plan.run``. The "×" of a verdict is not the table's (each contender
timed once, one after another) but the median of 8 rounds in which both ``plan.run`` rows and
both FlashInfer backends are timed in turn as graph replays, in orders balanced for position
and predecessor (``paired.py`` says why); the JSON's ``paired`` keeps every round and its
order, and 8 eager rounds beside them. Each verdict names the backend FlashInfer ran.

Rows ``tiled plan.run`` / ``tc plan.run`` time ``plan_prefill(...).run`` (made once). The tc
rows and FlashInfer's also report ``eager µs`` (CUDA events around back-to-back eager calls)
and ``host µs`` (CPU time per call without a sync, ``_gpu.host_us_per_call``).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from reference.paths import load_toml
from reference.tools.bench._common import DEFAULT_OUT, format_table, machine_info, try_pyplot, write_results
from reference.loader import describe_impl, load_impl
from reference.tools.bench.paired import graph_and_eager_rounds, mark, round_ratios, summary, verdict

LAB = "lab05_prefill_kernels"
WORKLOADS = Path(__file__).with_name("prefill_workloads.toml")
#: Targets: the reference each stage's ``plan.run`` is timed against, and the least "×" it must
#: reach (median of paired rounds, graph replays), on the workloads whose ``targets`` is not
#: false; and the most host time per ``plan.run``.
TARGETS = {"tc": ("FlashInfer fa2", 0.85), "wgmma": ("FlashInfer", 1.0)}
HOST_US_TARGET = 35.0


def load_workloads(path: Path = WORKLOADS) -> tuple[dict, list[dict]]:
    """Returns (common settings, workloads) from the TOML file."""
    data = load_toml(path.read_text())
    return data["common"], data["workload"]


def settings_of(common: dict, wl: dict) -> dict:
    """A workload's settings: the common ones, with the keys the workload sets itself (P5's
    head counts) overridden."""
    return {**common, **{k: wl[k] for k in common if k in wl}}


def visible_pairs(query_len: int, history_len: int, causal: bool = True) -> int:
    """(query, key) pairs one sequence computes: query i sees history + i + 1 keys (causal)."""
    if not causal:
        return query_len * (query_len + history_len)
    return query_len * history_len + query_len * (query_len + 1) // 2


def build_inputs(common: dict, wl: dict, seed: int = 0) -> dict:
    """Random paged inputs on the GPU: physical blocks shuffled, as in a long-running server."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, common["dtype"])
    n, q_len, h_len = wl["num_seqs"], wl["query_len"], wl["history_len"]
    bs, hq, hkv, d = common["block_size"], common["num_q_heads"], common["num_kv_heads"], common["head_size"]
    ctx = q_len + h_len
    per_seq = math.ceil(ctx / bs)
    num_blocks = n * per_seq + 8
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))[: n * per_seq]
    block_tables = perm.view(n, per_seq).to(torch.int32)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)

    return {
        "query": randn(n * q_len, hq, d),
        "key_cache": randn(num_blocks, hkv, bs, d),
        "value_cache": randn(num_blocks, hkv, bs, d),
        "block_tables": block_tables.cuda(),
        "cu_seqlens_q": torch.arange(0, (n + 1) * q_len, q_len, dtype=torch.int32, device="cuda"),
        "context_lens": torch.full((n,), ctx, dtype=torch.int32, device="cuda"),
        "scale": 1.0 / math.sqrt(d),
    }


def contiguous_kv(batch: dict, wl: dict) -> tuple:
    """Gathers the paged cache into [num_seqs, num_kv_heads, context_len, head_size] K and V."""
    kc, vc, bt = batch["key_cache"], batch["value_cache"], batch["block_tables"].long()
    ctx = wl["query_len"] + wl["history_len"]

    def gather(cache):  # [n, per_seq, hkv, bs, d] -> [n, hkv, per_seq * bs, d]
        x = cache[bt]
        n, per_seq, hkv, bs, d = x.shape
        return x.permute(0, 2, 1, 3, 4).reshape(n, hkv, per_seq * bs, d)[:, :, :ctx].contiguous()

    return gather(kc), gather(vc)


def sdpa_fn(batch: dict, wl: dict):
    """Returns (fn, how): torch SDPA on contiguous K/V, output as packed [T, Hq, D]."""
    import torch
    import torch.nn.functional as F

    n, q_len, h_len = wl["num_seqs"], wl["query_len"], wl["history_len"]
    q = batch["query"].view(n, q_len, *batch["query"].shape[1:]).transpose(1, 2).contiguous()
    k, v = contiguous_kv(batch, wl)
    scale = batch["scale"]
    if h_len == 0:
        mask, how = None, "is_causal"
    else:
        from torch.nn.attention.bias import causal_lower_right

        mask, how = causal_lower_right(q_len, q_len + h_len), "causal_lower_right"

    def run(k=k, v=v, gqa=True):
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)

    try:
        run()
        fn, how = run, how + ", enable_gqa"
    except (RuntimeError, TypeError, ValueError):
        group = q.shape[1] // k.shape[1]
        ke, ve = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        fn, how = (lambda: run(ke, ve, False)), how + ", K/V expanded to every query head"
    torch.cuda.synchronize()
    return (lambda: fn()), how, (lambda o: o.transpose(1, 2).reshape(n * q_len, *o.shape[1:2], o.shape[3]))


def flashinfer_fn(fi, batch: dict, common: dict, wl: dict, backend: str = "auto"):
    """Returns FlashInfer's BatchPrefillWithPagedKVCacheWrapper on our cache (its "HND" layout:
    [num_pages, num_kv_heads, page_size, head_dim], K and V as a tuple).

    ``backend``: ``"auto"`` (on Hopper its FlashAttention-3 kernels: wgmma and TMA) or ``"fa2"``
    (its FlashAttention-2 kernels: mma.sync, the instruction Lab 5's tensor-core stage uses).
    """
    import torch

    n, q_len, h_len = wl["num_seqs"], wl["query_len"], wl["history_len"]
    bs = common["block_size"]
    ctx = q_len + h_len
    per_seq = math.ceil(ctx / bs)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "HND", backend=backend)
    qo_indptr = torch.arange(0, (n + 1) * q_len, q_len, dtype=torch.int32)
    kv_indptr = torch.arange(0, (n + 1) * per_seq, per_seq, dtype=torch.int32)
    kv_indices = batch["block_tables"].cpu().reshape(-1).contiguous()
    last_page_len = torch.full((n,), ctx - (per_seq - 1) * bs, dtype=torch.int32)
    wrapper.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, common["num_q_heads"],
                 common["num_kv_heads"], common["head_size"], bs, causal=True,
                 q_data_type=torch.float16, kv_data_type=torch.float16, sm_scale=batch["scale"])
    kv = (batch["key_cache"], batch["value_cache"])
    return lambda: wrapper.run(batch["query"], kv), getattr(wrapper, "_backend", "?")


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def plan_run_fn(impl, kernel: str, batch: dict):
    """``plan_prefill(...).run`` of one kernel on a batch, into a preallocated output (the plan
    made here, once, outside the timing)."""
    args = [batch[k] for k in ("query", "key_cache", "value_cache", "block_tables",
                               "cu_seqlens_q", "context_lens")]
    plan = impl.plan_prefill(*args, batch["scale"], kernel=kernel,
                             alibi_slopes=batch.get("alibi_slopes"))
    out = batch["query"].new_empty(batch["query"].shape)
    return lambda: plan.run(*args, alibi_slopes=batch.get("alibi_slopes"), out=out)


def paired_rounds(workload: str, launchers: dict) -> dict | None:
    """Each stage's ``plan.run`` against its reference (:data:`TARGETS`), timed in turn in
    balanced orders (``paired.py``): 8 rounds of graph replays, 8 of eager calls.

    Args:
        workload: its name.
        launchers: name -> launcher, only those the table timed as graph replays.

    Returns:
        ``{"workload", "<stage> plan.run": {"graph": summary, "eager": summary, "reference"},
        "times"}``; None when no stage and its reference were both timed; ``{"workload",
        "error"}`` when the rounds failed.
    """
    pairs = {f"{k} plan.run": ref for k, (ref, _) in TARGETS.items()
             if f"{k} plan.run" in launchers and ref in launchers}
    if not pairs:
        return None
    names = list(dict.fromkeys([*pairs, *pairs.values()]))
    fns = {n: launchers[n] for n in names}
    rounds = graph_and_eager_rounds(workload, fns, fns)
    if "error" in rounds:
        return rounds
    graph, eager = rounds["graph"], rounds["eager"]
    entry = {"workload": workload, "times": {"graph": graph, "eager": eager}}
    for ours, ref in pairs.items():
        entry[ours] = {"reference": ref, "graph": summary(round_ratios(graph, ours, [ref])),
                       "eager": summary(round_ratios(eager, ours, [ref]))}
        g = entry[ours]["graph"]
        print(f"  {workload} paired ({g['rounds']} balanced rounds): {ours} {g['x']:.3f} x {ref} as "
              f"graphs ({g['low']:.3f}-{g['high']:.3f}), {entry[ours]['eager']['x']:.3f} x eager",
              flush=True)
    return entry


def target_report(workloads: list[dict], rows: list[dict], paired: list[dict]) -> list[dict]:
    """Per targeted workload and stage: the paired "× reference" (graph) and the host µs of
    its ``plan.run``, each a :func:`paired.verdict` (``met`` None where not measured)."""
    by_workload = {p["workload"]: p for p in paired}
    report = []
    for wl in workloads:
        if wl.get("targets") is False:
            continue
        p = by_workload.get(wl["name"], {})
        for kernel, (ref, need) in TARGETS.items():
            ours = f"{kernel} plan.run"
            row = next((r for r in rows if r["workload"] == wl["name"] and r["impl"] == ours), None)
            if row is None:
                continue
            pair = p.get(ours)
            ref_row = next((r for r in rows if r["workload"] == wl["name"] and r["impl"] == ref),
                           {})
            report.append({
                "workload": wl["name"], "kernel": kernel, "reference": ref,
                "reference_backend": ref_row.get("backend"),
                "error": p.get("error"),
                "x": verdict(pair["graph"]["x"] if pair else None, need),
                "host_us": verdict(row.get("host_us"), HOST_US_TARGET, at_most=True),
            })
    return report


def print_targets(report: list[dict]) -> None:
    """Prints :func:`target_report`, one line per workload and stage."""
    print(f"targets (median of 8 balanced rounds, graph replays; host <= {HOST_US_TARGET:.0f} "
          f"us per plan.run):")
    for t in report:
        x, host = t["x"], t["host_us"]
        backend = f" [{t['reference_backend']}]" if t.get("reference_backend") else ""
        print(f"  {t['workload']} {t['kernel']:5s} "
              + (f"{x['figure']:.3f} x {t['reference']}{backend} (target >= {x['target']}: "
                 f"{mark(x, 'met')})"
                 if x["figure"] is not None
                 else f"paired rounds failed ({t['error']})" if t.get("error")
                 else f"not paired: no {t['reference']} timed as a graph")
              + (f", host {host['figure']:.1f} us ({mark(host, 'met')})" if host["figure"] is not None
                 else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pagedlab bench prefill", description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=None, help="names (default: all)")
    parser.add_argument("--kernels", nargs="+", default=None,
                        help="default: naive tiled tc, and wgmma on a Hopper GPU")
    parser.add_argument("--tc-variants", nargs="+", default=None, metavar="WxR",
                        help="(tuning) also time the tensor-core kernel with W warps of R rows")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for prefill.json / .png")
    args = parser.parse_args(argv)

    from reference.gpu import gpu_skip_reason

    reason = gpu_skip_reason()
    if reason:
        print(f"pagedlab bench prefill needs a GPU: {reason}")
        return 2
    import torch

    from reference.tools.bench._gpu import (flashinfer_or_reason, gemm_ceiling_tflops,
                                            launch_costs, measure)

    impl = load_impl(LAB)
    if args.kernels is None:
        hopper = tuple(torch.cuda.get_device_capability()) == (9, 0)
        args.kernels = ["naive", "tiled", "tc"] + (["wgmma"] if hopper else [])
    common, workloads = load_workloads()
    if args.workloads:
        workloads = [w for w in workloads if w["name"] in args.workloads]
    fi, fi_reason = flashinfer_or_reason()
    gemm = gemm_ceiling_tflops(8192, common["dtype"])
    print(f"Lab 5 prefill ({describe_impl()}) on {machine_info()['device']}; fp16 GEMM ceiling "
          f"{gemm:.0f} TFLOP/s; FlashInfer: {fi.__version__ if fi else fi_reason}")
    rows, paired = [], []
    for wl in workloads:
        cfg = settings_of(common, wl)
        batch = build_inputs(cfg, wl)
        pairs = wl["num_seqs"] * visible_pairs(wl["query_len"], wl["history_len"], cfg["causal"])
        flops = 4 * cfg["num_q_heads"] * cfg["head_size"] * pairs
        found: dict[str, dict] = {}
        launchers: dict[str, object] = {}  # name -> fn, for the paired rounds

        def record(name, fn, note="", reference_out=None, costs=False, backend=None):
            # CUDA-graph replays: a ~0.2 ms kernel's Python launch path must not be timed.
            us, how, out = measure(fn)
            note = f"{note}; timed: {how}" if note else f"timed: {how}"
            row = {"workload": wl["name"], "impl": name, "us": us, "ms": us / 1e3,
                   "tflops": flops / (us * 1e-6) / 1e12, "timing": how, "note": note}
            if backend is not None:
                row["backend"] = backend
            if costs:  # eager back-to-back calls, and host µs per call (_gpu.launch_costs)
                row.update(launch_costs(fn))
                note += f"; eager {row['eager_us']:.1f} us, host {row['host_us']:.1f} us"
            row["pct_gemm"] = 100 * row["tflops"] / gemm
            if reference_out is not None:
                row["rel_err_vs_sdpa"] = rel_err(out, reference_out)
            rows.append(row)
            found[name] = row
            if how == "graph":  # the paired rounds replay graphs: a launcher that could not be
                launchers[name] = fn  # captured (PAGEDLAB_DEBUG's device reads) stays out
            print(f"  {wl['name']} {name:<14} {row['ms']:9.3f} ms {row['tflops']:8.1f} TFLOP/s  {note}")
            return out

        sdpa, how, packed = sdpa_fn(batch, wl)
        ref = packed(record("torch SDPA", sdpa, how))
        if fi is not None:
            try:
                fn, backend = flashinfer_fn(fi, batch, cfg, wl)
                record("FlashInfer", fn, f"paged, backend {backend}", ref, costs=True,
                       backend=backend)
            except Exception as exc:  # noqa: BLE001 — report, keep measuring the rest
                print(f"  FlashInfer failed: {type(exc).__name__}: {exc}")
                fi_reason = f"{type(exc).__name__}: {exc}"
            try:  # the like-for-like contender of the mma.sync stage
                fn, backend = flashinfer_fn(fi, batch, cfg, wl, backend="fa2")
                record("FlashInfer fa2", fn, f"paged, backend {backend}", ref, backend=backend)
            except Exception as exc:  # noqa: BLE001 — report, keep measuring the rest
                print(f"  FlashInfer fa2 failed: {type(exc).__name__}: {exc}")
        for kernel in args.kernels:
            variants = [None]
            if kernel == "tc" and args.tc_variants and hasattr(impl, "TcTiling"):
                default = f"{impl.TC_TILING.warps}x{impl.TC_TILING.rows_per_warp}"
                variants += [v for v in args.tc_variants if v != default]
            for variant in variants:
                # A variant is the tensor-core CTA shape, passed as tc_tiling= to the plan and
                # the launcher (never set on the module).
                tiling = {}
                try:
                    if variant is not None:
                        # NOTE: not `rows`: that name holds the table being built.
                        num_warps, rows_per_warp = (int(x) for x in variant.split("x"))
                        tiling = {"tc_tiling": impl.TcTiling(num_warps, rows_per_warp)}
                    plan = impl.plan_for_kernel(kernel, batch["cu_seqlens_q"], batch["context_lens"],
                                                num_q_heads=cfg["num_q_heads"],
                                                num_kv_heads=cfg["num_kv_heads"], **tiling)
                    fn = getattr(impl, f"paged_prefill_{kernel}")
                    name = kernel if variant is None else f"{kernel} ({variant})"
                    record(name, lambda fn=fn, plan=plan, kw=tiling: fn(**batch, plan=plan, **kw),
                           "plan made once, outside the timing", ref,
                           costs=variant is None and kernel in ("tc", "wgmma"))
                    if variant is None and kernel in ("tiled", "tc", "wgmma") and hasattr(impl, "plan_prefill"):
                        record(f"{kernel} plan.run", plan_run_fn(impl, kernel, batch),
                               "plan_prefill made once, run into a preallocated out", ref,
                               costs=kernel in ("tc", "wgmma"))
                except Exception as exc:  # noqa: BLE001 — a tuning variant may not exist
                    print(f"  {wl['name']} {kernel} {variant or ''}: failed: {type(exc).__name__}: {exc}")
                    if variant is None:
                        raise
        for row in rows:
            if row["workload"] != wl["name"]:
                continue
            if "FlashInfer" in found:
                row["x_flashinfer"] = row["tflops"] / found["FlashInfer"]["tflops"]
            if "FlashInfer fa2" in found:
                row["x_flashinfer_fa2"] = row["tflops"] / found["FlashInfer fa2"]["tflops"]
            row["x_sdpa"] = row["tflops"] / found["torch SDPA"]["tflops"]
        # P6-like workloads (``targets = false``) carry no verdict: no paired rounds either.
        entry = None if wl.get("targets") is False else paired_rounds(wl["name"], launchers)
        if entry is not None:
            paired.append(entry)
        del batch, launchers
        torch.cuda.empty_cache()

    print()
    print(format_table(rows, [("workload", "workload", ""), ("impl", "implementation", ""),
                              ("ms", "ms", ".3f"), ("eager_us", "eager µs", ".1f"),
                              ("host_us", "host µs", ".1f"), ("tflops", "TFLOP/s", ".1f"),
                              ("pct_gemm", "% GEMM", ".1f"), ("x_sdpa", "x SDPA", ".2f"),
                              ("x_flashinfer", "x FlashInfer", ".2f"),
                              ("x_flashinfer_fa2", "x FI fa2", ".2f"),
                              ("rel_err_vs_sdpa", "rel err vs SDPA", ".1e")]))
    report = target_report(workloads, rows, paired)
    print_targets(report)
    payload = {"common": common, "workloads": workloads, "gemm_ceiling_tflops": gemm,
               "flashinfer": fi.__version__ if fi else None, "flashinfer_reason": fi_reason,
               "targets": report, "paired": paired,
               "implementation": describe_impl(), "rows": rows}
    path = write_results("prefill", payload, args.out)
    print(f"wrote {path}")
    plt = try_pyplot()
    if plt is not None:
        plot(plt, {"machine": machine_info(), **payload}, Path(args.out) / "prefill.png")
    return 0


def plot(plt, payload: dict, path: Path) -> None:
    """Bars of TFLOP/s per implementation, one group per workload, log scale (naive is ~10^4 x
    slower than the rest)."""
    rows = payload["rows"]
    names = list(dict.fromkeys(r["impl"] for r in rows))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs, ys = [], []
        for j, wl in enumerate(workloads):
            r = next((r for r in rows if r["workload"] == wl and r["impl"] == name), None)
            if r:
                xs.append(j + i * width)
                ys.append(r["tflops"])
        ax.bar(xs, ys, width, label=name)
    ax.axhline(payload["gemm_ceiling_tflops"], color="k", lw=0.8, ls="--", label="fp16 GEMM ceiling")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(workloads))], workloads)
    ax.set(yscale="log", ylabel="TFLOP/s (causal FLOPs)",
           title=f"paged prefill, {payload['machine']['device']}, {payload['machine']['date']}")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
