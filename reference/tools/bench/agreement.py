"""``pagedlab bench agreement``: do the GPU and the emulated device compute the same outputs?

Every solution kernel of Labs 4 and 5 (and the production entry point, and the split-K path with
its reduce kernel) runs on fixed seeded inputs. Two halves:

* ``--record DIR`` (on a GPU): runs each kernel on the GPU and saves its inputs and output, one
  ``.npz`` per (kernel, case), plus ``manifest.json`` (device, torch version, commit).
* ``--compare DIR`` (on the CPU): runs the same kernels on the emulated device on exactly those
  inputs (the saved bits: fp16 and bf16 values are not regenerated) and prints, per kernel and
  case, the max absolute and the relative difference against the tests' tolerances (Lab 4:
  ``_cases.REL_TOL`` / ``ABS_TOL``; Lab 5: ``_cases.TOLERANCE``). Exit status 1 if any pair
  disagrees by more than a test would accept.

``--record DIR --device emulate`` records on the emulated device instead (a CPU-only check of
the machinery: comparing it with itself must give 0). Shapes are small, so that the compare half
takes a few minutes on 2 cores, and the record half seconds on a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from reference.errors import UnsupportedConfigError

from reference.paths import REPO_ROOT

#: Lab 4: (case, dtype, context_lens, num_q_heads, num_kv_heads, head_size, block_size).
DECODE_CASES = [
    ("ragged-f16", "float16", [1, 15, 16, 17, 100, 250, 3, 0], 8, 2, 128, 16),
    ("gqa-bf16", "bfloat16", [50, 9, 120], 16, 2, 64, 32),
]
#: Lab 4 versions that take bf16 (naive and v0 are the fp16 teaching baselines).
BF16_VERSIONS = ("v1", "v2", "v3", "v4", "v5", "v6")
SPLIT_VERSIONS = ("v3", "v4", "v5", "v6")
#: Lab 5: (case, dtype, query_lens, history_lens, num_q_heads, num_kv_heads, head_size,
#: block_size, alibi).
PREFILL_CASES = [
    ("varlen-f16", "float16", [33, 1, 70], [0, 90, 7], 4, 2, 128, 16, False),
    ("history-bf16-alibi", "bfloat16", [17, 40], [61, 3], 4, 1, 64, 32, True),
]
PREFILL_KERNELS = ("naive", "tiled", "tc", "wgmma")
#: More cases for the Hopper kernel only (block sizes 8 and 128: 16 TMA boxes a tile, or one;
#: a group of 3). It records on a Hopper GPU and is skipped on other GPUs.
WGMMA_CASES = [
    ("bs8-gqa3-f16", "float16", [130, 5], [20, 200], 6, 2, 128, 8, False),
    ("bs128-mha-bf16", "bfloat16", [140], [300], 2, 2, 128, 128, False),
]


# ----------------------------------------------------------------------------- arrays <-> npz

def _to_numpy(t) -> np.ndarray:
    """A tensor's exact bits as numpy (bf16 as uint16)."""
    import torch

    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _to_torch(a: np.ndarray, dtype: str, device: str):
    import torch

    if dtype == "bfloat16" and a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(a.copy()).to(device)


# ----------------------------------------------------------------------------- the runs

def _decode_inputs(case, device: str) -> dict:
    import torch

    from reference.inputs import make_decode_case

    name, dtype, lens, hq, hkv, d, bs = case
    c = make_decode_case(7, lens, hq, hkv, d, bs, dtype=np.float32)
    td = getattr(torch, dtype)
    return {"query": torch.from_numpy(c.query).to(device, td),
            "key_cache": torch.from_numpy(c.kv.key_cache).to(device, td),
            "value_cache": torch.from_numpy(c.kv.value_cache).to(device, td),
            "block_tables": torch.from_numpy(c.kv.block_tables).to(device),
            "context_lens": torch.from_numpy(c.kv.context_lens).to(device),
            "scale": np.float64(c.scale)}


DECODE_KEYS = ("query", "key_cache", "value_cache", "block_tables", "context_lens")


def decode_runs(impl) -> list[tuple[str, tuple, dict]]:
    """(run name, case, launcher kwargs) for every Lab 4 kernel run."""
    runs = []
    for case in DECODE_CASES:
        for version in impl.KERNELS:
            if case[1] == "bfloat16" and version not in BF16_VERSIONS:
                continue
            runs.append((f"lab4-{version}-{case[0]}", case, {"version": version}))
            if version in SPLIT_VERSIONS:
                runs.append((f"lab4-{version}-split-{case[0]}", case,
                             {"version": version, "split": True}))
        runs.append((f"lab4-paged_attention-{case[0]}", case, {"version": "paged_attention"}))
    return runs


