"""``pagedlab bench serve``: Lab 6's engine serving a synthetic request trace, beside
``transformers``' ``generate`` on the same requests.

On a CPU (the default, ``--shape tiny``) it serves a small float32 Llama with random weights so
everyone can watch the scheduler work: generated tokens/s, time to first token (all requests
arrive at t = 0), peak KV blocks in use, prefix-cache hit rate, preemptions, and the same requests
through ``transformers`` ``generate`` (batched with left padding, its own dense cache). It plots
throughput and KV blocks in use over the engine's steps.

Prompt and output lengths are log-normal with ShareGPT-like means scaled down to the shape
(seeded); a fraction of prompts start with one of a few shared "system prompts", so the prefix
cache has something to find.

NOTE: the GPU measurement the issue asks for (a 1B-class shape, 256 requests, the ``kernels``
backend) is not made here: this machine has no GPU, and the ``kernels`` backend is not wired yet
(``reference/llama.py`` refuses it clearly). ``--shape`` only offers the CPU shape.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from reference.loader import load_impl
from reference.llama import PagedLlama, make_tiny_hf_llama
from reference.tools.bench._common import DEFAULT_OUT, format_table, try_pyplot, write_results

LAB = "lab06_serving_engine"
SHAPES = {"tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=2, vocab_size=512)}


def make_requests(seed: int, num_requests: int, vocab: int, prompt_mean: float,
                  output_mean: float, shared_fraction: float = 0.5):
    """Seeded synthetic requests: (prompts, output lengths)."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, vocab, 32).tolist() for _ in range(3)]
    prompts, outputs = [], []
    for _ in range(num_requests):
        n = int(np.clip(rng.lognormal(np.log(prompt_mean) - 0.5, 1.0), 4, 4 * prompt_mean))
        prompt = rng.integers(0, vocab, n).tolist()
        if rng.random() < shared_fraction:
            prompt = systems[int(rng.integers(len(systems)))] + prompt
        prompts.append(prompt)
        outputs.append(int(np.clip(rng.lognormal(np.log(output_mean) - 0.5, 1.0), 1, 4 * output_mean)))
    return prompts, outputs


def run_engine(impl, model, prompts, outputs, num_blocks, block_size, budget):
    """Serves every request through Lab 6's engine; returns metrics and a per-step trace."""
    llm = impl.LLM(model, num_blocks=num_blocks, block_size=block_size,
                   max_num_batched_tokens=budget, max_num_seqs=64)
    ids = [llm.add_request(p, impl.SamplingParams(max_tokens=o)) for p, o in zip(prompts, outputs)]
    first_token_at: dict[int, float] = {}
    trace = []
    start = time.perf_counter()
    generated = 0
    while llm.has_unfinished_requests():
        llm.step()
        now = time.perf_counter() - start
        sampled = len(llm.last_logits)
        generated += sampled
        for seq_id in llm.last_logits:
            first_token_at.setdefault(seq_id, now)
        trace.append({"t": now, "tokens": sum(n for _, n in llm.last_scheduled), "sampled": sampled,
                      "used_blocks": num_blocks - llm.block_manager.num_free_blocks})
    elapsed = time.perf_counter() - start
    ttft = np.array([first_token_at[i] for i in ids])
    return {"system": "lab 6 engine", "seconds": elapsed, "tokens_per_s": generated / elapsed,
            "ttft_mean_s": float(ttft.mean()), "ttft_p90_s": float(np.percentile(ttft, 90)),
            "peak_kv_blocks": llm.stats["peak_num_used_blocks"], "num_blocks": num_blocks,
            "prefix_hit_rate": llm.stats["prefix_hit_rate"],
            "preemptions": llm.stats["num_preemptions"], "steps": llm.stats["num_steps"]}, trace


