"""Small argument checks that raise typed errors naming the argument.

They are plumbing, not lab content: every lab validates its inputs with them so that error
messages read the same across the workbook. The last part holds the checks every kernel
launcher of Labs 4 and 5 runs on torch tensors / CuPy arrays, kept here once so that both labs
report the same mistake the same way.

The contract every public function of the workbook keeps (and ``tests/fuzz`` enforces):

  * bad input raises ``TypeError`` (wrong kind of value), ``ValueError`` (right kind, wrong
    value or shape), ``IndexError`` (an id or slot out of range) or one of the typed errors of
    ``reference/errors.py``, and the message names the argument (``block_id``,
    ``token_ids[3]``, ``slot_mapping``);
  * integers are integers: ``bool``, ``float``, ``str`` and NumPy floats are refused, never
    rounded or parsed; NumPy and torch *integer* scalars are accepted and turned into Python
    ints once, here;
  * everything is checked before anything changes, so a call that raises changed nothing.
"""

from __future__ import annotations

import math
import numbers
import os
import sys

import numpy as np

from reference.errors import DeviceMismatchError
from reference.layout import PAD_BLOCK_ID, num_blocks_for


def _as_int(value: object) -> int | None:
    """Returns ``value`` as a Python int if it is an integer scalar, else None.

    Integer scalars: Python ints, NumPy integers, 0-d NumPy integer arrays and 0-d torch
    integer tensors. Bools of every library are not integers here.
    """
    if type(value) is int:  # the common case, first
        return value
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, np.ndarray):
        return int(value) if value.ndim == 0 and value.dtype.kind in "iu" else None
    torch = sys.modules.get("torch")  # NOTE: no import: if torch is not loaded, no tensor exists
    if torch is not None and isinstance(value, torch.Tensor):
        ok = value.ndim == 0 and not value.dtype.is_floating_point \
            and not value.dtype.is_complex and value.dtype != torch.bool
        return int(value.item()) if ok else None
    return None


