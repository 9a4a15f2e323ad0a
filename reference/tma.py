"""TMA tensor maps over a paged KV cache, for Lab 5's Hopper kernel (given code, trusted).

Hopper's tensor memory accelerator (TMA) copies a whole box of a tensor from global to shared
memory when one thread asks (``cp.async.bulk.tensor``, ``tma_load_2d`` in
``reference/include/pagedlab_wgmma.cuh``). What it copies is described by a *tensor map*: 128
bytes the driver encodes on the host (``cuTensorMapEncodeTiled``) holding the tensor's base
address, sizes and strides, the box shape and the shared-memory swizzle. The kernel takes it by
value, as a ``const __grid_constant__`` parameter.

:func:`tensor_map` builds the map Lab 5 uses: the cache ``[num_blocks, num_kv_heads,
block_size, head_size]`` seen as a 2-D tensor of ``num_blocks * num_kv_heads * block_size`` rows
of ``head_size`` elements, boxes of ``box_rows`` rows x 64 columns (128 bytes), written in the
128-byte swizzle layout the ``wgmma`` descriptors read. Row ``(block * num_kv_heads + kv_head) *
block_size + slot`` is key ``slot`` of page ``block`` for ``kv_head``. With ``whole_rows=True`` a
box is ``box_rows`` whole rows instead (all ``head_size`` columns, one request where the 2-D map
needs one per 64 columns), written in groups of 8 rows, each group column block by column block:
``[box_rows / 8][head_size / 64][8][64]`` in shared memory (a 4-D map: 64 columns, 8 rows, the
column blocks, the 8-row groups; ``tma_load_4d``). Every 8-row group then sits ``16 * head_size``
bytes after the one before, across box boundaries too, so a tile of such boxes is one evenly
strided operand for ``wgmma`` whatever the page size. At head size 64 a row is one column block:
that map is the 2-D one (``tma_load_2d``), and its layout the same.

A map holds an address, so a plan (``reference.launch_plan``) cannot re-point it like a
pointer: it keeps the :class:`TensorMap` and re-encodes it for each run's cache address
(:meth:`TensorMap.at`, cached per address, so a run on the same cache costs a dict lookup).
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

#: A tensor map as a kernel argument: 128 bytes, passed by value (CuPy packs the structured
#: scalar's bytes; the kernel's parameter type is 64-byte aligned).
TMAP_DTYPE = np.dtype([("words", "<u8", (16,))], align=True)
TMAP_BYTES = 128
#: Columns per box: 64 16-bit elements, the 128 bytes of the swizzle's row.
BOX_COLS = 64
#: Rows per group of a whole-row box: the 8 rows of the swizzle pattern (1024 bytes a column block).
GROUP_ROWS = 8

# cuTensorMapEncodeTiled's enums (CUDA driver API, cuda.h).
_DTYPES = {"float16": 6, "bfloat16": 9}
_INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_128B, _OOB_FILL_NONE = 0, 3, 2, 0


class TensorMapError(RuntimeError):
    """The driver refused to encode a tensor map (its CUresult is in the message)."""


@functools.lru_cache(maxsize=1)
def _encoder():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


@functools.lru_cache(maxsize=256)
def encode(address: int, rows: int, head_size: int, dtype: str, box_rows: int,
           whole_rows: bool = False) -> np.void:
    """Encodes the map of ``rows`` x ``head_size`` 16-bit elements at ``address``.

    Args:
        address: the cache's device address (16-byte aligned).
        rows: ``num_blocks * num_kv_heads * block_size``.
        head_size: elements per row (a multiple of 64).
        dtype: ``"float16"`` or ``"bfloat16"``.
        box_rows: rows per box (1..256; with ``whole_rows`` at head size over 64, a multiple
            of 8, and ``rows`` too).
        whole_rows: boxes of whole rows in 8-row groups (see the module docstring); with one
            column block (head size 64) that is the 2-D map itself.

    Returns:
        The map as a 128-byte NumPy structured scalar (:data:`TMAP_DTYPE`), ready to pass.

    Raises:
        TensorMapError: the driver refused (its error code in the message).
    """
    buf = ctypes.create_string_buffer(TMAP_BYTES + 64)
    base = (ctypes.addressof(buf) + 63) & ~63  # the driver wants the map 64-byte aligned
    d, st, b = map_shape(rows, head_size, box_rows, whole_rows)
    dims = (ctypes.c_uint64 * len(d))(*d)
    strides = (ctypes.c_uint64 * len(st))(*st)  # bytes from one index to the next, dims 1 and up
    box = (ctypes.c_uint32 * len(b))(*b)
    rank = len(dims)
    steps = (ctypes.c_uint32 * rank)(*([1] * rank))
    err = _encoder()(ctypes.c_void_p(base), _DTYPES[dtype], rank, ctypes.c_void_p(address), dims,
                     strides, box, steps, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_128B,
                     _OOB_FILL_NONE)
    if err:
        raise TensorMapError(f"cuTensorMapEncodeTiled returned CUresult {err} for a {rows} x "
                             f"{head_size} {dtype} tensor at {address:#x}, box {box_rows} x "
                             f"{head_size if whole_rows else BOX_COLS}")
    return np.frombuffer(ctypes.string_at(base, TMAP_BYTES), dtype=TMAP_DTYPE)[0]


#: The first word of a map the emulated device reads (``PLTMAP``): see :func:`emulated_map`.
EMULATED_MAP_MAGIC = 0x50414D544C50


def map_shape(rows: int, head_size: int, box_rows: int, whole_rows: bool):
    """The tiled map's dimensions, byte strides (of dimensions 1 and up) and box, innermost first.

    Args:
        rows, head_size, box_rows, whole_rows: as :func:`encode`.

    Returns:
        ``(dims, strides, box)``, tuples of ints.
    """
    blocks = head_size // BOX_COLS if whole_rows else 1
    if blocks > 1:
        # NOTE: the dimensions are not in stride order (column blocks 128 bytes apart, rows
        # head_size * 2, 8-row groups 16 * head_size): TMA stores a box dimension by dimension,
        # innermost first, so this order lands each 8-row group's column blocks one after the
        # other, the layout wgmma reads. The innermost 64 columns stay contiguous, as TMA requires.
        return ((BOX_COLS, GROUP_ROWS, blocks, rows // GROUP_ROWS),
                (head_size * 2, BOX_COLS * 2, GROUP_ROWS * head_size * 2),
                (BOX_COLS, GROUP_ROWS, blocks, box_rows // GROUP_ROWS))
    return (head_size, rows), (head_size * 2,), (BOX_COLS, box_rows)


def emulated_map(address: int, rows: int, head_size: int, dtype: str, box_rows: int,
                 whole_rows: bool = False) -> np.void:
    """The map in the emulated device's own 128-byte encoding (no driver involved).

    Words: 0 :data:`EMULATED_MAP_MAGIC`; 1 the tensor's address (the CPU tensor's, which the
    emulator finds among the launch's array arguments); 2 rank | element bytes << 8 | swizzle
    << 16 (1: 128-byte); 3-6 dimensions; 7-9 byte strides of dimensions 1-3; 10-13 the box.
    ``reference/include/emulate/pagedlab_emu_runtime.h`` (``land_tma``) reads it.

    Args and Returns: as :func:`encode`.
    """
    dims, strides, box = map_shape(rows, head_size, box_rows, whole_rows)
    words = np.zeros(16, dtype=np.uint64)
    words[0], words[1] = EMULATED_MAP_MAGIC, int(address)
    words[2] = len(dims) | 2 << 8 | 1 << 16
    words[3:3 + len(dims)] = dims
    words[7:7 + len(strides)] = strides
    words[10:10 + len(box)] = box
    return np.frombuffer(words.tobytes(), dtype=TMAP_DTYPE)[0]


class TensorMap:
    """A kernel argument: the tensor map of one cache (see :func:`tensor_map`).

    ``reference.cuda.launch`` passes :attr:`value`; a plan keeps the object and calls
    :meth:`at` with each run's cache address.

    Attributes:
        address: the cache's device address the map was made for.
        rows: rows of the 2-D view.
        head_size: elements per row.
        dtype: ``"float16"`` or ``"bfloat16"``.
        box_rows: rows per box.
        whole_rows: a box holds whole rows (all columns), not 64 columns of them.
    """

    __slots__ = ("address", "rows", "head_size", "dtype", "box_rows", "whole_rows")

    def __init__(self, address: int, rows: int, head_size: int, dtype: str, box_rows: int,
                 whole_rows: bool = False):
        self.address, self.rows, self.head_size = int(address), int(rows), int(head_size)
        self.dtype, self.box_rows, self.whole_rows = dtype, int(box_rows), bool(whole_rows)
        if self.whole_rows and self.head_size > BOX_COLS and (self.box_rows % GROUP_ROWS
                                                              or self.rows % GROUP_ROWS):
            # NOTE: the 4-D map counts rows in 8-row groups: a partial group would be floored
            # away silently (a kernel expecting its bytes would then wait forever).
            raise ValueError(f"a whole-row map needs box_rows and rows to be multiples of "
                             f"{GROUP_ROWS}, got box_rows {self.box_rows}, rows {self.rows}")

    @property
    def value(self) -> np.void:
        """The encoded map for :attr:`address`."""
        return self.at(self.address)

    def at(self, address) -> np.void:
        """The same map for a cache of the same shape at ``address`` (cached per address): an
        int, or the emulated device's pointer (a ``HostArray``, whose ``address`` it takes)."""
        from reference.cuda import emulating

        address = getattr(address, "address", address)
        # NOTE: not through encode's cache: a map encoded for the GPU must never serve the
        # emulated device, nor the reverse (the mode is not part of that cache's key).
        fn = emulated_map if emulating() else encode
        return fn(int(address), self.rows, self.head_size, self.dtype, self.box_rows,
                  self.whole_rows)

    def __repr__(self) -> str:
        cols = self.head_size if self.whole_rows else BOX_COLS
        return (f"TensorMap({self.rows} x {self.head_size} {self.dtype} at {self.address:#x}, "
                f"box {self.box_rows} x {cols})")


