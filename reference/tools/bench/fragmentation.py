"""``pagedlab bench fragmentation``: how much KV memory contiguous reservation wastes, and how
much paging with block sizes 1, 8, 16, 32 and 128 wastes, on a seeded synthetic request trace.

Two measurements per strategy:

* **Where the reserved memory goes**, averaged over every decode step of every request: slots
  holding a token's K/V (*used*), slots reserved for tokens the request will still generate
  (*reserved*), and slots it will never fill (*internal fragmentation*). This is the breakdown
  of Figure 2 in the vLLM paper.
* **How many sequences fit** in a fixed budget of KV slots, with each request caught at a
  random moment of its generation and requests packed in arrival order.

The trace is synthetic: prompt and output lengths are log-normal with the means the vLLM paper
reports for ShareGPT (161 prompt and 338 output tokens); the spread (sigma = 1) is our choice.
Everything is seeded, so the numbers are the same on every machine. No GPU is involved: this
is accounting, and it is exact.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from reference.tools.bench._common import DEFAULT_OUT, format_table, try_pyplot, write_results

MAX_MODEL_LEN = 2048
BLOCK_SIZES = (1, 8, 16, 32, 128)
#: 16,384 slots ≈ 13 GB for LLaMA-13B (800 KB per token, the paper's figure): about the KV
#: space its 13B-on-A100-40GB example leaves.
BUDGET_SLOTS = 16_384
PROMPT_MEAN, OUTPUT_MEAN, SIGMA = 161.0, 338.0, 1.0


@dataclass
class Trace:
    """A synthetic request trace.

    Attributes:
        prompt_lens: [num_requests] tokens of each prompt (>= 1).
        output_lens: [num_requests] tokens each request generates (>= 1).
        snapshot_lens: [num_requests] tokens in the cache at a random moment of generation.
        max_model_len: the cap on prompt + output.
    """

    prompt_lens: np.ndarray
    output_lens: np.ndarray
    snapshot_lens: np.ndarray
    max_model_len: int

    @property
    def final_lens(self) -> np.ndarray:
        return self.prompt_lens + self.output_lens


def make_trace(seed: int = 0, num_requests: int = 2000,
               max_model_len: int = MAX_MODEL_LEN) -> Trace:
    """Draws a seeded trace (see the module docstring for the distribution).

    Args:
        seed: RNG seed.
        num_requests: requests in the trace.
        max_model_len: prompt + output never exceeds this.

    Returns:
        The trace.
    """
    rng = np.random.default_rng(seed)

    def lognormal(mean: float) -> np.ndarray:
        mu = np.log(mean) - SIGMA**2 / 2  # so that the distribution's mean is `mean`
        return np.maximum(1, np.rint(rng.lognormal(mu, SIGMA, num_requests))).astype(np.int64)

    prompt = np.minimum(lognormal(PROMPT_MEAN), max_model_len - 1)
    output = np.minimum(lognormal(OUTPUT_MEAN), max_model_len - prompt)
    # A moment of generation: after decode step t (1..output), the cache holds prompt + t tokens.
    step = 1 + np.floor(rng.random(num_requests) * output).astype(np.int64)
    return Trace(prompt, output, prompt + step, max_model_len)


def strategies(block_sizes=BLOCK_SIZES) -> list[str]:
    """Names of the strategies compared, contiguous first."""
    return ["contiguous, max_model_len", "contiguous, exact final length"] + [
        f"paged, block_size {b}" for b in block_sizes
    ]


def reserved_slots(strategy: str, cache_lens: np.ndarray, final_lens: np.ndarray,
                   max_model_len: int) -> np.ndarray:
    """Slots a request holds when its cache has ``cache_lens`` tokens.

    Args:
        strategy: one of :func:`strategies`.
        cache_lens: tokens currently in each request's cache.
        final_lens: each request's final length (prompt + output).
        max_model_len: longest sequence allowed.

    Returns:
        Slots reserved per request (same shape as ``cache_lens``).
    """
    if strategy == "contiguous, max_model_len":
        # Pre-paging engines reserved one contiguous chunk for the longest possible sequence.
        return np.full_like(cache_lens, max_model_len)
    if strategy == "contiguous, exact final length":
        # An oracle that knows each output length: the best any contiguous scheme can do.
        return np.array(final_lens, copy=True)
    block_size = int(strategy.rsplit(" ", 1)[1])
    return -(-cache_lens // block_size) * block_size


def memory_breakdown(trace: Trace, strategy: str) -> dict:
    """Time-averaged use of reserved KV slots over every decode step of every request.

    Returns:
        Fractions of reserved slots: ``used``, ``reserved`` (for tokens still to come),
        ``internal`` (never filled); and ``waste`` = reserved + internal.
    """
    used = reserved = internal = 0
    final = trace.final_lens
    for p, f in zip(trace.prompt_lens.tolist(), final.tolist()):
        lens = np.arange(p + 1, f + 1)  # cache length after each decode step
        slots = reserved_slots(strategy, lens, np.full_like(lens, f), trace.max_model_len)
        fillable = np.minimum(slots, f)
        used += int(lens.sum())
        reserved += int((fillable - lens).sum())
        internal += int((slots - fillable).sum())
    total = used + reserved + internal
    return {"used": used / total, "reserved": reserved / total, "internal": internal / total,
            "waste": (reserved + internal) / total}


def sequences_that_fit(trace: Trace, strategy: str, budget_slots: int = BUDGET_SLOTS,
                       start: int = 0) -> int:
    """How many consecutive requests from ``start``, caught at their snapshot lengths, fit.

    Args:
        trace: the trace.
        strategy: one of :func:`strategies`.
        budget_slots: KV slots available.
        start: index of the first request packed.

    Returns:
        The number of requests packed before the next one would not fit.
    """
    lens = trace.snapshot_lens[start:]
    slots = reserved_slots(strategy, lens, trace.final_lens[start:], trace.max_model_len)
    return int(np.searchsorted(np.cumsum(slots), budget_slots, side="right"))


def measure(trace: Trace, strategy: str, budget_slots: int = BUDGET_SLOTS,
            window_step: int = 10, num_windows: int = 100) -> dict:
    """One row of the table: the breakdown and the mean number of sequences that fit."""
    fits = [sequences_that_fit(trace, strategy, budget_slots, start)
            for start in range(0, num_windows * window_step, window_step)]
    row = {"strategy": strategy, **memory_breakdown(trace, strategy),
           "seqs_fit": float(np.mean(fits)), "seqs_fit_first": fits[0]}
    if strategy.startswith("paged"):
        block_size = int(strategy.rsplit(" ", 1)[1])
        row["block_size"] = block_size
        row["table_width"] = -(-trace.max_model_len // block_size)
    else:
        row["block_size"] = None
        row["table_width"] = None
    return row


def short_name(strategy: str) -> str:
    """A two-line label for plots: ``contig.\nmax len``, ``paged\nbs=16``, ..."""
    return {"contiguous, max_model_len": "contig.\nmax len",
            "contiguous, exact final length": "contig.\noracle"}.get(
        strategy, strategy.replace("paged, block_size ", "paged\nbs="))


def _plot(rows: list[dict], path, title: str) -> None:
    plt = try_pyplot()
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = [short_name(r["strategy"]) for r in rows]
    bottom = np.zeros(len(rows))
    for key, label, colour in [("used", "token K/V", "#2b8cbe"),
                               ("reserved", "reserved for later tokens", "#fdae6b"),
                               ("internal", "internal fragmentation", "#e6550d")]:
        vals = np.array([100 * r[key] for r in rows])
        left.bar(names, vals, bottom=bottom, label=label, color=colour)
        bottom += vals
    left.set(ylabel="% of reserved KV memory", title="Where the reserved memory goes")
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    left.tick_params(axis="x", labelsize=7)
    right.bar(names, [r["seqs_fit"] for r in rows], color="#31a354")
    right.set(ylabel="sequences", title="Sequences that fit in the budget")
    right.tick_params(axis="x", labelsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pagedlab bench fragmentation", description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--budget-slots", type=int, default=BUDGET_SLOTS)
    parser.add_argument("--out", default=str(DEFAULT_OUT),
                        help="folder for fragmentation.json / .png")
    args = parser.parse_args(argv)
    trace = make_trace(args.seed, args.requests)
    rows = [measure(trace, s, args.budget_slots) for s in strategies()]
    print(f"KV memory waste on a synthetic trace ({args.requests} requests, seed {args.seed}, "
          f"max_model_len {MAX_MODEL_LEN}; mean prompt {trace.prompt_lens.mean():.0f}, "
          f"mean output {trace.output_lens.mean():.0f} tokens)")
    percent = ("used", "reserved", "internal", "waste")
    table_rows = [{**r, **{k: 100 * r[k] for k in percent}} for r in rows]
    print(format_table(table_rows, [
        ("strategy", "strategy", ""), ("used", "used %", ".1f"), ("reserved", "reserved %", ".1f"),
        ("internal", "internal frag. %", ".1f"), ("waste", "wasted %", ".1f"),
        ("seqs_fit", f"seqs in {args.budget_slots} slots", ".1f"),
        ("table_width", "table width", ""),
    ]))
    payload = {
        "trace": {"seed": args.seed, "num_requests": args.requests, "max_model_len": MAX_MODEL_LEN,
                  "prompt_mean": float(trace.prompt_lens.mean()),
                  "output_mean": float(trace.output_lens.mean()),
                  "distribution": f"log-normal, sigma {SIGMA}, means "
                                  f"{PROMPT_MEAN:.0f}/{OUTPUT_MEAN:.0f}"},
        "budget_slots": args.budget_slots,
        "rows": rows,
    }
    path = write_results("fragmentation", payload, args.out)
    _plot(rows, path.with_suffix(".png"),
          f"{args.requests} synthetic requests (seed {args.seed}), "
          f"budget {args.budget_slots} KV slots")
    print(f"wrote {path}")
    return 0
