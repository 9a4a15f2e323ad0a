"""Infrastructure (no points): plan once, run many — Lab 4's ``plan_decode`` and Lab 5's
``plan_prefill`` (given code: ``labs/<lab>/_plan.py`` on ``reference/launch_plan.py``).

Why no points: the plans are given code built on the student's TODO functions, which the graded
tests already grade one by one; and graded tests call student code through the isolation proxy
(a worker process), across which a plan — kernel handles, device scratch — is not meant to
travel. These tests run on the solution.

CPU-OK tests build their plans on the emulated device (CPU tensors stand in for the GPU's);
tests marked ``emulated`` run on a GPU, or emulated with ``PAGEDLAB_DEVICE=emulate``; the
sync-free and CUDA-graph proofs need a real GPU (skipped elsewhere, with the reason).
"""

from __future__ import annotations

import numpy as np
import pytest

from reference import emulate
from reference.errors import DeviceMismatchError
from reference.gpu import gpu_only, gpu_skip_reason, kernel_device, kernel_skip_reason, synchronize
from reference.loader import load_impl

torch = pytest.importorskip("torch")

DECODE = "lab04_decode_kernels"
PREFILL = "lab05_prefill_kernels"
KERNEL_TEST = [pytest.mark.emulated,
               pytest.mark.skipif(kernel_skip_reason() is not None,
                                  reason=f"GPU-REQ: {kernel_skip_reason()}")]
GPU_TEST = [pytest.mark.skipif(gpu_skip_reason() is not None,
                               reason=f"GPU-REQ: {gpu_skip_reason()}"),
            gpu_only("CUDA graphs and torch's sync debug mode are the GPU's")]


def decode_case(lens=(1, 15, 17, 100, 600), q_heads=8, kv_heads=2, device=None):
    from labs.lab04_decode_kernels._cases import GpuCase

    if device is None:
        return GpuCase(11, list(lens), q_heads, kv_heads, 128, 16)
    with emulate.emulation(device == "cpu"):
        return GpuCase(11, list(lens), q_heads, kv_heads, 128, 16)


def prefill_batch(**kw):
    from labs.lab05_prefill_kernels._cases import make_batch

    return make_batch(3, [5, 17], [0, 20], 4, 2, 64, 16, **kw)


PREFILL_ARGS = ("query", "key_cache", "value_cache", "block_tables", "cu_seqlens_q",
                "context_lens")


def prefill_args(b):
    return [b[k] for k in PREFILL_ARGS]


# ----------------------------------------------------------------------------- CPU: validation


@pytest.fixture(scope="module")
def cpu_decode():
    """A decode plan on the emulated device (CPU tensors) and its example case."""
    impl = load_impl(DECODE, "solution")
    with emulate.emulation():
        case = decode_case(device="cpu")
        return impl, case, impl.plan_decode(*case.args(), case.scale, max_context_len=640)


@pytest.fixture(scope="module")
def cpu_prefill():
    impl = load_impl(PREFILL, "solution")
    with emulate.emulation():
        b = prefill_batch(device="cpu")
        return impl, b, impl.plan_prefill(*prefill_args(b), b["scale"], kernel="tc")


@pytest.mark.parametrize("bad", ["shape", "dtype", "noncontiguous", "not_a_tensor", "misaligned"])
def test_decode_run_refuses_what_was_not_planned(cpu_decode, bad):
    """A run whose tensors differ from the plan's (shape, dtype, contiguity, type, alignment)
    raises the typed error naming the argument, before any launch."""
    impl, case, plan = cpu_decode
    q, k, v, bt, cl = case.args()
    args = {"query": q, "key_cache": k, "value_cache": v, "block_tables": bt, "context_lens": cl}
    name, want = {"shape": ("query", ValueError), "dtype": ("context_lens", TypeError),
                  "noncontiguous": ("block_tables", ValueError),
                  "not_a_tensor": ("value_cache", TypeError),
                  "misaligned": ("query", ValueError)}[bad]
    x = args[name]
    args[name] = {"shape": lambda: x[:2], "dtype": lambda: x.to(torch.int64),
                  "noncontiguous": lambda: x.t().contiguous().t(),
                  "not_a_tensor": lambda: x.tolist(),
                  "misaligned": lambda: torch.empty(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape)}[bad]()
    with emulate.emulation(), pytest.raises(want, match=name):
        plan.run(*args.values())


