"""``pagedlab bench blocks``: nanoseconds per allocate+free pair and per cache-hit revival,
at 10^3, 10^5 and 10^6 blocks — flat lines mean O(1).

The revival column compares the lab's doubly linked FreeBlockQueue.remove with the O(n) mistake
(a ``collections.deque`` and its ``remove``), which grows with the number of free blocks.
"""

from __future__ import annotations

import argparse
import collections
import time

from reference.tools.bench._common import DEFAULT_OUT, format_table, try_pyplot, write_results
from reference.loader import describe_impl, load_impl

LAB = "lab01_block_manager"


def _ns_per(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(3):  # best of three: the least disturbed run
        t0 = time.perf_counter_ns()
        fn(reps)
        best = min(best, (time.perf_counter_ns() - t0) / reps)
    return best


def measure(impl, num_blocks: int, reps: int) -> dict:
    """Times one size; returns ns per operation for the three operations."""
    bm = impl.BlockManager(num_blocks)
    held = bm.allocate_n(num_blocks // 2)  # a half-full pool, like a busy server

    def alloc_free(k):
        allocate, free = bm.allocate, bm.free
        for _ in range(k):
            free(allocate())

    alloc_free_ns = _ns_per(alloc_free, reps)

    # Revival: a cached free block in the middle of the queue is hit, then freed again.
    for i, block in enumerate(held[: num_blocks // 4]):
        bm.cache_block(block, 10_000_000 + i)
    bm.free_blocks(held[: num_blocks // 4])
    middle_hash = 10_000_000 + num_blocks // 8

    def revive(k):
        get, free = bm.get_cached_block, bm.free
        for _ in range(k):
            free(get(middle_hash))

    dq = collections.deque(range(num_blocks))
    middle = num_blocks // 2

    def deque_remove(k):
        remove, append = dq.remove, dq.append
        for _ in range(k):
            remove(middle)
            append(middle)

    return {
        "num_blocks": num_blocks,
        "alloc_free_ns": alloc_free_ns,
        "revive_ns": _ns_per(revive, reps),
        "deque_remove_ns": _ns_per(deque_remove, max(10, reps // max(1, num_blocks // 1000))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pagedlab bench blocks", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**3, 10**5, 10**6])
    parser.add_argument("--reps", type=int, default=100_000)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for blocks.json / .png")
    args = parser.parse_args(argv)
    impl = load_impl(LAB)
    rows = [measure(impl, n, args.reps) for n in args.sizes]
    print(f"Lab 1 block manager ({describe_impl()})")
    print(format_table(rows, [("num_blocks", "blocks", ","), ("alloc_free_ns", "allocate+free ns", ".0f"),
                              ("revive_ns", "cache-hit revive+free ns", ".0f"),
                              ("deque_remove_ns", "deque.remove+append ns (O(n))", ".0f")]))
    path = write_results("blocks", {"implementation": describe_impl(), "rows": rows}, args.out)
    plt = try_pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = [r["num_blocks"] for r in rows]
        for key, label in [("alloc_free_ns", "allocate + free"), ("revive_ns", "cache-hit revive + free"),
                           ("deque_remove_ns", "deque.remove + append (the O(n) mistake)")]:
            ax.plot(xs, [r[key] for r in rows], marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="num_blocks", ylabel="ns per operation",
               title="Block manager operations stay O(1)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path.with_suffix(".png"), dpi=120)
    print(f"wrote {path}")
    return 0
