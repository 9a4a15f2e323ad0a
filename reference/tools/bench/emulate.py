"""``pagedlab bench emulate``: wall time of every Lab 4 and Lab 5 kernel on the emulated device,
per test shape, so that a change to the engine (reference/include/emulate/pagedlab_emu.h) or to
a kernel that makes the CPU-graded suite slower shows up.

Each kernel runs once to compile (the "compile s" column: 0 when the .so was cached) and then
``--reps`` times; the table shows the best run. These are CPU seconds of the emulator, not GPU
speed: compare them only with earlier runs of this benchmark on the same machine.
``--racecheck`` adds the racecheck tests' launches, plain and under the emulated racecheck.
"""

from __future__ import annotations

import argparse
import time

from reference.loader import describe_impl, load_impl
from reference.tools.bench._common import DEFAULT_OUT, format_table, write_results

#: (name, context_lens, num_q_heads, num_kv_heads, head_size, block_size): shapes of the Lab 4
#: kernel tests (ragged batch, GQA, a long split-K context).
DECODE_SHAPES = [
    ("ragged", [1, 15, 16, 17, 100, 250, 3], 8, 2, 128, 16),
    ("gqa8", [50, 9, 120], 16, 2, 128, 16),
    ("long", [3000, 2500], 8, 1, 128, 16),
]
#: (name, query_lens, history_lens, num_q_heads, num_kv_heads, head_size, block_size): Lab 5,
#: shrunk per kernel as the emulated tests shrink them (``_cases.emulated_length``).
PREFILL_SHAPES = [
    ("varlen", [33, 1, 150], [0, 90, 7], 8, 2, 128, 32),
    ("chunked", [300, 300], [400, 400], 8, 2, 128, 16),
]


def _best(fn, reps: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    best = first
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return first, best


def run_decode(reps: int, versions: list[str]) -> list[dict]:
    """Times every Lab 4 kernel version on DECODE_SHAPES."""
    import numpy as np
    import torch

    from reference.inputs import make_decode_case

    impl = load_impl("lab04_decode_kernels")
    rows = []
    for name, lens, hq, hkv, d, bs in DECODE_SHAPES:
        c = make_decode_case(1, lens, hq, hkv, d, bs, dtype=np.float32)
        args = (torch.from_numpy(c.query).half(), torch.from_numpy(c.kv.key_cache).half(),
                torch.from_numpy(c.kv.value_cache).half(), torch.from_numpy(c.kv.block_tables),
                torch.from_numpy(c.kv.context_lens))
        for v in versions:
            if name == "long" and v == "naive":
                continue  # minutes: the naive kernel recomputes every score head_size * 3 times
            first, best = _best(lambda: impl.KERNELS[v](*args, c.scale), reps)
            rows.append({"lab": 4, "kernel": v, "shape": name, "compile_s": max(0.0, first - best),
                         "run_s": best})
    return rows


def run_prefill(reps: int) -> list[dict]:
    """Times every Lab 5 kernel on PREFILL_SHAPES."""
    from labs.lab05_prefill_kernels._cases import launcher, make_batch

    impl = load_impl("lab05_prefill_kernels")
    rows = []
    for name, ql, hl, hq, hkv, d, bs in PREFILL_SHAPES:
        for k in ("naive", "tiled", "tc"):
            # kernel=k: the lengths the emulated tests use (shrunk per kernel, see _cases.py).
            batch = make_batch(1, ql, hl, hq, hkv, d, bs, device="cpu", kernel=k)
            first, best = _best(lambda: launcher(impl, k)(**batch), reps)
            rows.append({"lab": 5, "kernel": k, "shape": name, "compile_s": max(0.0, first - best),
                         "run_s": best})
    return rows


def run_racecheck(reps: int) -> list[dict]:
    """Times the racecheck tests' launches plain and under the emulated racecheck."""
    from labs.lab04_decode_kernels._cases import GpuCase
    from labs.lab05_prefill_kernels._cases import launcher, make_batch
    from reference.emulate import racecheck

    def checked(fn):
        def run():
            with racecheck():
                fn()
        return run

    lab4, lab5 = load_impl("lab04_decode_kernels"), load_impl("lab05_prefill_kernels")
    case = GpuCase(131, [70, 33, 0], 8, 2, 64, 16)  # test_no_shared_memory_race_under_racecheck
    jobs = []
    for v, fn in lab4.KERNELS.items():
        kw = ({"plan": lab4.SplitKVPlan(2, 64), "max_context_len": 128}
              if v in ("v3", "v4", "v5", "v6") else {})
        jobs.append((4, v, lambda fn=fn, kw=kw: fn(*case.args(), case.scale, **kw)))
    batch = make_batch(79, [70, 5], [60, 100], 2, 1, 64, 16)  # the Lab 5 racecheck test's
    for k in ("naive", "tiled"):
        jobs.append((5, k, lambda k=k: launcher(lab5, k)(**batch)))
    rows = []
    for lab, kernel, fn in jobs:
        _, plain = _best(fn, reps)
        first, checked_s = _best(checked(fn), reps)
        rows.append({"lab": lab, "kernel": kernel, "shape": "racecheck test",
                     "compile_s": max(0.0, first - checked_s), "run_s": plain,
                     "racecheck_s": checked_s, "slowdown": checked_s / plain})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; prints a table and writes ``<out>/emulate.json``."""
    from reference.emulate import emulation

    parser = argparse.ArgumentParser(prog="pagedlab bench emulate", description=__doc__)
    parser.add_argument("--reps", type=int, default=2, help="timed runs after the first")
    parser.add_argument("--versions", default="naive,v0,v1,v2,v3,v4,v5,v6",
                        help="Lab 4 kernel versions (comma-separated)")
    parser.add_argument("--labs", default="4,5", help="which labs (comma-separated)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for emulate.json")
    parser.add_argument("--racecheck", action="store_true",
                        help="also time the racecheck tests' launches under the emulated racecheck")
    args = parser.parse_args(argv)
    labs = {s.strip() for s in args.labs.split(",")}
    rows = []
    with emulation():
        if "4" in labs:
            rows += run_decode(args.reps, [v.strip() for v in args.versions.split(",")])
        if "5" in labs:
            rows += run_prefill(args.reps)
        race_rows = run_racecheck(args.reps) if args.racecheck else []
    print(f"emulated device, implementation: {describe_impl()}")
    print(format_table(rows, [("lab", "lab", ""), ("kernel", "kernel", ""), ("shape", "shape", ""),
                              ("run_s", "run s", ".3f"), ("compile_s", "compile s", ".1f")]))
    if race_rows:
        print("\nracecheck (the racecheck tests' launches; compile s: the instrumented build)")
        print(format_table(race_rows, [("lab", "lab", ""), ("kernel", "kernel", ""),
                                       ("run_s", "plain s", ".3f"),
                                       ("racecheck_s", "racecheck s", ".3f"),
                                       ("slowdown", "x", ".1f"),
                                       ("compile_s", "compile s", ".1f")]))
        rows += race_rows
    path = write_results("emulate", {"rows": rows}, args.out)
    print(f"wrote {path}")
    return 0