def test_decode_run_refuses_an_out_of_another_shape(cpu_decode):
    """``out`` is checked like ``query``: a wrong one is refused, naming ``out``."""
    impl, case, plan = cpu_decode
    with emulate.emulation(), pytest.raises(ValueError, match="out"):
        plan.run(*case.args(), out=torch.empty(3, 8, 128, dtype=case.query.dtype))


def test_plan_refuses_another_device():
    """A run on another device than planned is a DeviceMismatchError naming the argument."""
    from reference.launch_plan import check_like, spec_of

    spec = spec_of(torch.zeros(4, dtype=torch.float16))
    meta = torch.zeros(4, dtype=torch.float16, device="meta")
    with pytest.raises(DeviceMismatchError, match="key_cache"):
        check_like("key_cache", meta, spec)
    with pytest.raises(TypeError, match="key_cache"):
        check_like("key_cache", [0.0] * 4, spec)


def test_plans_are_immutable(cpu_decode, cpu_prefill):
    """Plans refuse attribute assignment and deletion (captured graphs share them); a run
    leaves every attribute as it was."""
    for plan in (cpu_decode[2], cpu_prefill[2]):
        before = dict(vars(plan))
        with pytest.raises(AttributeError, match="immutable"):
            plan.debug = True
        with pytest.raises(AttributeError, match="immutable"):
            del plan._launches
        assert dict(vars(plan)) == before


def test_prefill_run_refuses_what_was_not_planned(cpu_prefill):
    """Prefill: another dtype of cu_seqlens_q, another query length, or ALiBi slopes the plan
    was made without raise the typed error naming the argument."""
    impl, b, plan = cpu_prefill
    args = prefill_args(b)
    with emulate.emulation():
        with pytest.raises(TypeError, match="cu_seqlens_q"):
            plan.run(*args[:4], args[4].to(torch.int64), args[5])
        with pytest.raises(ValueError, match="query"):
            plan.run(args[0][:-1], *args[1:])
        with pytest.raises(ValueError, match="alibi_slopes"):
            plan.run(*args, alibi_slopes=torch.zeros(4, dtype=torch.float32))


def test_plan_validates_like_the_one_call():
    """Making a plan runs the student's full checks once: a bad batch is refused at plan time
    with the one-call function's error; a head size v6 lacks is UnsupportedConfigError."""
    impl = load_impl(DECODE, "solution")
    with emulate.emulation():
        case = decode_case(device="cpu")
        q, k, v, bt, cl = case.args()
        with pytest.raises(TypeError, match="block_tables"):
            impl.plan_decode(q, k, v, bt.to(torch.int64), cl)
        with pytest.raises(ValueError, match="version"):
            impl.plan_decode(q, k, v, bt, cl, version="v9")


def test_debug_run_reads_the_values(cpu_decode, cpu_prefill):
    """``debug=True`` keeps the device-reading checks in ``run``: a context longer than the
    plan's bound, or prefill lengths other than planned, are refused."""
    impl, case, plan = cpu_decode
    q, k, v, bt, cl = case.args()
    too_long = cl.clone()
    too_long[0] = plan.max_context_len + 1
    with emulate.emulation():
        with pytest.raises(ValueError, match="context_lens"):
            plan.run(q, k, v, bt, too_long, debug=True)
        impl5, b, plan5 = cpu_prefill
        args = prefill_args(b)
        ctx = args[5].clone()
        ctx[1] += 1
        with pytest.raises(ValueError, match="context_lens"):
            plan5.run(*args[:5], ctx, debug=True)


