"""Lab 6 test configuration: one torch thread while these tests run.

NOTE: the tiny model's matrices are a few KB; with many threads on a shared machine torch
spends its time synchronising them (measured: 30x slower on 2 busy cores). The old setting is
restored after each test so other labs in the same process are unaffected.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
