"""The benchmarks' verdicts (``pagedlab bench decode|prefill``) come from paired rounds: per-round
ratios against the fastest reference, their median and range, and each target checked against
the right bound (CPU only: the rounds' times are written by hand)."""

import pytest

from reference.tools.bench import decode, prefill
from reference.tools.bench.paired import round_orders, round_ratios, summary, verdict


def test_a_rounds_ratio_uses_the_fastest_reference_of_that_round():
    """Round by round, the faster FlashInfer path is the reference: in round 0 the first, in
    round 1 the second. The ratio is reference time over ours (> 1: ours faster)."""
    times = {"ours": [100.0, 110.0], "fi": [99.0, 120.0], "fi-tc": [105.0, 105.0]}
    assert round_ratios(times, "ours", ["fi", "fi-tc"]) == pytest.approx([0.99, 105 / 110])


def test_drift_that_moves_both_sides_leaves_the_ratio_alone():
    """The reason for pairing: a round where the GPU is 10 % slower for everyone gives the same
    ratio as the others, so the median is 1.02 though the raw times spread by 10 %."""
    times = {"ours": [100.0, 110.0, 100.0], "fi": [102.0, 112.2, 102.0]}
    s = summary(round_ratios(times, "ours", ["fi"]))
    assert s["x"] == pytest.approx(1.02)
    assert s["low"] == pytest.approx(1.02) and s["high"] == pytest.approx(1.02)
    assert s["rounds"] == 3


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_round_orders_balance_position_and_predecessor(n):
    """Every contender holds every position equally often and directly follows every other
    contender equally often (a plain rotation fails the second: its neighbours never change)."""
    orders = round_orders(n)
    assert len(orders) >= 6 and all(sorted(o) == list(range(n)) for o in orders)
    for pos in range(n):
        counts = [sum(o[pos] == c for o in orders) for c in range(n)]
        assert len(set(counts)) == 1, f"position {pos}: {counts}"
    follows = {(a, b): 0 for a in range(n) for b in range(n) if a != b}
    for o in orders:
        for a, b in zip(o, o[1:]):
            follows[(a, b)] += 1
    assert len(set(follows.values())) == 1, follows


def test_round_ratios_ignore_the_recorded_orders():
    times = {"ours": [100.0, 100.0], "fi": [101.0, 99.0], "_orders": [["ours", "fi"], ["fi", "ours"]]}
    assert round_ratios(times, "ours", ["fi"]) == pytest.approx([1.01, 0.99])


def test_summary_is_the_median_with_its_range():
    s = summary([0.97, 1.03, 1.01, 0.99, 1.02])
    assert (s["x"], s["low"], s["high"]) == (1.01, 0.97, 1.03)


def test_bad_round_data_is_refused():
    with pytest.raises(ValueError, match="reference"):
        round_ratios({"ours": [1.0]}, "ours", [])
    with pytest.raises(ValueError, match="one time per round"):
        round_ratios({"ours": [1.0, 2.0], "fi": [1.0]}, "ours", ["fi"])
    with pytest.raises(ValueError, match="at least one round"):
        summary([])


def test_verdicts_check_the_right_side_of_their_bound():
    """Ratios must reach their target; host µs must stay under theirs; not measured is None."""
    assert verdict(1.0, 1.0)["met"] is True
    assert verdict(0.999, 1.0)["met"] is False
    assert verdict(24.9, 25.0, at_most=True)["met"] is True
    assert verdict(25.1, 25.0, at_most=True)["met"] is False
    assert verdict(None, 1.0) == {"figure": None, "target": 1.0, "met": None}


def test_decode_targets_read_the_paired_rounds_and_the_plan_runs_host_time():
    """The decode report takes "× FlashInfer" from the paired rounds (not from the table's
    one-shot ratio), host µs from the ``plan.run`` row, and the copy-ceiling share from
    ``paged_attention``'s row; a workload without paired rounds gets None verdicts."""
    rows = [
        {"workload": "D1", "method": "paged_attention", "us": 250.0, "pct_ceiling": 99.0,
         "vs_flashinfer": 0.5},
        {"workload": "D1", "method": decode.PLAN_RUN, "us": 250.0, "host_us": 30.0},
        {"workload": "V", "method": "paged_attention", "us": 40.0, "pct_ceiling": 78.0},
    ]
    pairs = [{"workload": "D1", "graph": summary([1.01, 1.0, 0.99]),
              "eager": summary([0.98, 0.99, 0.97])}]
    d1, v = decode.target_report(rows, pairs)
    assert d1["graph"] == {"figure": 1.0, "target": 1.0, "met": True}
    assert d1["eager"]["met"] is False and d1["eager"]["figure"] == pytest.approx(0.98)
    assert d1["host_us"] == {"figure": 30.0, "target": decode.HOST_US_TARGET, "met": False}
    assert d1["ceiling"]["met"] is True and d1["ceiling"]["target"] == pytest.approx(85.0)
    assert v["graph"]["met"] is None and v["host_us"]["met"] is None and "ceiling" not in v


