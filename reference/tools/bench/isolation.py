"""``pagedlab bench isolation``: what isolated grading costs — microseconds per proxied call and
each lab's wall time graded in-process vs isolated.

Per call: a raw pipe round trip to a child process (the floor: two context switches), then
calls through the proxy (:mod:`reference.grader.proxy`) to Lab 1's solution in a worker: a
method with an int argument, one with a list argument, and the same method called from 4 threads
at once. Then Lab 2's pool in a worker: ``add_sequence`` + ``free_sequence`` with the worker's own
block allocator and with a trusted one (every allocator call a call-back to this process), and
reading ``pool.key_cache`` (shared memory: the first read moves it, later reads map nothing).
Wall time: ``run_lab_tests`` (the grader's runner, solutions, hidden tests included) per lab,
in-process then isolated, ``--repeat`` times (the median is reported: a 2-core machine's wall
times vary by 20 % run to run). Needs root or passwordless sudo (a worker user).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

from reference.tools.bench._common import DEFAULT_OUT, format_table, write_results

LAB = "lab01_block_manager"
DEFAULT_LABS = ["lab01_block_manager", "lab02_kv_cache_pool", "lab03_paged_attention_oracle",
                "lab04_decode_kernels", "lab05_prefill_kernels", "lab06_serving_engine"]

_ECHO = ("import os\n"
         "while (b := os.read(0, 65536)):\n"
         "    os.write(1, b)\n")


def _us_per(fn, reps: int) -> float:
    """Best of three runs of ``fn(reps)``, in µs per repetition."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter_ns()
        fn(reps)
        best = min(best, (time.perf_counter_ns() - t0) / reps / 1e3)
    return best