def test_untouched_starter_plans_fail_with_the_todo():
    """The plans are built on the student's TODO functions: a starter fails with its TODO."""
    for lab, make in ((DECODE, lambda i: i.plan_decode(*decode_case(device="cpu").args())),
                      (PREFILL, lambda i: i.plan_prefill(*prefill_args(prefill_batch(device="cpu")),
                                                         0.125))):
        starter = load_impl(lab, "starter")
        with emulate.emulation(), pytest.raises(NotImplementedError, match="TODO"):
            make(starter)


def test_null_launch_copy_measures_the_host_path(cpu_decode):
    """``with_null_launches`` gives a copy whose run does every check and packs every argument
    but launches nothing (the CPU host-cost measurement); the plan itself is unchanged."""
    from reference.launch_plan import with_null_launches

    impl, case, plan = cpu_decode
    fast = with_null_launches(plan)
    out = torch.empty_like(case.query)
    assert fast.run(*case.args(), out=out) is out
    assert [launch.calls for launch in fast._launches] == [1] * len(plan._launches)
    assert all(type(launch).__name__ == "KernelLaunch" for launch in plan._launches)


def _packed_launch(lp, launched: list):
    """A KernelLaunch with a stand-in parameter block and driver call (no CUDA needed)."""
    import threading

    vals = np.zeros(4, dtype=np.uint64)

    def launch(stream):
        launched.append((stream, vals.copy()))
        return True

    launch.maps = {}
    k = lp.KernelLaunch.__new__(lp.KernelLaunch)
    k._set(kernel=None, grid=(1, 1, 1), block=(32,), shared_mem=0, device=None, _emulated=False,
           _cupy_device=None, _packed=(vals, launch), _lock=threading.Lock(), _index=0)
    return k


def test_replay_looks_up_the_stream_once_and_falls_back_on_another_device(monkeypatch):
    """A run's packed launches share one lookup of torch's current stream (each lookup is host
    time) and launch on it with the run's pointers in their slots; with another device current
    the fast path steps aside and each launch goes through CuPy's path (``__call__``) with its
    pointers as the ``np.uint64`` CuPy needs."""
    from reference import launch_plan as lp

    lookups, launched, called = [], [], []
    monkeypatch.setattr(lp, "_CURRENT_DEVICE", lambda: 0)
    monkeypatch.setattr(lp, "_RAW_STREAM", lambda index: lookups.append(index) or 77)
    monkeypatch.setattr(lp.KernelLaunch, "__call__", lambda self, args: called.append(args))
    launches = (_packed_launch(lp, launched), _packed_launch(lp, launched))
    templates = (((None, np.int32(3), None, None), ((0, 0), (2, 1))),
                 ((None, None, None, None), ((1, 1),)))
    lp.replay(launches, templates, (1 << 40, 2 << 40))
    assert lookups == [0], f"the stream was looked up {len(lookups)} times for 2 launches"
    assert [s for s, _ in launched] == [77, 77]
    assert list(launched[0][1][[0, 2]]) == [1 << 40, 2 << 40] and launched[1][1][1] == 2 << 40
    assert not called
    monkeypatch.setattr(lp, "_CURRENT_DEVICE", lambda: 1)
    lp.replay(launches, templates, (3 << 40, 4 << 40))
    assert len(launched) == 2 and len(called) == 2, "another device: CuPy's path, not the driver"
    assert called[0][0] == np.uint64(3 << 40) and type(called[0][0]) is np.uint64
    assert called[0][1] == np.int32(3) and called[1][1] == np.uint64(4 << 40)


# ----------------------------------------------------------------------------- kernels


@pytest.mark.emulated
@pytest.mark.skipif(kernel_skip_reason() is not None, reason=f"GPU-REQ: {kernel_skip_reason()}")
@pytest.mark.parametrize("lens, max_len", [((1, 15, 17, 100, 600), 640), ((900,), None)],
                         ids=["one-partition", "split-k"])