def run_decode(impl, inputs: dict, version: str, split: bool = False):
    """Runs one Lab 4 kernel; returns its output (and lse for the entry point) as numpy."""
    from reference.gpu import synchronize

    args = [inputs[k] for k in DECODE_KEYS]
    scale = float(inputs["scale"])
    if version == "paged_attention":
        out, lse = impl.paged_attention(*args, scale, return_lse=True)
        synchronize()
        return {"out": _to_numpy(out.float()), "lse": _to_numpy(lse.float())}
    kwargs = {"plan": impl.SplitKVPlan(4, 64), "max_context_len": 256} if split else {}
    out = impl.KERNELS[version](*args, scale, **kwargs)
    synchronize()
    return {"out": _to_numpy(out.float())}


def _prefill_inputs(case, device: str) -> dict:
    from labs.lab05_prefill_kernels._cases import make_batch

    name, dtype, ql, hl, hq, hkv, d, bs, alibi = case
    # kernel=None: the lengths as written, also under emulation (both halves run the same).
    return make_batch(11, ql, hl, hq, hkv, d, bs, dtype=dtype, alibi=alibi, device=device)


PREFILL_KEYS = ("query", "key_cache", "value_cache", "block_tables", "cu_seqlens_q",
                "context_lens", "alibi_slopes")


def prefill_runs() -> list[tuple[str, tuple, dict]]:
    """(run name, case, kwargs) for every Lab 5 kernel run."""
    return [(f"lab5-{k}-{case[0]}", case, {"kernel": k}) for case in PREFILL_CASES
            for k in PREFILL_KERNELS] + [(f"lab5-wgmma-{case[0]}", case, {"kernel": "wgmma"})
                                         for case in WGMMA_CASES]


def run_prefill(impl, batch: dict, kernel: str):
    from labs.lab05_prefill_kernels._cases import launcher
    from reference.gpu import synchronize

    out = launcher(impl, kernel)(**batch)
    synchronize()
    return {"out": _to_numpy(out.float())}


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _selected(name: str, only: list[str]) -> bool:
    return not only or any(o in name for o in only)


def record(folder: Path, device: str, only: list[str]) -> int:
    """Runs every kernel on ``device`` ("cuda" or "emulate") and saves inputs + outputs."""
    import torch

    from reference.emulate import emulation
    from reference.loader import describe_impl, load_impl

    folder.mkdir(parents=True, exist_ok=True)
    tdev = "cpu" if device == "emulate" else "cuda"
    lab4, lab5 = load_impl("lab04_decode_kernels"), load_impl("lab05_prefill_kernels")
    saved = []
    with emulation(device == "emulate"):
        for name, case, kw in decode_runs(lab4):
            if not _selected(name, only):
                continue
            inputs = _decode_inputs(case, tdev)
            got = run_decode(lab4, inputs, **kw)
            arrays = {k: _to_numpy(inputs[k]) for k in DECODE_KEYS}
            np.savez_compressed(folder / f"{name}.npz", scale=inputs["scale"], dtype=case[1],
                     **arrays, **{f"result_{k}": v for k, v in got.items()})
            saved.append(name)
            print(f"recorded {name}", flush=True)
        for name, case, kw in prefill_runs():
            if not _selected(name, only):
                continue
            batch = _prefill_inputs(case, tdev)
            try:
                got = run_prefill(lab5, batch, **kw)
            except UnsupportedConfigError as exc:  # the Hopper kernel on another GPU
                print(f"skipped {name}: {exc}"[:160], flush=True)
                continue
            arrays = {k: _to_numpy(batch[k]) for k in PREFILL_KEYS if batch[k] is not None}
            np.savez_compressed(folder / f"{name}.npz", scale=np.float64(batch["scale"]), dtype=case[1],
                     **arrays, **{f"result_{k}": v for k, v in got.items()})
            saved.append(name)
            print(f"recorded {name}", flush=True)
    device_name = ("emulated device" if device == "emulate"
                   else torch.cuda.get_device_name(0))
    manifest = {"device": device_name, "torch": torch.__version__, "commit": _git_commit(),
                "implementation": describe_impl(), "python": platform.python_version(),
                "date": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": saved}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {len(saved)} runs to {folder}")
    return 0


