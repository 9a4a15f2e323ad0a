"""Paired timings: "× FlashInfer" verdicts that the GPU's drift cannot decide.

Two kernels at the same hardware ceiling differ by 0-3 %, about as much as one GPU's own
speed drifts between two measurements a few seconds apart: on an H200 (2026-11-29) FlashInfer's
D1 decode read 251, 261 and 258 µs in three rounds of one process, and our kernel beside it
252, 270 and 257. A ratio of two figures taken at different moments then reports *when* they
were taken. So the benchmarks' verdicts time the contenders in alternation, round after round,
and take a ratio per round: drift moves both sides of a round's ratio alike. The verdict's
figure is the median round; the lowest and highest rounds are reported beside it, so a reader
sees the spread.

The rounds' orders form a balanced (Williams) design: every contender runs in every position
equally often and follows every other contender equally often. Order matters: with the order
merely rotated, D4's ``plan.run`` ran 2-3 % faster exactly in the rounds it went first, in two
runs (H200, 2026-11-29), and a rotation repeats its neighbours.

* :func:`round_orders` builds the orders; :func:`paired_times` times several launchers in
  those rounds (CUDA-graph replays or eager back-to-back calls), and
  :func:`graph_and_eager_rounds` runs both kinds, reporting a failure instead of raising it;
* :func:`round_ratios` and :func:`summary` turn them into "× reference" per round, and its
  median and range (pure functions: tested without a GPU);
* :func:`verdict` is one target check (figure, target, met); :func:`mark` its printed word.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence


def _graph_timer(fn: Callable, calls: int = 10) -> Callable[[], float]:
    """Captures ``calls`` back-to-back calls of ``fn`` in a CUDA graph; returns a function
    timing its replays (µs per call, median of 3 event pairs of 10 replays each).

    Raises:
        RuntimeError: (torch's) the launcher cannot be captured, e.g. it synchronises.
    """
    import torch

    from reference.tools.bench._gpu import capture_graph, time_cuda

    graph = capture_graph(fn, calls)
    torch.cuda.synchronize()
    iters = max(2, 100 // calls)  # 3 x 100 calls a round: rounds, not long timings, average out drift
    timer = lambda: time_cuda(graph.replay, warmup=1, iters=iters, repeats=3) / calls  # noqa: E731
    timer.graph = graph  # the graph must live as long as its timer
    return timer


def _eager_timer(fn: Callable) -> Callable[[], float]:
    """Returns a function timing back-to-back eager calls of ``fn`` (µs per call, CUDA events:
    the slower of the host path and the kernel, what an uncaptured loop sees)."""
    from reference.tools.bench._gpu import time_cuda

    return lambda: time_cuda(fn, warmup=2, iters=20, repeats=3)


def round_orders(n: int, min_rounds: int = 6) -> list[list[int]]:
    """Orders of ``n`` contenders for successive rounds, balanced for position and predecessor.

    A Williams design: the first order is 0, 1, n-1, 2, n-2, ...; order i adds i to each (mod n).
    Over those n orders every contender holds every position once and directly follows every
    other contender once; for an odd n the n reversed orders are needed too. The design is
    repeated until there are at least ``min_rounds`` rounds.

    Args:
        n: contenders (>= 1).
        min_rounds: the fewest rounds wanted.

    Returns:
        A list of orders, each a permutation of ``range(n)``.

    Raises:
        ValueError: ``n`` below 1.
    """
    if n < 1:
        raise ValueError(f"round_orders needs at least one contender, got n={n}")
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    design = [[(x + i) % n for x in first] for i in range(n)]
    if n % 2:
        design += [order[::-1] for order in design]
    orders = []
    while len(orders) < max(1, min_rounds):
        orders += design
    return orders


def paired_times(fns: Mapping[str, Callable], *, min_rounds: int = 6,
                 graph: bool = True) -> dict[str, list[float]]:
    """Times launchers in alternation: in each round every one once, in :func:`round_orders`.

    Args:
        fns: name -> a launcher (launches on the current torch stream, no host sync inside).
        min_rounds: the fewest rounds (the design is repeated whole: 4 contenders give 8
            rounds, 3 give 6, 2 give 6).
        graph: time CUDA-graph replays of 10 back-to-back calls (kernel time, no launch gaps);
            False: eager back-to-back calls.

    Returns:
        name -> µs per call, one figure per round; the key ``"_orders"`` holds each round's
        order of names.
    """
    names = list(fns)
    timers = {n: (_graph_timer(fns[n]) if graph else _eager_timer(fns[n])) for n in names}
    times: dict[str, list] = {n: [] for n in names}
    orders = [[names[i] for i in order] for order in round_orders(len(names), min_rounds)]
    for order in orders:
        for n in order:
            times[n].append(timers[n]())
    times["_orders"] = orders
    return times


def graph_and_eager_rounds(workload: str, graph_fns: Mapping[str, Callable],
                           eager_fns: Mapping[str, Callable]) -> dict:
    """:func:`paired_times` as graph replays for ``graph_fns``, then eager for ``eager_fns``.

    Returns:
        ``{"graph": times, "eager": times}``, or ``{"workload", "error"}`` when the rounds
        failed: a verdict not measured is reported on its line, it does not end the benchmark.
    """
    try:
        return {"graph": paired_times(graph_fns), "eager": paired_times(eager_fns, graph=False)}
    except Exception as exc:  # noqa: BLE001
        import torch

        torch.cuda.synchronize()
        print(f"  {workload} paired rounds failed: {type(exc).__name__}: {exc}", flush=True)
        return {"workload": workload, "error": f"{type(exc).__name__}: {exc}"[:300]}


def mark(v: dict, met: str = "ok") -> str:
    """A :func:`verdict`'s word for a printed line: ``met``, "MISSED", or "-" (not measured)."""
    return "-" if v["met"] is None else (met if v["met"] else "MISSED")


def round_ratios(times: Mapping[str, Sequence[float]], ours: str,
                 references: Sequence[str]) -> list[float]:
    """Per round, "× reference": the fastest reference's time over ours (> 1: ours is faster).

    Args:
        times: name -> µs per round (:func:`paired_times`).
        ours: the name timed against the references.
        references: the contenders; each round takes the fastest of them (FlashInfer's best of
            its two decode paths, as a user would pick).

    Returns:
        One ratio per round.

    Raises:
        ValueError: no reference, or the names' round counts differ.
    """
    if not references:
        raise ValueError("round_ratios needs at least one reference")
    times = {k: v for k, v in times.items() if not k.startswith("_")}
    n = len(times[ours])
    if any(len(times[ref]) != n for ref in references):
        raise ValueError("every name must have one time per round")
    return [min(times[ref][r] for ref in references) / times[ours][r] for r in range(n)]


def summary(ratios: Sequence[float]) -> dict:
    """Returns ``{"x": median, "low": min, "high": max, "rounds": n}`` of per-round ratios."""
    if not ratios:
        raise ValueError("summary needs at least one round")
    return {"x": statistics.median(ratios), "low": min(ratios), "high": max(ratios),
            "rounds": len(ratios)}


def verdict(figure: float | None, target: float, *, at_most: bool = False) -> dict:
    """One target check: ``{"figure", "target", "met"}`` (``met`` None when not measured).

    Args:
        figure: the measured figure (a ratio, or µs), None when it was not measured.
        target: the bound.
        at_most: the figure must be <= target (host µs); else >= target (ratios).
    """
    met = None if figure is None else (figure <= target if at_most else figure >= target)
    return {"figure": figure, "target": target, "met": met}
