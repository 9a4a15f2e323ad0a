"""Infrastructure (no points): the TMA tensor maps of Lab 5's Hopper kernel (``reference/tma.py``)
and how a plan carries them (``reference/launch_plan.py``).

A map holds the cache's address, so a plan cannot re-point it like a pointer argument: it keeps
the :class:`TensorMap` and re-encodes it for each run's cache. These CPU tests replace the
driver's encoder with a stand-in that writes the address into the map, and check that a
recorded launch gets the map of the run's cache. On a Hopper GPU,
``test_hopper_plan_run_follows_new_caches`` proves the same with the real kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

from reference import cuda as rcuda
from reference import emulate, launch_plan, tma

torch = pytest.importorskip("torch")


@pytest.fixture
def fake_encoder(monkeypatch):
    """encode() without a driver: the map's first word is the address, the second the box,
    the fourth 1 for boxes of whole rows."""
    def encode(address, rows, head_size, dtype, box_rows, whole_rows=False):
        words = np.zeros(1, dtype=tma.TMAP_DTYPE)
        words["words"][0, :4] = (address, box_rows, rows, int(whole_rows))
        return words[0]

    monkeypatch.setattr(tma, "encode", encode)


def test_tensor_map_refuses_what_it_cannot_describe():
    """A CPU tensor or another dtype is refused with a TypeError naming what was expected (the
    shape, alignment and box checks come after the device check: a CUDA tensor reaches them)."""
    with pytest.raises(TypeError, match="CUDA tensor"):
        tma.tensor_map(torch.zeros(2, 1, 16, 64, dtype=torch.float16), 16)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        tma.tensor_map(torch.zeros(2, 1, 16, 64), 16)


def test_kernel_args_pass_the_encoded_map(fake_encoder):
    """``launch`` hands CuPy the map's 128 bytes; pointers and scalars pass unchanged."""
    m = tma.TensorMap(0x1000, 64, 128, "float16", 16)
    args = rcuda.kernel_args((np.uint64(7), m, np.int32(3)))
    assert args[0] == np.uint64(7) and args[2] == np.int32(3)
    assert isinstance(args[1], np.void) and args[1].dtype.itemsize == tma.TMAP_BYTES
    assert args[1]["words"][0] == 0x1000 and args[1]["words"][1] == 16


def test_a_whole_row_map_keeps_its_box_shape_when_re_encoded(fake_encoder):
    """``whole_rows=True`` (one box of whole rows per request, the solution's maps) reaches
    the encoder, also when a plan re-encodes the map for another address (``at``)."""
    m = tma.TensorMap(0x1000, 64, 128, "float16", 16, whole_rows=True)
    assert m.value["words"][3] == 1 and m.at(0x2000)["words"][3] == 1
    assert m.at(0x2000)["words"][0] == 0x2000
    assert tma.TensorMap(0x1000, 64, 128, "float16", 16).value["words"][3] == 0
    assert "box 16 x 128" in repr(m)


def _captured_geometry(monkeypatch, head_size, box_rows, whole_rows):
    """What encode() hands the driver (ctypes arrays, read by slicing): rank, dims, strides
    in bytes, box."""
    seen = {}

    def fake(map_ptr, dtype, rank, address, dims, strides, box, steps, *modes):
        seen.update(rank=rank, dims=list(dims[:rank]), strides=list(strides[:rank - 1]),
                    box=list(box[:rank]))
        return 0

    monkeypatch.setattr(tma, "_encoder", lambda: fake)
    tma.encode.cache_clear()
    try:
        tma.encode(0x10000, 256, head_size, "float16", box_rows, whole_rows)
    finally:
        tma.encode.cache_clear()
    return seen


def test_a_whole_row_map_lands_in_8_row_groups(monkeypatch):
    """At head size 128 the whole-row map is 4-D — 64 columns, 8 rows, 2 column blocks, 8-row
    groups — with byte strides 256 (a row), 128 (a column block) and 2048 (8 rows): a box of
    16 rows lands as [2 groups][2 blocks][8 rows][64], every group 16 * head_size bytes after
    the one before. At head size 64, and without whole_rows, the map is 2-D (64-column boxes)."""
    g = _captured_geometry(monkeypatch, 128, 16, True)
    assert g == {"rank": 4, "dims": [64, 8, 2, 32], "strides": [256, 128, 2048],
                 "box": [64, 8, 2, 2]}, g
    assert _captured_geometry(monkeypatch, 64, 16, True) == {
        "rank": 2, "dims": [64, 256], "strides": [128], "box": [64, 16]}
    assert _captured_geometry(monkeypatch, 128, 16, False) == {
        "rank": 2, "dims": [128, 256], "strides": [256], "box": [64, 16]}


def test_a_whole_row_map_refuses_partial_8_row_groups():
    """At head size over 64 a whole-row map counts rows in 8-row groups: a box or a cache whose
    rows are not whole groups is refused with a ValueError naming both, instead of a map that
    silently drops the rest (a kernel expecting those bytes would wait forever)."""
    for box_rows, rows in ((12, 64), (4, 64), (16, 60)):
        with pytest.raises(ValueError, match="multiples of 8"):
            tma.TensorMap(0x1000, rows, 128, "float16", box_rows, whole_rows=True)
    tma.TensorMap(0x1000, 60, 64, "float16", 4, whole_rows=True)  # head size 64: a 2-D map
    tma.TensorMap(0x1000, 60, 128, "float16", 12)  # 64-column boxes: any box


class EmulatedKernel:  # the name launch_plan takes for the emulator's kernels: no CuPy needed
    pass


def test_a_plan_re_encodes_maps_for_each_runs_cache(fake_encoder, monkeypatch):
    """A launcher's map of an input is recorded as that input's slot, not as a constant: a
    replay with another cache address launches with the map of that address."""
    cache, other = torch.zeros(4, 1, 16, 64), torch.zeros(4, 1, 16, 64)

    def launcher(cache):
        m = tma.TensorMap(cache.data_ptr(), 64, 64, "float16", 16)
        rcuda.launch(EmulatedKernel(), (1,), (32,), [rcuda.ptr(cache), m, np.int32(5)])

    _, launches, templates, _ = launch_plan.record_launches(
        "test", launcher, ("cache",), (cache,), ("cache",), torch.device("cpu"))
    template, slots = templates[0]
    assert sorted(slots) == [(0, 0), (1, 0)], "the pointer and the map are both the input's"
    assert isinstance(template[1], tma.TensorMap), "the plan keeps the map, not its bytes"
    seen = []
    monkeypatch.setattr(emulate, "launch", lambda kernel, grid, block, args, shared: seen.append(args))
    launch_plan.replay(launches, templates, (np.uint64(other.data_ptr()),))
    assert int(seen[0][0]) == other.data_ptr()
    assert seen[0][1]["words"][0] == other.data_ptr(), "the map must be the run's cache's"
