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

On a GPU, ``--shape llama-1b --backend kernels`` serves a Llama-3.2-1B-shaped model (16 layers,
hidden 2048, 32 query / 8 KV heads of 64, vocab 128256; random float16 weights made on the GPU)
with Lab 4's decode and Lab 5's prefill kernels: 256 requests by default, the pool as large as
the dense KV cache ``transformers`` needs for its largest batch (``--num-blocks auto``: equal KV
memory), ``transformers`` with SDPA attention. It also reports the peak GPU memory each system
allocated beyond the weights. ``--requests`` and ``--output-mean`` scale the run's length.

The kernels run the Labs 4–5 implementation ``LAB_IMPL`` picks (your own with a release). Without
a GPU, ``PAGEDLAB_DEVICE=emulate ... --shape tiny-kernels --backend kernels`` runs the same path
on the CPU (the labs' ``.cu`` files compiled with g++) at a toy size: slow, but the same code.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from reference.emulate import emulating
from reference.loader import describe_impl, load_impl
from reference.llama import PagedLlama, make_tiny_hf_llama
from reference.tools.bench._common import DEFAULT_OUT, format_table, try_pyplot, write_results

LAB = "lab06_serving_engine"
SHAPES = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=2, vocab_size=512),
    # Head size 64 (the kernels' smallest), for the kernels on the emulated device.
    "tiny-kernels": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
    # Llama-3.2-1B's shape (random weights): the GPU benchmark of issue 14.
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                     max_position_embeddings=4096, rope_theta=500000.0,
                     tie_word_embeddings=True),
}
#: Per shape: engine sizes and the requests' mean prompt / output lengths (ShareGPT's are
#: ~250 / ~200 tokens; the CPU shapes scale them down).
DEFAULTS = {
    "tiny": dict(num_blocks=96, budget=256, max_num_seqs=64, prompt_mean=48.0, output_mean=32.0),
    "tiny-kernels": dict(num_blocks=96, budget=256, max_num_seqs=64, prompt_mean=48.0,
                         output_mean=32.0),
    "llama-1b": dict(num_blocks="auto", budget=2048, max_num_seqs=128, prompt_mean=256.0,
                     output_mean=128.0),
}


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _mem_start(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _mem_peak_gib(device: torch.device, start: int) -> float | None:
    """Peak memory allocated since :func:`_mem_start` beyond what was allocated then (GiB)."""
    if device.type != "cuda":
        return None
    return (torch.cuda.max_memory_allocated(device) - start) / 2**30


def kv_bytes_per_token(model: PagedLlama) -> int:
    """K and V of every layer for one token, in the model's dtype.

    Args:
        model: the paged model.

    Returns:
        Bytes per token.
    """
    s = model.shape
    return 2 * s.num_layers * s.num_kv_heads * s.head_size * model.weights["lm_head.weight"].element_size()


def hf_kv_bytes(prompts, outputs, batch_size: int, per_token: int) -> int:
    """The dense KV cache ``transformers`` holds for its largest batch: every row padded to the
    batch's longest prompt plus its longest output.

    Args:
        prompts: token ids per request.
        outputs: tokens to generate per request.
        batch_size: requests per ``generate`` call (in order, as :func:`run_hf` batches them).
        per_token: :func:`kv_bytes_per_token`.

    Returns:
        Bytes.
    """
    worst = 0
    for i in range(0, len(prompts), batch_size):
        batch, lens = prompts[i:i + batch_size], outputs[i:i + batch_size]
        worst = max(worst, len(batch) * (max(map(len, batch)) + max(lens)))
    return worst * per_token


def run_engine(impl, model, prompts, outputs, num_blocks, block_size, budget, max_num_seqs=64,
               backend="oracle"):
    """Serves every request through Lab 6's engine; returns metrics and a per-step trace."""
    device = model.device
    mem0 = _mem_start(device)
    llm = impl.LLM(model, num_blocks=num_blocks, block_size=block_size,
                   max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                   attention_backend=backend)
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
    _sync(device)
    elapsed = time.perf_counter() - start
    ttft = np.array([first_token_at[i] for i in ids])
    per_block = kv_bytes_per_token(model) * block_size
    return {"system": f"lab 6 engine ({backend})", "seconds": elapsed,
            "generated_tokens": generated,
            "peak_kv_mib": llm.stats["peak_num_used_blocks"] * per_block / 2**20,
            "pool_kv_mib": num_blocks * per_block / 2**20,
            "peak_mem_gib": _mem_peak_gib(device, mem0), "tokens_per_s": generated / elapsed,
            "ttft_mean_s": float(ttft.mean()), "ttft_p90_s": float(np.percentile(ttft, 90)),
            "peak_kv_blocks": llm.stats["peak_num_used_blocks"], "num_blocks": num_blocks,
            "prefix_hit_rate": llm.stats["prefix_hit_rate"],
            "preemptions": llm.stats["num_preemptions"], "steps": llm.stats["num_steps"]}, trace


@torch.no_grad()
def run_hf(hf_model, prompts, outputs, batch_size, kv_per_token: int = 0):
    """The same requests through ``transformers`` ``generate``, batched with left padding."""
    device = hf_model.device
    mem0 = _mem_start(device)
    start = time.perf_counter()
    generated, ttft = 0, []
    for i in range(0, len(prompts), batch_size):
        batch, lens = prompts[i:i + batch_size], outputs[i:i + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        # NOTE: a batch runs until its longest output; shorter requests' extra tokens are waste.
        hf_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max(lens),
                          min_new_tokens=max(lens), eos_token_id=None, pad_token_id=0)
        _sync(device)
        now = time.perf_counter() - start
        ttft += [now] * len(batch)  # generate returns whole batches: first token seen at the end
        generated += sum(lens)
    elapsed = time.perf_counter() - start
    attn = getattr(hf_model.config, "_attn_implementation", "?")
    return {"system": f"transformers generate (batch {batch_size}, {attn})", "seconds": elapsed,
            "generated_tokens": generated, "tokens_per_s": generated / elapsed,
            "ttft_mean_s": float(np.mean(ttft)), "ttft_p90_s": float(np.percentile(ttft, 90)),
            "peak_kv_mib": hf_kv_bytes(prompts, outputs, batch_size, kv_per_token) / 2**20,
            "peak_mem_gib": _mem_peak_gib(device, mem0)}


def _plot(trace, path, title, hf_tokens_per_s=None, per_block_mib=None):
    plt = try_pyplot()
    if plt is None:
        return
    t = np.array([s["t"] for s in trace])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    sampled = np.array([s["sampled"] for s in trace])
    dt = np.diff(np.concatenate([[0.0], t]))
    left.plot(t, sampled / np.maximum(dt, 1e-9), lw=0.8, label="lab 6 engine, per step")
    if hf_tokens_per_s:
        left.axhline(hf_tokens_per_s, color="k", ls="--", lw=0.8, label="transformers, mean")
    left.set(xlabel="seconds", ylabel="generated tokens / s", title="Throughput per step")
    left.legend(fontsize=7)
    used = np.array([s["used_blocks"] for s in trace], dtype=float)
    if per_block_mib:
        right.plot(t, used * per_block_mib, lw=0.8, color="#e6550d")
        right.set(xlabel="seconds", ylabel="KV memory in use (MiB)", title="KV pool over time")
    else:
        right.plot(t, used, lw=0.8, color="#e6550d")
        right.set(xlabel="seconds", ylabel="KV blocks in use", title="KV pool over time")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _device(backend: str, requested: str | None) -> str:
    """Where the model lives: the kernels' device for ``kernels``; else the GPU if there is one."""
    if backend == "kernels":
        from reference.kernel_backend import kernel_device_type

        return kernel_device_type()
    return requested or ("cuda" if torch.cuda.is_available() else "cpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pagedlab bench serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPES), default="tiny")
    parser.add_argument("--backend", choices=("oracle", "kernels"), default="oracle",
                        help="attention backend (kernels: Labs 4-5, a GPU or PAGEDLAB_DEVICE=emulate)")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                        help="default: float16 for kernels or llama-1b, else float32")
    parser.add_argument("--device", default=None, help="oracle backend: cpu or cuda (default: "
                        "cuda when there is one)")
    parser.add_argument("--requests", type=int, default=None, help="default: 256 for llama-1b, "
                        "else 48")
    parser.add_argument("--prompt-mean", type=float, default=None, help="mean prompt tokens")
    parser.add_argument("--output-mean", type=float, default=None, help="mean output tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-blocks", default=None,
                        help="KV pool blocks, or 'auto': as many bytes as transformers' dense "
                        "cache for its largest batch (equal KV memory)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--budget", type=int, default=None, help="max_num_batched_tokens")
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--hf-batch", type=int, default=None, help="default: 32 for llama-1b, "
                        "else 8")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for the .json / .png")
    parser.add_argument("--name", default=None, help="results file name (default serve, or "
                        "serve_<shape>_<backend> for other shapes/backends)")
    args = parser.parse_args(argv)
    defaults = DEFAULTS[args.shape]
    big = args.shape == "llama-1b"
    requests = args.requests or (256 if big else 48)
    prompt_mean = args.prompt_mean or defaults["prompt_mean"]
    output_mean = args.output_mean or defaults["output_mean"]
    budget = args.budget or defaults["budget"]
    max_num_seqs = args.max_num_seqs or defaults["max_num_seqs"]
    hf_batch = args.hf_batch or (32 if big else 8)
    dtype_name = args.dtype or ("float16" if args.backend == "kernels" or big else "float32")
    dtype = getattr(torch, dtype_name)
    device = torch.device(_device(args.backend, args.device))
    torch.set_num_threads(args.threads)
    # NOTE: transformers' own fastest built-in attention for the baseline on a GPU; eager
    # (what the paged model matches bit for bit) on the CPU shapes.
    attn = "sdpa" if device.type == "cuda" else "eager"
    hf = make_tiny_hf_llama(seed=args.seed, dtype=dtype, device=str(device),
                            attn_implementation=attn, **SHAPES[args.shape])
    model = PagedLlama.from_hf(hf, dtype=dtype, device=str(device),
                               attention_backend=args.backend)
    prompts, outputs = make_requests(args.seed, requests, hf.config.vocab_size, prompt_mean,
                                     output_mean)
    per_token = kv_bytes_per_token(model)
    num_blocks = args.num_blocks or defaults["num_blocks"]
    if num_blocks == "auto":
        num_blocks = -(-hf_kv_bytes(prompts, outputs, hf_batch, per_token)
                       // (per_token * args.block_size))
    num_blocks = int(num_blocks)
    impl = load_impl(LAB)
    engine, trace = run_engine(impl, model, prompts, outputs, num_blocks, args.block_size,
                               budget, max_num_seqs, args.backend)
    rows = [engine]
    if not args.no_hf:
        if args.backend == "kernels" or device.type == "cuda":
            del model  # the baseline gets the memory back (the engine's pool went with llm)
        rows.append(run_hf(hf, prompts, outputs, hf_batch, per_token))
        engine["speedup_vs_hf"] = engine["tokens_per_s"] / rows[1]["tokens_per_s"]
    pool_mib = num_blocks * args.block_size * per_token / 2**20
    print(f"{requests} requests (seed {args.seed}), mean prompt "
          f"{np.mean([len(p) for p in prompts]):.0f} / output {np.mean(outputs):.0f} tokens, "
          f"shape {args.shape}, {dtype_name}, {device}{' (emulated)' if emulating() else ''}, backend {args.backend} ({describe_impl()} "
          f"for Labs 4-6), pool {num_blocks} blocks of {args.block_size} ({pool_mib:.2f} MiB), "
          f"budget {budget}, max_num_seqs {max_num_seqs}")
    columns = [("system", "system", ""), ("tokens_per_s", "gen tok/s", ".0f"),
               ("ttft_mean_s", "TTFT mean s", ".3f"), ("ttft_p90_s", "TTFT p90 s", ".3f"),
               ("peak_kv_blocks", "peak KV blocks", ""), ("peak_kv_mib", "peak KV MiB", ".1f"),
               ("prefix_hit_rate", "prefix hit", ".2f"), ("preemptions", "preempt.", ""),
               ("steps", "steps", ""), ("seconds", "s", ".2f")]
    if device.type == "cuda":
        columns.insert(6, ("peak_mem_gib", "peak mem GiB", ".2f"))
    print(format_table(rows, columns))
    if "speedup_vs_hf" in engine:
        print(f"engine / transformers throughput: {engine['speedup_vs_hf']:.2f}x")
    name = args.name or ("serve" if (args.shape, args.backend) == ("tiny", "oracle")
                         else f"serve_{args.shape}_{args.backend}")
    payload = {"shape": {"name": args.shape, **SHAPES[args.shape]}, "dtype": dtype_name,
               "device": str(device), "emulated": emulating(), "backend": args.backend,
               "impl": describe_impl(),
               "requests": {"num": requests, "prompt_mean": prompt_mean,
                            "output_mean": output_mean},
               "engine": {"num_blocks": num_blocks, "block_size": args.block_size,
                          "budget": budget, "max_num_seqs": max_num_seqs},
               "args": vars(args), "rows": rows, "trace": trace}
    path = write_results(name, payload, args.out)
    _plot(trace, path.with_suffix(".png"), f"Lab 6 engine ({args.backend}), {requests} requests, "
          f"shape {args.shape}, {dtype_name}, {num_blocks} blocks of {args.block_size}",
          rows[1]["tokens_per_s"] if len(rows) > 1 else None,
          args.block_size * per_token / 2**20)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