def _limits(lab: int, dtype: str) -> tuple[float, float | None]:
    """(relative limit, max-abs limit or None) a test of that lab applies to an output."""
    if lab == 4:
        from labs.lab04_decode_kernels._cases import ABS_TOL, REL_TOL

        return REL_TOL, ABS_TOL[dtype]
    from labs.lab05_prefill_kernels._cases import TOLERANCE

    return TOLERANCE[dtype], None


def compare(folder: Path, only: list[str]) -> int:
    """Re-runs every recorded kernel emulated on the saved inputs; prints the differences."""
    from reference.emulate import emulation
    from reference.loader import load_impl
    from reference.tools.bench._common import format_table

    manifest = json.loads((folder / "manifest.json").read_text())
    lab4, lab5 = load_impl("lab04_decode_kernels"), load_impl("lab05_prefill_kernels")
    rows, bad = [], 0
    with emulation():
        for name in manifest["runs"]:
            if not _selected(name, only):
                continue
            data = np.load(folder / f"{name}.npz")
            dtype = str(data["dtype"])
            lab, kernel = int(name[3]), name.split("-")[1]
            t0 = time.perf_counter()
            if lab == 4:
                inputs = {k: _to_torch(data[k], dtype, "cpu") for k in DECODE_KEYS}
                inputs["scale"] = data["scale"]
                got = run_decode(lab4, inputs, kernel, split="-split-" in name)
            else:
                batch = {k: (_to_torch(data[k], dtype if k in ("query", "key_cache", "value_cache")
                                       else "", "cpu") if k in data else None)
                         for k in PREFILL_KEYS}
                batch["scale"] = float(data["scale"])
                got = run_prefill(lab5, batch, kernel)
            seconds = time.perf_counter() - t0
            rel_limit, abs_limit = _limits(lab, dtype)
            for key, emulated in got.items():
                gpu = data[f"result_{key}"]
                both = np.isfinite(gpu) & np.isfinite(emulated)
                same_nan = bool(np.array_equal(np.isnan(gpu), np.isnan(emulated)))
                ref = gpu.astype(np.float64)[both]
                diff = np.abs(ref - emulated.astype(np.float64)[both])
                max_abs = float(diff.max()) if diff.size else 0.0
                rel = float(np.linalg.norm(diff)) / (float(np.linalg.norm(ref)) or 1.0)
                if key == "lse":  # test_production_entry_point: rtol = atol = 1e-3
                    abs_limit = 1e-3 * (1.0 + (float(np.abs(ref).max()) if ref.size else 0.0))
                ok = same_nan and rel < rel_limit and (abs_limit is None or max_abs <= abs_limit)
                bad += not ok
                rows.append({"run": name + ("" if key == "out" else f" ({key})"), "dtype": dtype,
                             "max_abs": max_abs, "rel": rel, "rel_limit": rel_limit,
                             "abs_limit": abs_limit if abs_limit is not None else float("nan"),
                             "s": seconds, "verdict": "agree" if ok else "DISAGREE"})
    print(f"recorded on: {manifest['device']} (commit {manifest['commit'][:12]}, "
          f"{manifest['date']}); compared on: the emulated device")
    print(format_table(rows, [("run", "run", ""), ("dtype", "dtype", ""),
                              ("max_abs", "max |diff|", ".2e"), ("abs_limit", "abs limit", ".0e"),
                              ("rel", "rel diff", ".2e"), ("rel_limit", "rel limit", ".0e"),
                              ("s", "emu s", ".2f"), ("verdict", "verdict", "")]))
    print(f"{len(rows) - bad}/{len(rows)} outputs agree within the tests' tolerances")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    """Records (GPU) or compares (emulated) kernel outputs; see the module docstring."""
    parser = argparse.ArgumentParser(prog="pagedlab bench agreement", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", metavar="DIR", help="run on the device, save inputs + outputs")
    mode.add_argument("--compare", metavar="DIR", help="re-run emulated on DIR's inputs")
    parser.add_argument("--device", choices=("cuda", "emulate"), default="cuda",
                        help="where --record runs (default: the GPU)")
    parser.add_argument("--only", default="", help="comma-separated substrings of run names")
    args = parser.parse_args(argv)
    only = [o.strip() for o in args.only.split(",") if o.strip()]
    if args.record:
        return record(Path(args.record), args.device, only)
    return compare(Path(args.compare), only)


if __name__ == "__main__":
    sys.exit(main())
