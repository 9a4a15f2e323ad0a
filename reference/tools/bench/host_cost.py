"""``pagedlab bench host_cost``: the Python host cost of ``plan.run`` (Labs 4 and 5) on a
machine without a GPU.

Plans are made on the emulated device (CPU tensors of the benchmarks' shapes: decode V, 8 x 4096
tokens, 64q/8kv; prefill P1, 4 x 1024 new tokens, 32q/8kv; fp16, head 128, block 16), then
copied with ``reference.launch_plan.with_null_launches``: every per-call check and every
argument conversion runs, with raw addresses as on a GPU, but nothing launches. So the number
is ``run``'s own Python cost, without CuPy's launch call (a few µs more on a GPU: ``pagedlab
bench decode|prefill`` measure the whole on one, ``host µs``). Median of 7 rounds of 2,000 runs.
"""

from __future__ import annotations

import argparse
import statistics
import time


def _time(fn, calls: int = 2000, rounds: int = 7) -> float:
    for _ in range(200):
        fn()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="pagedlab bench host_cost", description=__doc__).parse_args(argv)
    import torch

    from reference import emulate
    from reference.launch_plan import with_null_launches
    from reference.loader import describe_impl, load_impl

    decode, prefill = load_impl("lab04_decode_kernels"), load_impl("lab05_prefill_kernels")
    rows = []
    with emulate.emulation():
        torch.manual_seed(0)
        s, hq, hkv, d, bs, ctx = 8, 64, 8, 128, 16, 4096
        nb = s * ctx // bs
        kc = torch.randn(nb, hkv, bs, d, dtype=torch.float16)
        bt = torch.arange(nb, dtype=torch.int32).view(s, -1)
        cl = torch.full((s,), ctx, dtype=torch.int32)
        q = torch.randn(s, hq, d, dtype=torch.float16)
        plan = with_null_launches(decode.plan_decode(q, kc, kc, bt, cl, max_context_len=ctx))
        out = torch.empty_like(q)
        rows.append(("decode V plan.run(out=)", _time(lambda: plan.run(q, kc, kc, bt, cl, out=out))))
        rows.append(("decode V plan.run()", _time(lambda: plan.run(q, kc, kc, bt, cl))))
        s, qlen, hq = 4, 1024, 32
        nb = s * qlen // bs
        kc = torch.randn(nb, hkv, bs, d, dtype=torch.float16)
        bt = torch.arange(nb, dtype=torch.int32).view(s, -1)
        cu = torch.arange(0, (s + 1) * qlen, qlen, dtype=torch.int32)
        cl = torch.full((s,), qlen, dtype=torch.int32)
        q = torch.randn(s * qlen, hq, d, dtype=torch.float16)
        args = (q, kc, kc, bt, cu, cl)
        plan = with_null_launches(prefill.plan_prefill(*args, d ** -0.5, kernel="tc"))
        out = torch.empty_like(q)
        rows.append(("prefill P1 tc plan.run(out=)", _time(lambda: plan.run(*args, out=out))))
        rows.append(("prefill P1 tc plan.run()", _time(lambda: plan.run(*args))))
    print(f"plan.run host cost, launches stubbed ({describe_impl()}):")
    for name, us in rows:
        print(f"  {name:32s} {us:6.1f} µs")
    return 0
