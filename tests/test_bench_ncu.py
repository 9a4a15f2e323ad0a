"""``pagedlab bench ncu`` reads ncu's CSV: metric values in the columns' units, and the name of
the kernel it profiled (CPU only: a hand-written sample in the layout of ``ncu --csv``)."""

import types

import pytest

from reference.tools.bench import ncu
from reference.tools.bench.ncu import METRICS, parse_csv

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"')
KERNEL = ("void flashinfer::PrefillWithKVCacheKernel<flashinfer::AttentionKernelTraits<false, "
          "128, 128, 128, 96, 2, half, half, half, int>>(...)")


def _row(metric: str, unit: str, value: str) -> str:
    return (f'"0","4242","python3","127.0.0.1","{KERNEL}","1","7","(384, 1, 1)","(132, 1, 1)",'
            f'"0","9.0","Command line profiler metrics","{metric}","{unit}","{value}"')


def test_values_get_the_columns_units_and_the_kernel_is_named():
    """Durations in ns become µs, thousands separators are read, a metric ncu printed as "n/a"
    stays None, lines that are not CSV are skipped, and the kernel's full name is kept."""
    stdout = "\n".join([
        "==PROF== Connected to process 4242",
        "a line the target printed",
        HEADER,
        _row(METRICS["time_us"], "ns", "1,017,344"),
        _row(METRICS["tensor_pct"], "%", "64.31"),
        _row(METRICS["dram_pct"], "%", "n/a"),
        "==PROF== Disconnected from process 4242",
    ])
    values, name = parse_csv(stdout)
    assert values["time_us"] == pytest.approx(1017.344)
    assert values["tensor_pct"] == pytest.approx(64.31)
    assert values["dram_pct"] is None
    assert values["regs"] is None  # not in the output at all
    assert name == KERNEL


def test_output_without_rows_names_no_kernel():
    """ncu that profiled nothing (the regex matched no launch): every value None, no name."""
    values, name = parse_csv("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.")
    assert all(v is None for v in values.values())
    assert name is None


def test_profile_rows_carry_the_kernel_name(monkeypatch):
    """A profiled stage's row (what goes to ncu.json) names the kernel ncu measured, beside the
    regex that picked it: for the flashinfer stage, the name is what shows which backend ran."""
    stdout = "\n".join([HEADER, _row(METRICS["tensor_pct"], "%", "64.31")])
    done = types.SimpleNamespace(stdout=stdout, stderr="", returncode=0)
    monkeypatch.setattr(ncu.subprocess, "run", lambda *a, **k: done)
    row = ncu.profile("flashinfer", "ncu", "P3")
    assert row["kernel_name"] == KERNEL
    assert row["kernel"] == ncu.STAGES["flashinfer"][2]
    assert row["tensor_pct"] == pytest.approx(64.31)


#: ``ncu --csv --metrics`` rows as ncu printed them on an NVIDIA H200 (2026-11-29), profiling a
#: tensor-core prefill kernel (an experimental build of it, hence the name) on P4.
H200_STALL_ROWS = [
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"',
    '"0","872","python3.12","127.0.0.1","v_f16_d128_w4_r32_s64","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","inst","0.23"',
    '"0","872","python3.12","127.0.0.1","v_f16_d128_w4_r32_s64","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","inst","0.27"',
    '"0","872","python3.12","127.0.0.1","v_f16_d128_w4_r32_s64","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio","inst","0.40"',
    '"0","872","python3.12","127.0.0.1","v_f16_d128_w4_r32_s64","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio","inst","0.04"',
    '"0","872","python3.12","127.0.0.1","v_f16_d128_w4_r32_s64","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio","inst","0.63"',
    '"0","872","python3.12","127.0.0.1","v_f16_d128_w4_r32_s64","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","inst","2.36"',
    '"0","872","python3.12","127.0.0.1","v_f16_d128_w4_r32_s64","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","sm__inst_executed.sum","inst","257,015,168"',
]


def test_stall_metric_names_are_ones_ncu_printed():
    """Every second-pass metric is named as a real ncu run named it (a misspelt metric makes ncu
    measure nothing), and the values read are that run's."""
    printed = {row.split('","')[12] for row in H200_STALL_ROWS[1:]}
    assert set(ncu.STALL_METRICS.values()) <= printed
    values, name = parse_csv("\n".join(H200_STALL_ROWS), ncu.STALL_METRICS)
    assert values == {"instructions": 257015168.0, "stall_wait": 2.36, "stall_short_sb": 0.63,
                      "stall_long_sb": 0.27, "stall_barrier": 0.23, "stall_mio": 0.04}
    assert name == "v_f16_d128_w4_r32_s64"


def test_an_ncu_without_the_stall_metrics_keeps_the_first_pass(monkeypatch):
    """The stall pass runs on its own: when it measures nothing, the row keeps the first pass's
    values and its stall columns are None (no error)."""
    first = "\n".join([HEADER, _row(METRICS["tensor_pct"], "%", "53.34")])
    outputs = iter([first, "==ERROR== Failed to profile: unknown metric"])
    monkeypatch.setattr(ncu.subprocess, "run", lambda *a, **k: types.SimpleNamespace(
        stdout=next(outputs), stderr="", returncode=0))
    row = ncu.profile("flashinfer_fa2", "ncu", "P4")
    assert row["tensor_pct"] == pytest.approx(53.34)
    assert all(row[col] is None for col in ncu.STALL_METRICS)