def _describe(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def check_int(name: str, value: object, *, min_value: int | None = None) -> int:
    """Checks that ``value`` is an integer (not a bool) and at least ``min_value``.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.
        min_value: smallest allowed value, or None for no bound.

    Returns:
        ``value`` as a Python int (NumPy and torch integer scalars are converted once, here).

    Raises:
        TypeError: ``value`` is not an integer (bools, floats and strings are refused).
        ValueError: ``value`` is below ``min_value``.
    """
    # NOTE: bool is a subclass of int; True as a block id is almost always a bug.
    as_int = _as_int(value)
    if as_int is None:
        raise TypeError(f"{name} must be an int, got {_describe(value)}")
    if min_value is not None and as_int < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {as_int}")
    return as_int


def check_index(name: str, value: object, size: int) -> int:
    """Checks that ``value`` is an integer index in ``[0, size)``.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.
        size: number of valid indices.

    Returns:
        ``value`` as a Python int.

    Raises:
        TypeError: ``value`` is not an integer.
        IndexError: ``value`` is negative or ``>= size``.
    """
    as_int = _as_int(value)
    if as_int is None:
        raise TypeError(f"{name} must be an int, got {_describe(value)}")
    if not 0 <= as_int < size:
        raise IndexError(f"{name}={as_int} is out of range [0, {size})")
    return as_int


def check_block_hash(name: str, value: object) -> int:
    """Checks that ``value`` is a block hash: an int in ``[0, 2**64)``.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.

    Returns:
        ``value`` as a Python int.

    Raises:
        TypeError: not an int (bools and floats are refused).
        ValueError: negative or ``>= 2**64`` (no :func:`hash_block_tokens` result is).
    """
    value = check_int(name, value, min_value=0)
    if value >= 1 << 64:
        raise ValueError(f"{name}={value} is not a 64-bit block hash (must be < 2**64)")
    return value


def check_sequence(name: str, value: object) -> list:
    """Checks that ``value`` is an ordered sequence (list, tuple, range, 1-D array or tensor).

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.

    Returns:
        Its items as a new list (a later change to the caller's list cannot reach us).

    Raises:
        TypeError: ``None``, a string, a set, a dict, a scalar, or an array that is not 1-D.
    """
    if isinstance(value, (list, tuple, range)):
        return list(value)
    torch = sys.modules.get("torch")
    if isinstance(value, np.ndarray) or (torch is not None and isinstance(value, torch.Tensor)):
        if value.ndim == 1:
            return value.tolist()  # Python scalars of the same kind (ints stay ints)
        raise TypeError(f"{name} must be 1-D, got an array of shape {tuple(value.shape)}")
    # NOTE: a str is a Sequence too: "12" would read as the tokens "1", "2".
    raise TypeError(f"{name} must be a list of ints, got {_describe(value)}")


def check_int_list(name: str, value: object, *, min_value: int | None = None) -> list[int]:
    """Checks a sequence of integers; items are named ``name[i]`` in messages.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed (see :func:`check_sequence`).
        min_value: smallest allowed item, or None for no bound.

    Returns:
        The items as Python ints.

    Raises:
        TypeError: not a sequence, or an item is not an integer.
        ValueError: an item is below ``min_value``.
    """
    out = []
    for i, v in enumerate(check_sequence(name, value)):
        as_int = _as_int(v)
        # NOTE: messages are formatted only on failure: this runs once per token of a prompt.
        if as_int is None:
            raise TypeError(f"{name}[{i}] must be an int, got {_describe(v)}")
        if min_value is not None and as_int < min_value:
            raise ValueError(f"{name}[{i}] must be >= {min_value}, got {as_int}")
        out.append(as_int)
    return out


def check_float_array(name: str, value: object, ndim: int, shape_doc: str) -> np.ndarray:
    """Checks that ``value`` is a floating-point NumPy array with ``ndim`` dimensions.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.
        ndim: required number of dimensions.
        shape_doc: the expected shape in words, e.g. ``"[num_seqs, num_q_heads, head_size]"``.

    Returns:
        ``value`` unchanged.

    Raises:
        TypeError: not a NumPy array of floats.
        ValueError: wrong number of dimensions.
    """
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        got = type(value).__name__
        if isinstance(value, np.ndarray):
            got += f" of {value.dtype}"
        raise TypeError(f"{name} must be a floating-point numpy array {shape_doc}, got {got}")
    if value.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {shape_doc}, got shape {value.shape}")
    return value


def as_array(name: str, value: object) -> np.ndarray:
    """Returns ``np.asarray(value)``, turning NumPy's own refusals into errors naming ``name``.

    Raises:
        TypeError: ``value`` is None or a torch tensor, or NumPy cannot make a numeric array of
            it (ragged lists, objects, strings).
    """
    if value is None:
        raise TypeError(f"{name} must be an array, got None")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        # NOTE: NumPy would take a CPU tensor and choke on a CUDA one; refuse both alike.
        raise TypeError(f"{name} must be a numpy array, got a torch.Tensor (use .cpu().numpy())")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise TypeError(f"{name} must be a rectangular numeric array: {exc}") from None
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    return arr


def check_int_array(name: str, value: object, ndim: int, shape_doc: str) -> np.ndarray:
    """Checks that ``value`` is an integer array (lists of ints are accepted) with ``ndim`` dims.

    Args:
        name: the argument's name, used in the message.
        value: what the caller passed.
        ndim: required number of dimensions.
        shape_doc: the expected shape in words.

    Returns:
        ``value`` as an int64 NumPy array.

    Raises:
        TypeError: not integers (floats and bools are refused; an empty list is fine).
        ValueError: wrong number of dimensions, or a uint64 value past int64's range.
    """
    arr = as_array(name, value)
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise TypeError(f"{name} must hold integers {shape_doc}, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D {shape_doc}, got shape {arr.shape}")
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} holds {int(arr.max())}, past int64's range")
    return arr.astype(np.int64)


def check_scale(scale: object, *, name: str = "scale", dtype=np.float64) -> float:
    """Checks that ``scale`` is a real number that is finite and > 0 *in* ``dtype``.

    A kernel that takes its scale as float32 sees ``1e39`` as inf and ``1e-50`` as 0, so those
    are refused for ``dtype=np.float32`` even though they are fine Python floats.

    Args:
        scale: what the caller passed.
        name: the argument's name, used in the message.
        dtype: the float type the computation uses (float64 or float32).

    Returns:
        ``scale`` as a Python float.

    Raises:
        TypeError: not a real number (bools and strings are refused).
        ValueError: not finite, not > 0, or not finite and > 0 once rounded to ``dtype``.
    """
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{name} must be a float, got {_describe(scale)}")
    try:
        value = float(scale)
    except OverflowError:
        raise ValueError(f"{name}={scale} overflows a float") from None
    with np.errstate(over="ignore", under="ignore"):
        rounded = float(np.dtype(dtype).type(value))
    if not (math.isfinite(rounded) and rounded > 0):
        raise ValueError(f"{name} must be finite and > 0 as {np.dtype(dtype).name}, got {scale!r}"
                         f" (which is {rounded} in {np.dtype(dtype).name})")
    return value