def tensor_map(cache, box_rows: int, *, whole_rows: bool = False) -> TensorMap:
    """The TMA map of a paged cache for Lab 5's Hopper kernel.

    Args:
        cache: [num_blocks, num_kv_heads, block_size, head_size] float16 or bfloat16, a
            contiguous CUDA torch tensor (or CuPy array), 16-byte aligned; head_size a multiple
            of 64.
        box_rows: keys per box: ``min(block_size, WGMMA_BLOCK_N)`` — a box never crosses a
            page (1..256).
        whole_rows: boxes of ``box_rows`` whole rows, stored in 8-row groups
            ``[box_rows / 8][head_size / 64][8][64]`` (one TMA request per box; at head size
            over 64, ``box_rows`` and ``block_size`` multiples of 8); default: boxes of 64
            columns, one request per 64 columns, stored ``[box_rows][64]``.

    Returns:
        A :class:`TensorMap` to put in the kernel's argument list.

    Raises:
        TypeError: ``cache`` is not a 16-bit CUDA tensor.
        ValueError: not 4-D, not contiguous, misaligned, or a head size, block size or box the
            map cannot describe.
    """
    from reference.checks import dtype_name
    from reference.cuda import as_torch, emulating

    t = as_torch(cache)
    dtype = dtype_name(t)
    # NOTE: the emulated device's arrays are CPU tensors, and so are the caches it maps.
    device = "cpu" if emulating() else "cuda"
    if dtype not in _DTYPES or t.device.type != device:
        raise TypeError(f"cache must be a float16 or bfloat16 {device.upper()} tensor, got "
                        f"{dtype} on {t.device}")
    if t.dim() != 4 or not t.is_contiguous():
        raise ValueError(f"cache must be a contiguous [num_blocks, num_kv_heads, block_size, "
                         f"head_size] tensor, got shape {tuple(t.shape)}")
    head_size = t.shape[-1]
    if head_size % BOX_COLS or t.data_ptr() % 16:
        raise ValueError(f"cache must have a head size that is a multiple of {BOX_COLS} and a "
                         f"16-byte aligned address, got head size {head_size}")
    if not 1 <= int(box_rows) <= 256:
        raise ValueError(f"box_rows must be in 1..256, got {box_rows}")
    if whole_rows and head_size > BOX_COLS and t.shape[2] % GROUP_ROWS:
        # NOTE: a box's first row is a page's (or a 128-key slice of one), which the kernel
        # names by its 8-row group: pages must start on one. (TensorMap checks the box itself.)
        raise ValueError(f"a whole-row map needs the cache's block_size to be a multiple of "
                         f"{GROUP_ROWS} (boxes land in 8-row groups), got {t.shape[2]}")
    return TensorMap(t.data_ptr(), t.numel() // head_size, head_size, dtype, box_rows, whole_rows)