@pytest.mark.parametrize("version", [None, "v4"])
def test_decode_run_is_the_one_call_bit_for_bit(lens, max_len, version):
    """``plan_decode(...).run`` launches what ``paged_attention`` / ``paged_attention_v4`` do:
    the same output bits and log-sum-exp, with and without split-K, into ``out`` or not."""
    impl = load_impl(DECODE, "solution")
    case = decode_case(lens)
    one_call = impl.paged_attention if version is None else impl.paged_attention_v4
    want, want_lse = one_call(*case.args(), case.scale, max_context_len=max_len,
                              return_lse=True)
    plan = impl.plan_decode(*case.args(), case.scale, max_context_len=max_len, version=version)
    if max_len is None:
        assert plan.num_partitions > 1, "the case meant to test split-K does not split"
    out = case.poisoned_out()
    got, lse = plan.run(*case.args(), out=out, return_lse=True)
    synchronize()
    assert got is out
    assert torch.equal(got, want), "run's output differs from the one-call function's"
    assert torch.equal(lse, want_lse), "run's log-sum-exp differs from the one-call's"
    assert torch.equal(plan.run(*case.args()), want), "run without out differs"


@pytest.mark.emulated
@pytest.mark.skipif(kernel_skip_reason() is not None, reason=f"GPU-REQ: {kernel_skip_reason()}")
@pytest.mark.parametrize("kernel", ["tiled", "tc"])
@pytest.mark.parametrize("alibi", [False, True])
def test_prefill_run_is_the_one_call_bit_for_bit(kernel, alibi):
    """``plan_prefill(...).run`` gives ``paged_prefill_tiled`` / ``_tc``'s output bit for bit."""
    impl = load_impl(PREFILL, "solution")
    b = prefill_batch(alibi=alibi)
    args = prefill_args(b)
    want = getattr(impl, f"paged_prefill_{kernel}")(*args, b["scale"],
                                                     alibi_slopes=b["alibi_slopes"])
    plan = impl.plan_prefill(*args, b["scale"], kernel=kernel, alibi_slopes=b["alibi_slopes"])
    out = torch.full_like(b["query"], float("nan"))
    got = plan.run(*args, alibi_slopes=b["alibi_slopes"], out=out)
    synchronize()
    assert got is out and torch.equal(got, want), f"{kernel}: run differs from the one-call"


@pytest.mark.emulated
@pytest.mark.skipif(kernel_skip_reason() is not None, reason=f"GPU-REQ: {kernel_skip_reason()}")
def test_decode_run_follows_new_tensors_and_aliased_caches():
    """A plan records the launcher's launches on the example tensors and re-points every input:
    a run on *other* tensors of the same shape (another seed: new queries, caches, tables and
    lengths) gives the one-call output on those; a plan made with one tensor as both caches
    (told apart by a copy at plan time) runs on separate caches correctly."""
    impl = load_impl(DECODE, "solution")
    a = decode_case((900, 40, 300))
    b2 = type(a)(12, [900, 40, 300], 8, 2, 128, 16)
    assert not torch.equal(a.block_tables, b2.block_tables), "the second case must differ"
    plan = impl.plan_decode(*a.args(), a.scale, max_context_len=960)
    want = impl.paged_attention(*b2.args(), a.scale, max_context_len=960)
    assert torch.equal(plan.run(*b2.args()), want), "run did not follow the new tensors"
    q, k, v, bt, cl = a.args()
    aliased = impl.plan_decode(q, k, k, bt, cl, a.scale)
    assert torch.equal(aliased.run(*a.args()), impl.paged_attention(*a.args(), a.scale)), (
        "a plan made with key_cache is value_cache did not re-point the value cache")


def _with(impl, name, fn):
    ns = dict(vars(impl))
    ns[name] = fn
    return ns