def check_kv_cache(key_cache: object, value_cache: object) -> tuple[int, int, int, int]:
    """Checks the paged caches and returns ``(num_blocks, num_kv_heads, block_size, head_size)``.

    Args:
        key_cache: [num_blocks, num_kv_heads, block_size, head_size]
        value_cache: [num_blocks, num_kv_heads, block_size, head_size]

    Raises:
        TypeError / ValueError: not 4-D float arrays of the same shape.
    """
    doc = "[num_blocks, num_kv_heads, block_size, head_size]"
    check_float_array("key_cache", key_cache, 4, doc)
    check_float_array("value_cache", value_cache, 4, doc)
    if key_cache.shape != value_cache.shape:
        raise ValueError(f"value_cache shape {value_cache.shape} != key_cache shape "
                         f"{key_cache.shape}")
    if 0 in key_cache.shape[1:]:
        # NOTE: a block_size of 0 would divide by zero later; 0 heads or head_size is no cache.
        raise ValueError(f"key_cache {doc} needs num_kv_heads, block_size and head_size >= 1, "
                         f"got shape {key_cache.shape}")
    return tuple(int(d) for d in key_cache.shape)  # type: ignore[return-value]


def check_heads(num_q_heads: int, num_kv_heads: int) -> int:
    """Checks the GQA head counts and returns the group size ``num_q_heads // num_kv_heads``.

    Raises:
        TypeError: a count is not an int.
        ValueError: ``num_q_heads`` is not a positive multiple of ``num_kv_heads``.
    """
    num_q_heads = check_int("num_q_heads", num_q_heads)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads)
    if num_kv_heads <= 0 or num_q_heads <= 0 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads={num_q_heads} must be a positive multiple of num_kv_heads={num_kv_heads} "
            f"(GQA: each KV head serves num_q_heads // num_kv_heads query heads)"
        )
    return num_q_heads // num_kv_heads


def check_head_size(name: str, head_size: int, cache_head_size: int) -> None:
    """Raises ValueError when an array's head_size differs from the cache's."""
    if head_size != cache_head_size:
        raise ValueError(f"{name} has head_size {head_size} but the KV cache has {cache_head_size}")


def check_alibi_slopes(alibi_slopes: object, num_q_heads: int,
                       dtype=np.float64) -> np.ndarray | None:
    """Checks optional ALiBi slopes: None, or ``[num_q_heads]`` floats, finite in ``dtype``.

    Args:
        alibi_slopes: what the caller passed.
        num_q_heads: query heads.
        dtype: the float type the slopes are used in (float32 for kernel-like code: a slope of
            1e39 is inf there).

    Returns:
        The slopes as ``dtype``, or None.

    Raises:
        TypeError: not an array of floats.
        ValueError: wrong shape, or a slope that is not finite in ``dtype``.
    """
    if alibi_slopes is None:
        return None
    arr = as_array("alibi_slopes", alibi_slopes)
    if arr.dtype.kind != "f":
        raise TypeError(f"alibi_slopes must be None or floats [num_q_heads], got dtype {arr.dtype}")
    with np.errstate(over="ignore"):
        cast = arr.astype(dtype)
    if arr.shape != (num_q_heads,) or not np.isfinite(cast).all():
        raise ValueError(
            f"alibi_slopes must be None or {num_q_heads} floats [num_q_heads], finite as "
            f"{np.dtype(dtype).name}; got dtype {arr.dtype} shape {arr.shape}"
        )
    return cast