def test_decode_targets_need_only_the_plan_run_row():
    """``--methods "paged_attention plan.run"`` times no one-call row: the verdicts still come,
    without a copy-ceiling share; failed paired rounds leave the ratios unmeasured (None)."""
    rows = [{"workload": "D1", "method": decode.PLAN_RUN, "us": 250.0, "host_us": 20.0},
            {"workload": "D2", "method": decode.PLAN_RUN, "us": 250.0, "host_us": 20.0}]
    pairs = [{"workload": "D1", "graph": summary([1.02]), "eager": summary([1.01])},
             {"workload": "D2", "error": "RuntimeError: capture failed"}]
    d1, d2 = decode.target_report(rows, pairs)
    assert d1["graph"]["met"] is True and d1["pct_ceiling"] is None and "ceiling" not in d1
    assert d2["graph"]["met"] is None and d2["host_us"]["met"] is True


def test_prefill_targets_pair_each_stage_with_its_own_reference():
    """tc is held to 0.85 x FlashInfer's fa2 backend and wgmma to 1.0 x FlashInfer's default;
    a workload marked ``targets = false`` (P6) is left out of the report."""
    workloads = [{"name": "P1"}, {"name": "P6", "targets": False}]
    rows = [{"workload": w, "impl": f"{k} plan.run", "host_us": h}
            for w in ("P1", "P6") for k, h in (("tc", 20.0), ("wgmma", 40.0))]
    rows += [{"workload": "P1", "impl": "FlashInfer", "backend": "fa3"},
             {"workload": "P1", "impl": "FlashInfer fa2", "backend": "fa2"}]
    pairs = [{"workload": "P1",
              "tc plan.run": {"reference": "FlashInfer fa2", "graph": summary([0.86])},
              "wgmma plan.run": {"reference": "FlashInfer", "graph": summary([0.99])}}]
    report = prefill.target_report(workloads, rows, pairs)
    assert [(t["workload"], t["kernel"], t["reference"]) for t in report] == [
        ("P1", "tc", "FlashInfer fa2"), ("P1", "wgmma", "FlashInfer")]
    tc, wgmma = report
    assert tc["x"] == {"figure": 0.86, "target": 0.85, "met": True}
    assert wgmma["x"] == {"figure": 0.99, "target": 1.0, "met": False}
    assert tc["host_us"]["met"] is True and wgmma["host_us"]["met"] is False
    assert (tc["reference_backend"], wgmma["reference_backend"]) == ("fa2", "fa3")
    failed = prefill.target_report(workloads[:1], rows, [{"workload": "P1", "error": "boom"}])
    assert all(t["x"]["met"] is None and t["error"] == "boom" for t in failed)


def test_prefill_p6_is_outside_the_targets():
    """The workload file keeps P6 (tiny launch-bound kernels) reported but not targeted."""
    _, workloads = prefill.load_workloads()
    assert [w["name"] for w in workloads if w.get("targets") is not False] == [
        "P1", "P2", "P3", "P4", "P5"]



def test_the_verdict_lines_print_for_every_kind_of_entry(capsys):
    """Measured, unmeasured and failed entries all print a line (no crash on a None figure)."""
    rows = [{"workload": "D1", "method": "paged_attention", "us": 1.0, "pct_ceiling": 99.0},
            {"workload": "D1", "method": decode.PLAN_RUN, "us": 1.0, "host_us": 20.0},
            {"workload": "D2", "method": decode.PLAN_RUN, "us": 1.0},
            {"workload": "V", "method": decode.PLAN_RUN, "us": 1.0}]
    pairs = [{"workload": "D1", "graph": summary([1.0]), "eager": summary([0.9])},
             {"workload": "D2", "error": "RuntimeError: capture failed"}]
    decode.print_targets(decode.target_report(rows, pairs), pairs)
    out = capsys.readouterr().out
    assert "D1  graph 1.000" in out and "eager 0.900" in out and "MISSED" in out
    assert "D2  paired rounds failed (RuntimeError: capture failed)" in out
    assert "V   not paired" in out
    report = prefill.target_report([{"name": "P1"}], [{"workload": "P1", "impl": "tc plan.run"}],
                                   [])
    prefill.print_targets(report)
    assert "not paired: no FlashInfer fa2 timed as a graph" in capsys.readouterr().out


def test_one_capture_serves_the_table_and_the_paired_rounds(monkeypatch):
    """``_gpu.capture_graph`` (shared by ``measure`` and the paired rounds' graph timer) warms the
    launcher up once off the capture stream, then records exactly ``calls`` calls; the timer
    replays that graph. CPU only: torch.cuda's stream and graph objects are stand-ins."""
    import torch

    from reference.tools.bench import _gpu, paired

    events = []

    class Stream:
        def wait_stream(self, other):
            events.append("wait")

    class Graph:
        def replay(self):
            events.append("replay")

    class Capture:
        def __init__(self, graph, **kwargs):
            self.graph = graph

        def __enter__(self):
            events.append("capture")

        def __exit__(self, *exc):
            events.append("end")

    class StreamContext:
        def __init__(self, stream):
            pass

        def __enter__(self):
            events.append("side")

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", StreamContext)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def fake_time_cuda(fn, **kwargs):
        fn()
        return 50.0

    monkeypatch.setattr(_gpu, "time_cuda", fake_time_cuda)
    timer = paired._graph_timer(lambda: events.append("call"), calls=3)
    assert events == ["wait", "side", "call", "wait", "capture", "call", "call", "call", "end"]
    events.clear()
    assert timer() == pytest.approx(50.0 / 3) and events == ["replay"]