def pipe_round_trip_us(reps: int) -> float:
    """Returns µs per 64-byte write + read through a child that echoes (the floor of any call)."""
    proc = subprocess.Popen([sys.executable, "-c", _ECHO], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    out_fd, in_fd = proc.stdin.fileno(), proc.stdout.fileno()
    msg = b"x" * 64

    def loop(k):
        for _ in range(k):
            os.write(out_fd, msg)
            got = 0
            while got < len(msg):
                got += len(os.read(in_fd, 65536))

    try:
        return _us_per(loop, reps)
    finally:
        proc.stdin.close()
        proc.wait()


def _cpu_s(pid: int) -> float:
    """Returns the user + system CPU seconds process ``pid`` has used (Linux ``/proc``)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proxied_call_us(reps: int) -> dict:
    """Returns µs per proxied call to Lab 1's solution in a worker, for a few kinds of call."""
    os.environ.setdefault("LAB_IMPL", "solution")
    from reference.grader.proxy import WorkerClient

    t0 = time.perf_counter()
    client = WorkerClient(LAB)
    start_s = time.perf_counter() - t0
    try:
        bm = client.module.BlockManager(1024)
        ids = list(range(16))

        def no_args(k):
            for _ in range(k):
                bm.get_ref_count(0)

        def list_arg(k):
            for _ in range(k):
                bm.get_computed_blocks(ids)

        def threaded(k):
            per = max(1, k // 4)
            threads = [threading.Thread(target=no_args, args=(per,)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        # CPU per call on each side (from /proc: steadier than wall time on a loaded machine).
        cpu0, own0 = _cpu_s(client.proc.pid), time.process_time()
        no_args(reps)
        worker_cpu_us = (_cpu_s(client.proc.pid) - cpu0) / reps * 1e6
        trusted_cpu_us = (time.process_time() - own0) / reps * 1e6
        return {"worker_start_s": start_s, "worker_cpu_us": worker_cpu_us,
                "trusted_cpu_us": trusted_cpu_us, "no_args_us": _us_per(no_args, reps),
                "list_arg_us": _us_per(list_arg, reps), "threads4_us": _us_per(threaded, reps)}
    finally:
        client.kill()


def callback_us(reps: int) -> dict:
    """Returns µs for Lab 2 pool calls whose allocator lives in the worker vs in this process,
    and µs per ``pool.key_cache`` read (the first one moves the tensor to shared memory)."""
    os.environ.setdefault("LAB_IMPL", "solution")
    import torch  # noqa: F401 — NOTE: loaded before timing, as in every Lab 2 test process

    from reference.block_allocator import TrustedBlockAllocator
    from reference.grader.proxy import WorkerClient

    client = WorkerClient("lab02_kv_cache_pool")
    try:
        def pool(block_manager=None):
            return client.module.KVCachePool(64, 4, 2, 8, max_num_seqs=4, max_model_len=64,
                                             block_manager=block_manager)

        def add_free(p):
            def loop(k):
                for _ in range(k):
                    p.add_sequence(0, 9)
                    p.free_sequence(0)
            return loop

        local, trusted = pool(), pool(TrustedBlockAllocator(64))
        reader = pool()
        t0 = time.perf_counter_ns()
        reader.key_cache  # noqa: B018 — the first read: moved into shared memory and mapped
        first_us = (time.perf_counter_ns() - t0) / 1e3

        def read(k):
            for _ in range(k):
                reader.key_cache  # noqa: B018

        return {"add_free_worker_bm_us": _us_per(add_free(local), reps // 4),
                "add_free_trusted_bm_us": _us_per(add_free(trusted), reps // 4),
                "first_cache_read_us": first_us, "cache_read_us": _us_per(read, reps)}
    finally:
        client.kill()


def lab_wall_s(lab: str, isolated: bool) -> tuple[float, int, int]:
    """Returns (seconds, tests passed, tests run) for grading ``lab``'s solution once."""
    from reference.grader.runner import run_lab_tests

    t0 = time.perf_counter()
    run = run_lab_tests([lab], impl="solution", isolated=isolated)
    return time.perf_counter() - t0, sum(r.passed for r in run.records), len(run.records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pagedlab bench isolation", description=__doc__)
    parser.add_argument("--reps", type=int, default=2000, help="calls per timing")
    parser.add_argument("--labs", nargs="*", default=DEFAULT_LABS,
                        help="labs whose wall time is compared (none: per-call numbers only)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="gradings per lab and mode (the median is reported)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for isolation.json")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    calls = {"pipe_us": pipe_round_trip_us(args.reps), **proxied_call_us(args.reps)}
    print(f"Per call (best of 3 x {args.reps}; load average {load:.1f} on {os.cpu_count()} cores)")
    print(format_table([calls], [("pipe_us", "raw pipe round trip µs", ".0f"),
                                 ("no_args_us", "proxied call µs", ".0f"),
                                 ("list_arg_us", "with a list arg µs", ".0f"),
                                 ("threads4_us", "4 threads, µs/call", ".0f"),
                                 ("worker_cpu_us", "worker CPU µs/call", ".0f"),
                                 ("trusted_cpu_us", "grader CPU µs/call", ".0f"),
                                 ("worker_start_s", "worker start s", ".2f")]))
    backs = callback_us(args.reps)
    calls.update(backs)
    print("\nLab 2 pool in a worker (add_sequence + free_sequence; key_cache reads)")
    print(format_table([backs], [("add_free_worker_bm_us", "worker's allocator µs", ".0f"),
                                 ("add_free_trusted_bm_us", "trusted allocator µs", ".0f"),
                                 ("first_cache_read_us", "1st key_cache read µs", ".0f"),
                                 ("cache_read_us", "later reads µs", ".0f")]))
    rows = []
    for lab in args.labs:
        runs = [(lab_wall_s(lab, isolated=False), lab_wall_s(lab, isolated=True))
                for _ in range(max(1, args.repeat))]
        in_s = statistics.median(r[0][0] for r in runs)
        iso_s = statistics.median(r[1][0] for r in runs)
        (_, in_ok, in_n), (_, iso_ok, iso_n) = runs[-1]
        rows.append({"lab": lab, "in_process_s": in_s, "isolated_s": iso_s,
                     "ratio": iso_s / in_s, "passed": f"{in_ok}/{in_n} | {iso_ok}/{iso_n}",
                     "runs_s": [[r[0][0], r[1][0]] for r in runs]})
    if rows:
        total_in = sum(r["in_process_s"] for r in rows)
        total_iso = sum(r["isolated_s"] for r in rows)
        rows.append({"lab": "total", "in_process_s": total_in, "isolated_s": total_iso,
                     "ratio": total_iso / total_in, "passed": ""})
        print(f"\nGrading the solutions (runner, hidden tests included; load {load:.1f}; "
              f"median of {max(1, args.repeat)})")
        print(format_table(rows, [("lab", "lab", ""), ("in_process_s", "in-process s", ".1f"),
                                  ("isolated_s", "isolated s", ".1f"), ("ratio", "ratio", ".2f"),
                                  ("passed", "passed (in | iso)", "")]))
    path = write_results("isolation", {"load_average": load, "calls": calls, "labs": rows},
                         args.out)
    print(f"wrote {path}")
    return 0