def check_block_tables(block_tables: object, context_lens: object, num_blocks: int,
                       block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Checks block tables against the context lengths they must cover.

    Args:
        block_tables: [num_seqs, max_blocks_per_seq] int, padded with PAD_BLOCK_ID.
        context_lens: [num_seqs] int >= 0.
        num_blocks: physical blocks in the cache.
        block_size: tokens per block.

    Returns:
        ``(block_tables, context_lens)`` as int64 arrays.

    Raises:
        TypeError: not integer arrays.
        ValueError: shapes disagree, a length is negative, or a row is too short.
        IndexError: an entry a sequence needs is not a physical block id (PAD_BLOCK_ID included).
    """
    tables = check_int_array("block_tables", block_tables, 2, "[num_seqs, max_blocks_per_seq]")
    lens = check_int_array("context_lens", context_lens, 1, "[num_seqs]")
    if lens.shape[0] != tables.shape[0]:
        raise ValueError(f"context_lens has {lens.shape[0]} entries but block_tables has "
                         f"{tables.shape[0]} rows (one per sequence)")
    if (lens < 0).any():
        s = int(np.argmax(lens < 0))
        raise ValueError(f"context_lens[{s}]={int(lens[s])} is negative")
    capacity = tables.shape[1] * block_size
    if (lens > capacity).any():
        s = int(np.argmax(lens > capacity))
        needs = num_blocks_for(int(lens[s]), block_size)
        raise ValueError(f"context_lens[{s}]={int(lens[s])} needs {needs} blocks but block_tables "
                         f"rows hold {tables.shape[1]}")
    needed = -(-lens // block_size)  # [num_seqs]
    in_use = np.arange(tables.shape[1])[None, :] < needed[:, None]
    bad = in_use & ((tables < 0) | (tables >= num_blocks))
    if bad.any():
        s, j = (int(x) for x in np.argwhere(bad)[0])
        what = " (PAD_BLOCK_ID)" if tables[s, j] == PAD_BLOCK_ID else ""
        raise IndexError(
            f"block_tables[{s}, {j}]={int(tables[s, j])}{what} is not a block id in "
            f"[0, {num_blocks}), but sequence {s} with context_len={int(lens[s])} needs logical "
            f"block {j}"
        )
    return tables, lens


def check_cu_seqlens(cu_seqlens_q: object, num_seqs: int, total_tokens: int,
                     context_lens: np.ndarray) -> np.ndarray:
    """Checks varlen query offsets against the packed query and the context lengths.

    Args:
        cu_seqlens_q: [num_seqs + 1] int, starts at 0, non-decreasing, ends at total_tokens.
        num_seqs: sequences in the batch.
        total_tokens: rows of the packed query.
        context_lens: [num_seqs] keys per sequence (history + new tokens).

    Returns:
        ``cu_seqlens_q`` as int64.

    Raises:
        ValueError: bad offsets, or a sequence with more query tokens than keys.
    """
    cu = check_int_array("cu_seqlens_q", cu_seqlens_q, 1, "[num_seqs + 1]")
    if cu.shape[0] != num_seqs + 1:
        raise ValueError(f"cu_seqlens_q must have num_seqs + 1 = {num_seqs + 1} entries, "
                         f"got {cu.shape[0]}")
    if cu[0] != 0 or cu[-1] != total_tokens or (np.diff(cu) < 0).any():
        raise ValueError(f"cu_seqlens_q must start at 0, never decrease and end at the query's "
                         f"{total_tokens} tokens, got {cu.tolist()}")
    q_lens = np.diff(cu)
    if (q_lens > context_lens).any():
        s = int(np.argmax(q_lens > context_lens))
        raise ValueError(f"sequence {s} has {int(q_lens[s])} query tokens but context_lens[{s}]="
                         f"{int(context_lens[s])}: the new tokens' K/V must already be cached")
    return cu


def check_dense_inputs(q: object, k: object, v: object, causal: object):
    """Checks :func:`dense_attention`'s arrays and returns them as float64.

    Args:
        q: [q_len, num_q_heads, head_size] floats.
        k: [kv_len, num_kv_heads, head_size] floats.
        v: [kv_len, num_kv_heads, head_size] floats.
        causal: a bool.

    Returns:
        (q, k, v) as float64 arrays.

    Raises:
        TypeError: not float arrays (lists of floats are fine), or ``causal`` is not a bool.
        ValueError: wrong dimensions, k and v of different shapes, or head sizes that differ.
    """
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    out = []
    for name, x, doc in (("q", q, "[q_len, num_q_heads, head_size]"),
                         ("k", k, "[kv_len, num_kv_heads, head_size]"),
                         ("v", v, "[kv_len, num_kv_heads, head_size]")):
        arr = as_array(name, x)
        out.append(check_float_array(name, arr, 3, doc).astype(np.float64))
    q, k, v = out
    if k.shape != v.shape:
        raise ValueError(f"v shape {v.shape} != k shape {k.shape}")
    check_head_size("q", q.shape[2], k.shape[2])
    return q, k, v


# ----------------------------------------------------------------------------- kernel launchers

#: ``PAGEDLAB_DEBUG=1`` (or a launcher's ``debug=True``) turns on the checks that read device
#: memory (block ids, context lengths): they cost a synchronisation, so they are off by default.
DEBUG_ENV = "PAGEDLAB_DEBUG"


def debug_enabled(debug: bool | None = None) -> bool:
    """Whether the value checks that read device memory run.

    Args:
        debug: the caller's choice; None defers to ``PAGEDLAB_DEBUG`` (unset, "" or "0": off).

    Returns:
        True when the checks should run.
    """
    if debug is not None:
        return bool(debug)
    return os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def dtype_name(x) -> str:
    """Returns the element type of a torch tensor or CuPy array as a NumPy-style name
    (``"float16"``, ``"int32"``, ...)."""
    return str(x.dtype).removeprefix("torch.")


def _is_array(x) -> bool:
    # NOTE: checked by duck type, so CuPy (and torch) need not be imported to refuse a list.
    # Under emulation a NumPy array stands in for a CuPy array (reference.cuda.is_cupy).
    return (hasattr(x, "data_ptr") or type(x).__module__.startswith("cupy")
            or (isinstance(x, np.ndarray) and _emulating()))


def check_array(name: str, x, ndim: int, dtypes: tuple[str, ...]) -> None:
    """Checks one launcher argument: a torch tensor or CuPy array of ``ndim`` dimensions, one of
    ``dtypes``, contiguous (the kernels compute addresses from the shape alone).

    Args:
        name: the argument's name, used in every message.
        x: what the caller passed.
        ndim: required number of dimensions.
        dtypes: accepted element type names.

    Raises:
        TypeError: not a torch tensor / CuPy array, or a dtype not in ``dtypes``.
        ValueError: the wrong number of dimensions, or a strided (non-contiguous) view.
    """
    if not _is_array(x):
        raise TypeError(f"{name} must be a torch tensor or a CuPy array, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if dtype_name(x) not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(dtypes)}, got {dtype_name(x)}")
    if hasattr(x, "is_contiguous"):  # torch: strides in elements
        contiguous, strides = x.is_contiguous(), tuple(x.stride())
    else:  # CuPy: strides in bytes
        contiguous, strides = bool(x.flags.c_contiguous), tuple(x.strides)
    if not contiguous:
        raise ValueError(f"{name} must be contiguous, got strides {strides} (call .contiguous() "
                         "first: the kernels compute addresses from the shape)")


def _device(x) -> tuple[str, int | None]:
    if hasattr(x, "device") and hasattr(x, "data_ptr"):  # torch
        return x.device.type, x.device.index
    if isinstance(x, np.ndarray):  # the emulated device's stand-in for a CuPy array
        return "cpu", None
    return "cuda", int(x.device.id)  # CuPy arrays always live on a GPU


def _emulating() -> bool:
    from reference.cuda import emulating  # lazily: checks must import without the CUDA loader

    return emulating()


def check_on_cuda(**arrays) -> None:
    """The last check of every launcher: each array (None skipped) on one CUDA device.

    It comes last so that every other mistake is reported on a machine without a GPU too. Under
    the emulated device (``PAGEDLAB_DEVICE=emulate``, :mod:`reference.emulate`) CPU tensors pass.

    Args:
        **arrays: argument name -> torch tensor or CuPy array (or None), in the caller's order.

    Raises:
        TypeError: no array was given at all (a launcher that forgot to pass its tensors would
            otherwise be "checked" by a call that checks nothing).
        DeviceMismatchError: naming the first array on the CPU, or the first one on another GPU
            than the first array's.
    """
    if not arrays:
        raise TypeError("check_on_cuda() needs at least one tensor or array (name=tensor "
                        "keyword arguments); it was called with none")
    first = None
    for name, x in arrays.items():
        if x is None:
            continue
        kind, index = _device(x)
        if kind == "cpu" and _emulating():
            kind = "cuda"  # NOTE: under PAGEDLAB_DEVICE=emulate the CPU stands in for the GPU
        if kind != "cuda":
            raise DeviceMismatchError(f"{name} is on {kind}: the kernels need CUDA tensors (or CuPy "
                                      "arrays), all on one GPU (every check before this one passed)")
        if first is None:
            first = (name, index)
        elif index != first[1]:
            raise DeviceMismatchError(f"{name} is on cuda:{index} but {first[0]} is on "
                                      f"cuda:{first[1]}: every tensor must be on one GPU")
