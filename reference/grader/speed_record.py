"""Speed grading, the untrusted half: run a student's launcher once and describe its launches.

``pagedlab grade --speed`` (:mod:`reference.grader.speed`) times a kernel stage in a process
that never imports student Python. What it needs from the student's launcher — which kernels of
which ``.cu`` files, with which compile options, grid, block, shared memory, scalars, scratch
buffers and which argument is which input — is learnt here, where the student's code runs (the
isolated worker under grading, a child process otherwise): :func:`record` calls the launcher
once on inputs of the workload's exact shapes with :func:`reference.cuda.capture_launches` open
(nothing runs on the device) and returns the launches as plain data.

NOTE: everything returned is the student code's word. The trusted side checks it
(:func:`reference.grader.speed_check.check_recording`), compiles the named files itself from the
submission, and accepts a time only for launches whose every output it has compared with a
float64 oracle: a wrong description costs the stage its points, it cannot earn any.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from reference import cuda as rcuda

#: Scratch buffers up to this size travel with their contents (a tile work list the launcher
#: uploaded is read by the kernel), up to MAX_CONTENT_TOTAL_BYTES in all; others only with
#: their size.
MAX_SCRATCH_CONTENT_BYTES = 16 << 20
MAX_CONTENT_TOTAL_BYTES = 64 << 20


def build_inputs(spec: dict, device: str = "cuda") -> tuple[dict, tuple]:
    """Inputs of a workload's exact shapes (values: valid block tables, the exact lengths).

    Args:
        spec: the workload (:meth:`reference.grader.speed.SpeedWorkload.spec`).
        device: where the tensors live.

    Returns:
        ``(inputs, positional)``: every input tensor by name, ``out`` included, and the
        positional arguments of the launcher in order.
    """
    import torch

    dtype = getattr(torch, spec["dtype"])
    hq, hkv, d, bs = spec["num_q_heads"], spec["num_kv_heads"], spec["head_size"], spec["block_size"]
    lens = np.asarray(spec["context_lens"], dtype=np.int32)
    needed = blocks_needed(spec)
    table = block_table(spec, np.arange(needed, dtype=np.int32))
    kv_shape = (needed + 1, hkv, bs, d)
    inputs = {}
    if spec["kind"] == "decode":
        inputs["query"] = torch.zeros((len(lens), hq, d), dtype=dtype, device=device)
    else:
        total_q = int(sum(spec["query_lens"]))
        inputs["query"] = torch.zeros((total_q, hq, d), dtype=dtype, device=device)
    inputs["key_cache"] = torch.zeros(kv_shape, dtype=dtype, device=device)
    inputs["value_cache"] = torch.zeros(kv_shape, dtype=dtype, device=device)
    inputs["block_tables"] = torch.from_numpy(table).to(device)
    if spec["kind"] == "prefill":
        cu = np.concatenate([[0], np.cumsum(spec["query_lens"])]).astype(np.int32)
        inputs["cu_seqlens_q"] = torch.from_numpy(cu).to(device)
    inputs["context_lens"] = torch.from_numpy(lens).to(device)
    inputs["out"] = torch.zeros_like(inputs["query"])
    positional = tuple(v for k, v in inputs.items() if k != "out") + (float(spec["scale"]),)
    return inputs, positional


def blocks_needed(spec: dict) -> int:
    """KV blocks a workload's contexts fill, all sequences together."""
    lens = np.asarray(spec["context_lens"], dtype=np.int64)
    return int((-(-lens // spec["block_size"])).sum())


def block_table(spec: dict, block_ids: np.ndarray) -> np.ndarray:
    """A workload's block table: each sequence's blocks taken in turn from ``block_ids``.

    Args:
        spec: the workload.
        block_ids: [blocks_needed(spec)] physical block ids, in the order the sequences use them.

    Returns:
        [num_seqs, max_blocks_per_seq] int32, padded with -1.
    """
    lens = np.asarray(spec["context_lens"], dtype=np.int64)
    per_seq = -(-lens // spec["block_size"])
    table = np.full((len(lens), int(per_seq.max())), -1, dtype=np.int32)
    start = 0
    for s, n in enumerate(per_seq):
        table[s, :n] = block_ids[start:start + n]
        start += n
    return table


def record(impl, launcher: str, spec: dict) -> dict:
    """Runs ``impl.<launcher>`` once with its launches recorded and describes them.

    Args:
        impl: the student's lab module (the worker's own, when grading isolated).
        launcher: the stage's public launcher (``"paged_attention_v6"``).
        spec: the workload (:meth:`reference.grader.speed.SpeedWorkload.spec`).

    Returns:
        ``{"inputs": [names], "launches": [...], "scratch": [...]}`` (see
        :func:`describe_launches`), or ``{"error": "..."}`` when the launcher raised or
        launched something that cannot be described.
    """
    inputs, positional = build_inputs(spec, "cpu" if rcuda.emulating() else "cuda")
    try:
        with rcuda.capture_launches() as (recorded, kept):
            getattr(impl, launcher)(*positional, out=inputs["out"])
        return describe_launches(recorded, kept, inputs)
    except Exception as exc:  # noqa: BLE001 — the stage scores 0; the reason goes in the report
        return {"error": f"{launcher} raised {type(exc).__name__}: {exc}"[:500]}


def describe_launches(recorded: list, kept: list, inputs: dict) -> dict:
    """Recorded launches as plain data: each pointer named as an input or a scratch buffer.

    Args:
        recorded: :class:`reference.cuda.RecordedLaunch` items.
        kept: the tensors :func:`reference.cuda.ptr` converted during the capture.
        inputs: the inputs by name (their pointers become ``["in", name, byte offset]``).

    Returns:
        ``{"inputs": [...], "scratch": [{"nbytes", "content" (hex) or None}],
        "launches": [{"path", "name", "options", "backend", "name_expressions", "grid",
        "block", "shared_mem", "args"}]}``; an argument is ``["in", name, offset]``,
        ``["scratch", index, offset]``, ``["null"]``, ``["i32", v]``, ``["i64", v]``,
        ``["f32", v]``, ``["tmap", name, box_rows]`` (a TMA map of a whole input cache) or
        ``["tmap_rows", name, box_rows]`` (the same with boxes of whole rows).

    Raises:
        ValueError: a kernel not compiled by ``reference.cuda.load_module``, a pointer into
            memory that is neither an input nor scratch, or an argument of another type.
    """
    extents = [(name, x.data_ptr(), x.numel() * x.element_size()) for name, x in inputs.items()]
    storages: list = []  # (base address, nbytes, tensor) of each scratch storage
    # NOTE: on the emulated device ptr() hands out fenced host arrays and keeps nothing; the
    # arrays carry their tensors.
    hosted = [a.obj for r in recorded for a in r.args if type(a).__name__ == "HostArray"]
    for x in [*kept, *hosted]:
        if x is not None and rcuda.is_cupy(x):
            x = rcuda.as_torch(x)
        if x is None or not hasattr(x, "untyped_storage") or any(x is t for t in inputs.values()):
            continue
        storage = x.untyped_storage()
        base = storage.data_ptr()
        if not any(base == s[0] for s in storages) and not _inside(base, extents):
            storages.append((base, storage.nbytes(), x))
    launches = []
    for r in recorded:
        found = rcuda.kernel_origin(r.kernel)
        if found is None:
            raise ValueError(f"kernel {getattr(r.kernel, 'name', r.kernel)!r} was not compiled "
                             "by reference.cuda.load_module / get_kernel")
        origin, name = found
        launches.append({"path": origin.path, "name": name, "options": list(origin.options),
                         "backend": origin.backend,
                         "name_expressions": (list(origin.name_expressions)
                                              if origin.name_expressions else None),
                         "grid": [int(g) for g in r.grid], "block": [int(b) for b in r.block],
                         "shared_mem": int(r.shared_mem),
                         "args": [_arg(a, extents, storages) for a in r.args]})
    scratch, content_bytes = [], 0
    for base, nbytes, x in storages:
        content = None
        if nbytes <= MAX_SCRATCH_CONTENT_BYTES and content_bytes + nbytes <= MAX_CONTENT_TOTAL_BYTES:
            content_bytes += nbytes
            import torch

            raw = torch.empty(0, dtype=torch.uint8, device=x.device).set_(x.untyped_storage())
            content = raw.cpu().numpy().tobytes().hex()  # NOTE: a sync; recording only
        scratch.append({"nbytes": int(nbytes), "content": content})
    return {"inputs": list(inputs), "scratch": scratch, "launches": launches}


def _inside(address: int, extents: list) -> tuple | None:
    for name, base, nbytes in extents:
        if base <= address < base + max(nbytes, 1):
            return name, address - base
    return None


def _arg(arg, extents: list, storages: list) -> list:
    if isinstance(arg, np.int32):
        return ["i32", int(arg)]
    if isinstance(arg, np.float32):
        return ["f32", float(arg)]
    if isinstance(arg, np.int64):
        return ["i64", int(arg)]
    from reference.launch_plan import _arg_address  # the plan/run split reads pointers alike
    from reference.tma import TensorMap

    if isinstance(arg, TensorMap):
        return _tensor_map_arg(arg, extents)
    address = _arg_address(arg)
    if address is None:
        raise ValueError(f"a kernel argument of type {type(arg).__name__} (use ptr(...), "
                         "np.int32, np.float32)")
    if address == 0:
        return ["null"]
    hit = _inside(address, extents)
    if hit:
        return ["in", hit[0], hit[1]]
    hit = _inside(address, [(index, base, nbytes) for index, (base, nbytes, _)
                            in enumerate(storages)])
    if hit:
        return ["scratch", hit[0], hit[1]]
    raise ValueError("a pointer argument into memory that is neither an input nor a buffer "
                     "the launcher allocated and passed through ptr(...)")


def _tensor_map_arg(arg, extents: list) -> list:
    """A TMA map argument (``reference.tma.tensor_map`` of a whole input cache) as
    ``["tmap", input name, box_rows]`` (``"tmap_rows"`` for ``whole_rows=True``): the timing
    side makes the map of its own input again."""
    kind = "tmap_rows" if arg.whole_rows else "tmap"
    for name, base, nbytes in extents:
        if arg.address == base and arg.rows * arg.head_size * 2 == nbytes:  # 16-bit elements
            return [kind, name, int(arg.box_rows)]
    raise ValueError("a tensor map argument must be tensor_map(...) of a whole input cache")


def main(argv: list[str] | None = None) -> int:
    """``python -m reference.grader.speed_record LAB LAUNCHER`` with the workload's spec as
    JSON on stdin: prints :func:`record`'s result as JSON (the not-isolated path)."""
    from reference.loader import load_impl

    lab, launcher = (argv if argv is not None else sys.argv[1:])[:2]
    spec = json.loads(sys.stdin.read())
    try:
        result = record(load_impl(lab), launcher, spec)
    except Exception as exc:  # noqa: BLE001 — reported, the stage scores 0
        result = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
