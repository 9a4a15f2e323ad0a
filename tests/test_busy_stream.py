"""``reference.gpu.run_behind_busy_stream``, the stream tests' harness, on a stand-in for
``torch.cuda``: which sleeps it tries, and when a try counts (on a GPU: Labs 4-5's stream tests,
``.ci/gpu``)."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from reference import gpu
from reference.grader.sandbox import ISOLATED_ENV


class FakeCuda:
    """Records sleeps and calls; ``busy`` says, per try, whether the stream is still busy
    when the call returns."""

    def __init__(self, busy: list[bool]) -> None:
        self.busy = list(busy)
        self.sleeps: list[int] = []
        self.calls: list[str] = []

    def install(self, monkeypatch) -> None:
        fake = self

        class Stream:
            def query(self) -> bool:
                return not fake.busy[len(fake.sleeps) - 1]

            def synchronize(self) -> None:
                fake.calls.append("stream sync")

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: fake.sleeps.append(cycles))
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: fake.calls.append("sync"))


def run(fake: FakeCuda):
    def launch():
        fake.calls.append("launch debug" if os.environ.get("PAGEDLAB_DEBUG") else "launch")
        return len(fake.sleeps)

    return gpu.run_behind_busy_stream(
        poison=lambda: fake.calls.append("poison"), write=lambda: fake.calls.append("write"),
        launch=launch)


def test_a_try_counts_when_the_stream_is_still_busy(monkeypatch):
    """In one process the first try whose stream is still busy as the call returns is the
    answer; a first call on the default stream compiles, then each try poisons, waits for the
    GPU, sleeps, writes, then launches."""
    monkeypatch.delenv(ISOLATED_ENV, raising=False)
    fake = FakeCuda([True])
    fake.install(monkeypatch)
    assert run(fake) == 1
    assert fake.sleeps == [gpu.BUSY_STREAM_CYCLES[0]]
    assert fake.calls == ["poison", "launch", "sync",
                          "poison", "sync", "write", "launch", "stream sync"]


def test_debug_mode_is_off_for_the_calls_and_restored_after(monkeypatch):
    """PAGEDLAB_DEBUG's device-reading checks would idle the stream before the call returns:
    it is unset while the calls run and set again after."""
    monkeypatch.delenv(ISOLATED_ENV, raising=False)
    monkeypatch.setenv("PAGEDLAB_DEBUG", "1")
    fake = FakeCuda([True])
    fake.install(monkeypatch)
    run(fake)
    assert "launch debug" not in fake.calls and fake.calls.count("launch") == 2
    assert os.environ["PAGEDLAB_DEBUG"] == "1"


def test_an_idle_stream_repeats_the_try_behind_a_longer_sleep(monkeypatch):
    """A stream idle by the time the call returned proves nothing (the kernel may have
    launched after the write on any stream): the try is repeated, poisoned again, behind the
    next, longer sleep, and that try's result is returned."""
    monkeypatch.delenv(ISOLATED_ENV, raising=False)
    fake = FakeCuda([False, False, True])
    fake.install(monkeypatch)
    assert run(fake) == 3
    assert fake.sleeps == list(gpu.BUSY_STREAM_CYCLES)
    assert sorted(gpu.BUSY_STREAM_CYCLES) == list(gpu.BUSY_STREAM_CYCLES)
    assert fake.calls.count("poison") == 4  # the first call's, then one per try


def test_never_busy_is_an_error_not_a_pass(monkeypatch):
    """If even the longest sleep is over when the call returns, the test cannot tell the
    streams apart: it fails saying so instead of passing."""
    monkeypatch.delenv(ISOLATED_ENV, raising=False)
    fake = FakeCuda([False] * len(gpu.BUSY_STREAM_CYCLES))
    fake.install(monkeypatch)
    with pytest.raises(AssertionError, match="cannot tell which stream"):
        run(fake)


def test_isolated_one_try_behind_the_one_second_sleep(monkeypatch):
    """Graded isolated the worker waits for its stream before it answers, so the stream is
    always idle by then: one try, behind the 1 s sleep, whatever the stream says."""
    monkeypatch.setenv(ISOLATED_ENV, "root")
    fake = FakeCuda([False])
    fake.install(monkeypatch)
    assert run(fake) == 1
    assert fake.sleeps == [gpu.BUSY_STREAM_CYCLES[1]]