@torch.no_grad()
def run_hf(hf_model, prompts, outputs, batch_size):
    """The same requests through ``transformers`` ``generate``, batched with left padding."""
    start = time.perf_counter()
    generated, ttft = 0, []
    for i in range(0, len(prompts), batch_size):
        batch, lens = prompts[i:i + batch_size], outputs[i:i + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        # NOTE: a batch runs until its longest output; shorter requests' extra tokens are waste.
        hf_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max(lens),
                          min_new_tokens=max(lens), eos_token_id=None, pad_token_id=0)
        now = time.perf_counter() - start
        ttft += [now] * len(batch)  # generate returns whole batches: first token seen at the end
        generated += sum(lens)
    elapsed = time.perf_counter() - start
    return {"system": f"transformers generate (batch {batch_size})", "seconds": elapsed,
            "tokens_per_s": generated / elapsed, "ttft_mean_s": float(np.mean(ttft)),
            "ttft_p90_s": float(np.percentile(ttft, 90))}


def _plot(trace, path, title):
    plt = try_pyplot()
    if plt is None:
        return
    t = np.array([s["t"] for s in trace])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    sampled = np.array([s["sampled"] for s in trace])
    dt = np.diff(np.concatenate([[0.0], t]))
    left.plot(t, sampled / np.maximum(dt, 1e-9), lw=0.8)
    left.set(xlabel="seconds", ylabel="generated tokens / s", title="Throughput per step")
    right.plot(t, [s["used_blocks"] for s in trace], lw=0.8, color="#e6550d")
    right.set(xlabel="seconds", ylabel="KV blocks in use", title="KV pool over time")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pagedlab bench serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-blocks", type=int, default=96)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--budget", type=int, default=256, help="max_num_batched_tokens")
    parser.add_argument("--hf-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for serve.json / .png")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    hf = make_tiny_hf_llama(seed=args.seed, dtype=torch.float32, **SHAPES[args.shape])
    model = PagedLlama.from_hf(hf, dtype=torch.float32)
    prompts, outputs = make_requests(args.seed, args.requests, hf.config.vocab_size, 48.0, 32.0)
    impl = load_impl(LAB)
    engine, trace = run_engine(impl, model, prompts, outputs, args.num_blocks, args.block_size,
                               args.budget)
    rows = [engine]
    if not args.no_hf:
        rows.append(run_hf(hf, prompts, outputs, args.hf_batch))
        engine["speedup_vs_hf"] = engine["tokens_per_s"] / rows[1]["tokens_per_s"]
    kv_bytes = 2 * model.shape.num_layers * args.block_size * model.shape.num_kv_heads * \
        model.shape.head_size * 4
    print(f"{args.requests} requests (seed {args.seed}), mean prompt "
          f"{np.mean([len(p) for p in prompts]):.0f} / output {np.mean(outputs):.0f} tokens, "
          f"shape {args.shape}, float32, {args.threads} thread(s), pool {args.num_blocks} blocks of "
          f"{args.block_size} ({args.num_blocks * kv_bytes / 2**20:.2f} MiB)")
    print(format_table(rows, [
        ("system", "system", ""), ("tokens_per_s", "gen tok/s", ".0f"),
        ("ttft_mean_s", "TTFT mean s", ".3f"), ("ttft_p90_s", "TTFT p90 s", ".3f"),
        ("peak_kv_blocks", "peak KV blocks", ""), ("prefix_hit_rate", "prefix hit", ".2f"),
        ("preemptions", "preempt.", ""), ("steps", "steps", ""), ("seconds", "s", ".2f")]))
    payload = {"shape": {"name": args.shape, **SHAPES[args.shape]}, "args": vars(args),
               "rows": rows, "trace": trace, "impl": getattr(impl, "__name__", LAB)}
    path = write_results("serve", payload, args.out)
    _plot(trace, path.with_suffix(".png"), f"Lab 6 engine, {args.requests} requests, shape "
          f"{args.shape}, {args.num_blocks} blocks of {args.block_size}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
