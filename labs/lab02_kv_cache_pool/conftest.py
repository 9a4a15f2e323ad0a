"""Lab 2 test configuration: which device the pool's tensors live on.

``PAGEDLAB_TEST_DEVICE`` (default ``cpu``) picks it, so the very same tests run on a GPU with
``PAGEDLAB_TEST_DEVICE=cuda pytest labs/lab02_kv_cache_pool``.
"""

from __future__ import annotations

import pytest

from labs.lab02_kv_cache_pool._state import pick_test_device


@pytest.fixture
def device() -> str:
    """The device every pool in these tests is built on."""
    return pick_test_device()