@pytest.mark.emulated
@pytest.mark.skipif(kernel_skip_reason() is not None, reason=f"GPU-REQ: {kernel_skip_reason()}")
def test_plans_refuse_launchers_they_cannot_record():
    """A launcher that launches nothing through ``reference.cuda.launch``, or that hands its
    kernels a copy of an input, makes no plan: PlanCaptureError names the launcher and the input
    (a plan built on it would run nothing, or read the plan-time copy forever)."""
    from labs.lab04_decode_kernels._plan import DecodePlan
    from labs.lab05_prefill_kernels._plan import PrefillPlan
    from reference.errors import PlanCaptureError

    impl = load_impl(DECODE, "solution")
    case = decode_case()
    real = impl._split_kv_launch

    def copies_tables(kernel, q, k, v, bt, *rest, **kw):
        return real(kernel, q, k, v, bt.clone(), *rest, **kw)

    def launches_nothing(kernel, q, *rest, **kw):
        return torch.empty_like(q), torch.empty(q.shape[:2], device=q.device)

    with pytest.raises(PlanCaptureError, match="block_tables"):
        DecodePlan(_with(impl, "_split_kv_launch", copies_tables), *case.args(), case.scale)
    with pytest.raises(PlanCaptureError, match="launched no kernel"):
        DecodePlan(_with(impl, "_split_kv_launch", launches_nothing), *case.args(), case.scale)
    impl5 = load_impl(PREFILL, "solution")
    b = prefill_batch()
    with pytest.raises(PlanCaptureError, match="launched no kernel"):
        PrefillPlan(_with(impl5, "paged_prefill_tc", lambda q, *a, **k: q), *prefill_args(b),
                    b["scale"])


# ----------------------------------------------------------------------------- GPU only


def _no_sync(fn):
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("lab", [DECODE, PREFILL])
def test_run_never_synchronises(lab):
    """``run`` (with ``out``) makes no device-to-host synchronisation: under torch's sync debug
    mode "error" any would raise."""
    for mark in GPU_TEST:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    impl = load_impl(lab, "solution")
    if lab == DECODE:
        case = decode_case((900, 3), device="cuda")
        plan = impl.plan_decode(*case.args(), case.scale)
        out = case.poisoned_out()
        _no_sync(lambda: plan.run(*case.args(), out=out))
        _no_sync(lambda: plan.run(*case.args()))
    else:
        b = prefill_batch(alibi=True)
        plan = impl.plan_prefill(*prefill_args(b), b["scale"], alibi_slopes=b["alibi_slopes"])
        out = torch.empty_like(b["query"])
        _no_sync(lambda: plan.run(*prefill_args(b), alibi_slopes=b["alibi_slopes"], out=out))
    torch.cuda.synchronize()


@pytest.mark.parametrize("lab", [DECODE, PREFILL])
def test_run_captured_in_a_cuda_graph_follows_its_inputs(lab):
    """A run captured in a CUDA graph and replayed after its inputs changed in place (new query
    and K/V rows and, for decode, context lengths) gives the one-call output on them."""
    for mark in GPU_TEST:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    impl = load_impl(lab, "solution")
    if lab == DECODE:
        case = decode_case((900, 40, 300), device="cuda")
        args = list(case.args())
        plan = impl.plan_decode(*args, case.scale)
        one_call = lambda: impl.paged_attention(*args, case.scale)  # noqa: E731
        run = lambda: plan.run(*args, out=out)  # noqa: E731
    else:
        b = prefill_batch()
        args = prefill_args(b)
        plan = impl.plan_prefill(*args, b["scale"])
        one_call = lambda: impl.paged_prefill_tc(*args, b["scale"])  # noqa: E731
        run = lambda: plan.run(*args, out=out)  # noqa: E731
    out = torch.empty_like(args[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # warm-up off the capture, as torch's graph docs ask
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    gen = torch.Generator(device="cuda").manual_seed(7)
    args[0].copy_(torch.randn(args[0].shape, generator=gen, device="cuda"))
    args[1].copy_(torch.randn(args[1].shape, generator=gen, device="cuda"))
    if lab == DECODE:  # shorter contexts: each row keeps its blocks, the kernel reads fewer
        args[4].copy_(torch.tensor([700, 1, 299], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    want = one_call()
    torch.cuda.synchronize()
    assert torch.equal(out, want), ("the replayed graph did not follow the new inputs (likely "
                                    "cause: a pointer or length copied at plan time)")
    assert np.isfinite(out.float().cpu().numpy()).all()
