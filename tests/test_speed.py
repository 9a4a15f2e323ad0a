"""Infrastructure (no points): speed grading's untrusted half and its checks, on the CPU.

The timing itself needs a GPU (``tests/test_speed_gpu.py``, run by ``.ci/gpu``); what can be
proved without one is proved here: a recording names every pointer a launcher passes as an input
or a scratch buffer, the trusted side refuses every recording it should not compile or launch,
and points follow the tiers.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from reference.grader import speed, speed_check, speed_record, speed_replay
from reference.grader.mutants import build_mutant
from reference.paths import SOLUTIONS_DIR

LAB4 = "lab04_decode_kernels"
TINY_DECODE = speed.SpeedWorkload("tiny", "decode", 2, 4, 2, 40)


def good_recording() -> dict:
    """A recording as a split-K launcher makes one (written out, not recorded: no GPU here)."""
    path = str(SOLUTIONS_DIR / LAB4 / "decode_v4.cu")
    ins = ["query", "key_cache", "value_cache", "block_tables", "context_lens", "out"]
    return {"inputs": ins,
            "scratch": [{"nbytes": 32, "content": "00" * 32}, {"nbytes": 1 << 20, "content": None}],
            "launches": [{"path": path, "name": "paged_decode_v4",
                          "options": ["-DSCALAR_T=__half", "-DHEAD_SIZE=128"], "backend": "nvrtc",
                          "name_expressions": None, "grid": [2, 2, 4], "block": [128],
                          "shared_mem": 0,
                          "args": [["in", "out", 0], ["scratch", 0, 0], ["scratch", 1, 64],
                                   ["null"], ["in", "query", 0], ["i32", 3], ["f32", 0.5]]}]}


def test_a_good_recording_passes_the_check():
    """The check accepts what an honest launcher records (paths resolved), TMA maps of the
    caches (Lab 5's Hopper kernel) included."""
    rec = good_recording()
    rec["launches"][0]["args"] += [["tmap", "key_cache", 16], ["tmap", "value_cache", 128],
                                   ["tmap_rows", "value_cache", 16]]
    rec["inputs"].append(b"bytes")  # not a name: dropped
    rec["launches"][0]["extra"] = {1, 2}  # not a field: dropped (the job must be plain JSON)
    checked = speed_check.check_recording(rec, LAB4, dirs=((SOLUTIONS_DIR / LAB4).resolve(),))
    assert checked["launches"][0]["name"] == "paged_decode_v4"
    assert "extra" not in checked["launches"][0] and b"bytes" not in checked["inputs"]
    import json

    json.dumps(checked)


def _set(path, value):
    def edit(rec):
        target = rec
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return rec
    return edit


REFUSED = {
    "the launcher raised": (lambda rec: {"error": "ValueError: bad"}, "bad"),
    "not a dict": (lambda rec: ["launches"], "not a dict"),
    "no launches": (_set(["launches"], []), "launches recorded"),
    "too many launches": (lambda rec: {**rec, "launches": rec["launches"] * 9}, "launches"),
    "a file outside the implementation": (_set(["launches", 0, "path"], "/etc/passwd"),
                                          "not a .cu file"),
    "a .cu of the trusted headers' folder": (
        _set(["launches", 0, "path"], str(SOLUTIONS_DIR.parent / "reference" / "x.cu")),
        "not a .cu file"),
    "a path escaping with ..": (
        _set(["launches", 0, "path"], str(SOLUTIONS_DIR / LAB4 / ".." / ".." / "conftest.py")),
        "not a .cu file"),
    "an include option": (_set(["launches", 0, "options"], ["-I/etc"]), "compiler options"),
    "an option smuggling a newline": (_set(["launches", 0, "options"], ["-DX=1\n#include"]),
                                      "compiler options"),
    "a template name expression": (_set(["launches", 0, "name_expressions"], ["k<int>"]),
                                   "name expressions"),
    "another backend": (_set(["launches", 0, "backend"], "emulate"), "NVRTC"),
    "a kernel name that is not an identifier": (_set(["launches", 0, "name"], "k; x"),
                                                "identifier"),
    "a grid past CUDA's limits": (_set(["launches", 0, "grid"], [1, 70000]), "grid"),
    "a zero block": (_set(["launches", 0, "block"], [0]), "block"),
    "a block of 2048 threads": (_set(["launches", 0, "block"], [64, 32]), "block"),
    "shared memory past the device's": (_set(["launches", 0, "shared_mem"], 1 << 20),
                                        "shared memory"),
    "an unknown argument kind": (_set(["launches", 0, "args", 0], ["ptr", 12345]),
                                 "is not one of"),
    "a raw pointer value": (_set(["launches", 0, "args", 0], ["u64", 140000000000000]),
                            "is not one of"),
    "an input that does not exist": (_set(["launches", 0, "args", 0], ["in", "secret", 0]),
                                     "names no input"),
    "a negative offset": (_set(["launches", 0, "args", 0], ["in", "out", -8]), "names no input"),
    "a scratch index past the list": (_set(["launches", 0, "args", 1], ["scratch", 2, 0]),
                                      "names no scratch"),
    "a boolean for an int": (_set(["launches", 0, "args", 5], ["i32", True]), "not an integer"),
    "too much scratch": (_set(["scratch", 1, "nbytes"], 8 << 30), "bytes of scratch"),
    "too much scratch content": (_set(["scratch", 0], {"nbytes": 65 << 20,
                                                       "content": "00" * (65 << 20)}),
                                 "with content"),
    "shared memory past sm_90's 227 KiB": (_set(["launches", 0, "shared_mem"], 227 * 1024 + 16),
                                           "shared memory"),
    "content of the wrong size": (_set(["scratch", 0, "content"], "00"), "hex of its nbytes"),
    "content that is not hex": (_set(["scratch", 0, "content"], "zz" * 32), "malformed"),
    "an unhashable argument kind": (_set(["launches", 0, "args", 0], [{}, 1, 2]), "malformed"),
    "a tensor map of the query": (_set(["launches", 0, "args", 0], ["tmap", "query", 16]),
                                  "not a tensor map of a cache"),
    "a whole-row tensor map of the query": (
        _set(["launches", 0, "args", 0], ["tmap_rows", "query", 16]), "not a tensor map of a cache"),
    "a tensor map box of 0 rows": (_set(["launches", 0, "args", 0], ["tmap", "key_cache", 0]),
                                   "not a tensor map of a cache"),
    "a tensor map box past TMA's 256 rows": (
        _set(["launches", 0, "args", 0], ["tmap", "value_cache", 512]), "not a tensor map"),
    "a tensor map with an offset": (_set(["launches", 0, "args", 0], ["tmap", "key_cache", 16, 8]),
                                    "is not one of"),
    "a NUL in the path": (_set(["launches", 0, "path"], "/tmp/a\x00.cu"), "malformed|not a .cu"),
    "a 300-character file name": (_set(["launches", 0, "path"], "/tmp/" + "a" * 300 + ".cu"),
                                  "malformed|not a .cu"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_trusted_side_refuses_a_recording_it_should_not_launch(case):
    """A recording is the student code's word: the trusted side compiles only ``.cu`` files of
    the graded implementation's folder, with ``-D`` options, and launches only within CUDA's
    limits on its own inputs and scratch; anything else is refused with a reason (0 points)."""
    edit, words = REFUSED[case]
    bad = edit(copy.deepcopy(good_recording()))
    with pytest.raises(speed_check.SpeedRecordingError, match=words):
        speed_check.check_recording(bad, LAB4, dirs=((SOLUTIONS_DIR / LAB4).resolve(),))


BAD_SOURCES = {
    "an absolute path": '#include "/usr/include/flashinfer/attention.cuh"\n',
    "a .. path": '#include "../secret.cuh"\n',
    "a .. inside angle brackets": "#include <sub/../../x.h>\n",
    "a macro include": "#define H <x.h>\n#include H\n",
    "an unterminated name": '#include "a.cuh\n',
    "the %: digraph": '%:include "/etc/passwd"\n',
    "include_next": "#include_next <x.h>\n",
    "import": '#import "/etc/passwd"\n',
    "a comment trick": '// /*\n#include "/etc/passwd"\n// */\n',
    "a line continuation": '#inc\\\nlude "/etc/passwd"\n',
}


@pytest.mark.parametrize("case", sorted(BAD_SOURCES))
def test_a_source_that_could_read_outside_the_workbook_is_refused(tmp_path, case):
    """Kernel sources compile only headers found by relative name without ``..`` (the lab's,
    the workbook's and the toolkit's): an absolute or ``..`` path could pull another kernel into
    the student's file or echo a file the grader can read, and a macro include hides where it
    points. Every file of the folder is read, comments included, however the directive is
    spelled."""
    (tmp_path / "ok.cuh").write_text('#include <cuda_fp16.h>\n  #  include "decode_common.cuh"  // x\n')
    speed_check.check_includes(tmp_path)
    (tmp_path / "k.cu").write_text("// a kernel\n" + BAD_SOURCES[case])
    with pytest.raises(speed_check.SpeedRecordingError, match="k.cu"):
        speed_check.check_includes(tmp_path)


def test_headers_of_any_name_in_subfolders_and_links_are_checked(tmp_path):
    """A ``.inc`` in a subfolder is read like a ``.cu``; a symbolic link is refused outright."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.inc").write_text('#include "/etc/passwd"\n')
    with pytest.raises(speed_check.SpeedRecordingError, match="x.inc"):
        speed_check.check_includes(tmp_path)
    (tmp_path / "sub" / "x.inc").unlink()
    (tmp_path / "link.cuh").symlink_to("/etc/hostname")
    with pytest.raises(speed_check.SpeedRecordingError, match="symbolic link"):
        speed_check.check_includes(tmp_path)


def test_a_stage_may_launch_only_its_own_kernel_files():
    """v3's points are for v3's kernel: a v3 launcher that launches v6's kernel is refused."""
    rec = good_recording()
    stage_files = ("decode_v3.cu", "decode_reduce.cu")
    with pytest.raises(speed_check.SpeedRecordingError, match="not this stage's kernel file"):
        speed_check.check_recording(rec, LAB4, dirs=((SOLUTIONS_DIR / LAB4).resolve(),),
                                    files=stage_files)


def test_points_follow_the_tiers_reached():
    """Each tier reached earns its points; a stage not timed (wrong output, crash) earns none,
    with the reason as every tier's message."""
    stage = next(s for s in speed.SPEED_STAGES if s.stage == "v6")
    (low, _), (high, _) = stage.tiers
    between = {"lab": stage.lab, "stage": "v6", "ok": True, "us": 10.0,
               "fraction": (low + high) / 2}
    wrong = {"lab": stage.lab, "stage": "v6", "ok": False, "message": "pass 1: wrong output"}
    got = speed.speed_records([between, wrong])
    assert [r.outcome for r in got] == ["passed", "failed", "failed", "failed"]
    assert "this tier needs" in got[1].message and "wrong output" in got[2].message
    assert sum(r.points for r in got if r.passed) == stage.tiers[0][1]


def test_a_tensor_map_is_recorded_as_the_input_it_maps():
    """A TMA map argument (``reference.tma.tensor_map`` of a cache) is recorded as the input it
    maps and its box (the timing side makes the map of its own cache again); a map of part of
    an input, or of memory that is no input, is refused (the stage scores 0)."""
    from reference.tma import TensorMap

    base = 1 << 40
    extents = [("query", base, 4096), ("key_cache", base + 8192, 2 * 64 * 128)]
    whole = TensorMap(base + 8192, 64, 128, "float16", 16)
    assert speed_record._arg(whole, extents, []) == ["tmap", "key_cache", 16]
    rows = TensorMap(base + 8192, 64, 128, "float16", 16, whole_rows=True)
    assert speed_record._arg(rows, extents, []) == ["tmap_rows", "key_cache", 16]
    for bad in (TensorMap(base + 8192 + 256, 63, 128, "float16", 16),  # from row 1 on
                TensorMap(base + 8192, 32, 128, "float16", 16),  # half the cache
                TensorMap(1 << 20, 64, 128, "float16", 16)):  # no input at all
        with pytest.raises(ValueError, match="tensor_map"):
            speed_record._arg(bad, extents, [])


def test_a_stage_for_another_gpu_is_skipped_not_failed():
    """The Hopper stage on another GPU: not graded there — its records are skipped (as the
    stage's tests skip), none failed, and the reason names both compute capabilities."""
    stage = next(s for s in speed.SPEED_STAGES if s.stage == "wgmma")
    assert stage.capability == (9, 0)
    result = speed.not_graded_here(stage, (8, 0))
    records = speed.speed_records([result])
    assert [r.outcome for r in records] == ["skipped"] * len(stage.tiers)
    assert "needs compute capability 9.0, this GPU is 8.0" in records[0].message


def test_every_speed_mutant_applies_to_its_stage(tmp_path):
    """Every speed mutant's edits still apply to the solution, and its stage is graded."""
    stages = {(s.lab, s.stage) for s in speed.SPEED_STAGES}
    mutants = speed.load_speed_mutants()
    assert {m.lab for m in mutants} == {"lab04_decode_kernels", "lab05_prefill_kernels"}
    for m in mutants:
        assert (m.lab, m.caught_by[0].split(":")[1]) in stages, m.name
        build_mutant(m, tmp_path / m.name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU machine")
def test_speed_is_refused_without_a_gpu():
    """Speed is graded on a GPU; without one, grade_speed says so instead of scoring 0."""
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        speed.grade_speed([LAB4], isolated=False)


@pytest.mark.slow
def test_a_recording_names_every_pointer_as_an_input_or_scratch(monkeypatch):
    """Recorded on the emulated device: the split-K launcher's kernel reads every input through
    its own pointer, writes ``out`` (passed in), and its one scratch buffer (``lse``) is named
    with its size; nothing else crosses."""
    from reference.loader import load_impl

    monkeypatch.setenv("PAGEDLAB_DEVICE", "emulate")
    monkeypatch.setenv("LAB_IMPL", "solution")
    rec = speed_record.record(load_impl(LAB4, "solution"), "paged_attention_v3", TINY_DECODE.spec())
    assert "error" not in rec, rec
    (launch,) = rec["launches"]
    named = {a[1] for a in launch["args"] if a[0] == "in"}
    assert named == {"query", "key_cache", "value_cache", "block_tables", "context_lens", "out"}
    assert rec["scratch"] == [{"nbytes": 2 * 4 * 4, "content": rec["scratch"][0]["content"]}]
    assert launch["path"].endswith("solutions/lab04_decode_kernels/decode_v3.cu")
    rec = {**rec, "launches": [{**launch, "backend": "nvrtc"}]}
    speed_check.check_recording(rec, LAB4, dirs=((SOLUTIONS_DIR / LAB4).resolve(),))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU machine")
def test_grade_speed_only_says_it_cannot_time_without_a_gpu(tmp_path):
    """``pagedlab grade --speed-only`` on a machine without a GPU exits 2 ("could not grade")
    and says why, instead of reporting a speed score of 0."""
    import os
    import subprocess
    import sys

    from reference.paths import REPO_ROOT

    done = subprocess.run([sys.executable, "-m", "reference.tools.cli", "grade", "4", "--speed-only",
                           "--results", str(tmp_path / "r.json"), "--summary", str(tmp_path / "s.md")],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                          env={**os.environ, "LAB_IMPL": "solution"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "speed not graded" in done.stdout and "CUDA GPU" in done.stdout


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_the_speed_oracle_is_paged_attention_in_float64(kind):
    """The timing process's oracle (run here on the CPU) equals Lab 3's float64 reference
    (``reference/oracle.py``): pages through the block table, GQA head h -> KV head h // group,
    causal with history for prefill."""
    from reference.oracle import paged_decode_ref, paged_prefill_ref

    gen = torch.Generator().manual_seed(0)
    hq, hkv, d, bs = 8, 2, 16, 4
    lens, q_lens = [9, 13], ([1, 1] if kind == "decode" else [3, 5])
    spec = {"kind": kind, "num_q_heads": hq, "num_kv_heads": hkv, "head_size": d,
            "block_size": bs, "context_lens": lens, "query_lens": q_lens, "scale": 0.3}
    kc, vc = (torch.randn(12, hkv, bs, d, generator=gen).half() for _ in range(2))
    table = torch.tensor([[5, 2, 7, -1], [0, 11, 3, 9]], dtype=torch.int32)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).half()
    got = speed_replay.oracle(spec, {"query": q, "key_cache": kc, "value_cache": vc,
                                     "block_tables": table}, device="cpu")
    arrays = [x.numpy() for x in (q, kc, vc, table)]
    if kind == "decode":
        want, _ = paged_decode_ref(*arrays, np.array(lens, dtype=np.int32), 0.3)
    else:
        cu = np.array([0, *np.cumsum(q_lens)], dtype=np.int32)
        want, _ = paged_prefill_ref(*arrays, cu, np.array(lens, dtype=np.int32), 0.3)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_every_process_of_the_worker_user_is_killed_before_timing():
    """What the student's code left running as the worker user (a forked daemon that would
    share the GPU while the ceiling is measured) is gone before the timing starts."""
    import subprocess

    from reference.grader.sandbox import (WORKER_USER, _is_root, _owner, ensure_worker_user,
                                          kill_worker_processes)

    if not _is_root():
        pytest.skip("starts a process as the worker user: needs root")
    how = ensure_worker_user()
    import pwd

    uid = pwd.getpwnam(WORKER_USER).pw_uid
    daemon = subprocess.Popen(["sleep", "300"], user=uid, start_new_session=True)
    try:
        assert _owner(str(daemon.pid)) == uid
        kill_worker_processes(how)
        daemon.wait(timeout=10)  # reaped here: it was our child
        assert daemon.returncode == -9
    finally:
        if daemon.poll() is None:
            daemon.kill()
