"""The fuzz suite's report line: how many bad (and good) calls this run made."""

from __future__ import annotations

from _fuzz_harness import STATS, num_examples


def pytest_terminal_summary(terminalreporter) -> None:
    if STATS:
        terminalreporter.write_line(
            f"fuzz: {STATS['bad calls']} bad calls refused as documented, {STATS['good calls']} "
            f"integer-like/finite calls accepted ({num_examples()} examples per test)")
