"""Speed grading: the trusted side's check of a recording, before anything of it compiles.

A recording (:mod:`reference.grader.speed_record`) is the student code's word. This module
decides whether the trusted timing process (:mod:`reference.grader.speed_replay`) may compile
and launch it: at most :data:`MAX_LAUNCHES` launches of ``extern "C"`` kernels in ``.cu`` files
of the graded implementation's own folder or its lab's, whose ``#include`` lines stay inside the
workbook's and the toolkit's headers; ``-D`` options (and a few harmless flags) only; grids,
blocks and shared memory within CUDA's limits; arguments that name an input, a scratch buffer,
null or a scalar; scratch within :data:`MAX_SCRATCH_BYTES`.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from reference.paths import LABS_DIR

#: Launches (kernels) a stage may record per call.
MAX_LAUNCHES = 8
#: Scratch bytes a stage may ask for, all buffers together.
MAX_SCRATCH_BYTES = 4 << 30
#: Bytes of scratch content a recording may carry, all buffers together.
MAX_CONTENT_BYTES = 64 << 20
#: Dynamic shared memory a launch may ask for (sm_90's per-block opt-in maximum, 227 KiB).
MAX_SHARED_MEM = 227 * 1024

_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*include\b(.*)$", re.M)
_OPTION_RE = re.compile(r"-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.:+-]*)?")
_OPTIONS_ALLOWED = frozenset({"-lineinfo", "--use_fast_math", "-use_fast_math"})
_ARG_KINDS = {"in": 3, "scratch": 3, "null": 1, "i32": 2, "i64": 2, "f32": 2}


class SpeedRecordingError(ValueError):
    """A recorded stage that the trusted side will not replay (the stage scores 0)."""


def allowed_dirs(lab: str) -> tuple[Path, ...]:
    """Folders whose ``.cu`` files a recording of ``lab`` may name: the graded implementation's
    own (the lab folder for the starter, ``solutions/<lab>`` or a mutant's copy) and the lab's."""
    from reference.loader import impl_file

    mutant = os.environ.get("PAGEDLAB_IMPL_DIR")
    own = Path(mutant) if mutant else impl_file(lab).parent
    return tuple({own.resolve(), (LABS_DIR / lab).resolve()})


def check_recording(recording, lab: str, dirs: tuple[Path, ...] | None = None) -> dict:
    """Checks an untrusted recording before anything of it is compiled or launched.

    Args:
        recording: what :func:`reference.grader.speed_record.record` returned (any value).
        lab: the stage's lab.
        dirs: folders the kernel files must be in (default :func:`allowed_dirs`).

    Returns:
        The recording, its paths resolved.

    Raises:
        SpeedRecordingError: naming what is wrong.
    """
    dirs = dirs or allowed_dirs(lab)
    if not isinstance(recording, dict):
        raise SpeedRecordingError(f"the recording is a {type(recording).__name__}, not a dict")
    if "error" in recording:
        raise SpeedRecordingError(str(recording["error"])[:500])
    inputs, scratch, launches = (recording.get(k) for k in ("inputs", "scratch", "launches"))
    if not (isinstance(inputs, list) and isinstance(scratch, list) and isinstance(launches, list)):
        raise SpeedRecordingError("the recording needs lists 'inputs', 'scratch', 'launches'")
    if not 1 <= len(launches) <= MAX_LAUNCHES:
        raise SpeedRecordingError(f"{len(launches)} launches recorded; a stage may make 1 to "
                                  f"{MAX_LAUNCHES}")
    total = content_total = 0
    for s in scratch:
        if not (isinstance(s, dict) and _is_int(s.get("nbytes")) and s["nbytes"] > 0):
            raise SpeedRecordingError("a scratch buffer needs a positive 'nbytes'")
        content = s.get("content")
        if content is not None and (not isinstance(content, str)
                                    or len(content) != 2 * s["nbytes"]):
            raise SpeedRecordingError("a scratch buffer's content must be hex of its nbytes")
        total += s["nbytes"]
        content_total += s["nbytes"] if content is not None else 0
    if total > MAX_SCRATCH_BYTES or content_total > MAX_CONTENT_BYTES:
        raise SpeedRecordingError(f"{total} bytes of scratch ({content_total} with content); at "
                                  f"most {MAX_SCRATCH_BYTES} ({MAX_CONTENT_BYTES})")
    checked = [_check_launch(launch, inputs, len(scratch), dirs) for launch in launches]
    for folder in sorted(dirs):  # the kernels' folders, and the lab's headers they include
        check_includes(folder)
    return {"inputs": list(inputs), "scratch": scratch, "launches": checked}


def check_includes(folder: Path) -> None:
    """Refuses kernel sources whose ``#include`` could reach outside the workbook's folders.

    Every ``.cu``, ``.cuh`` and ``.h`` file of ``folder`` may include ``<name>`` or
    ``"name"`` with a relative path free of ``..``: the file's folder, its lab's, the
    workbook's ``reference/include`` and the CUDA toolkit's headers are all the compiler
    searches. NOTE: an absolute or ``..`` path could compile someone else's kernel (a library's
    headers installed on the grading machine) as the student's.

    Raises:
        SpeedRecordingError: naming the file and the include.
    """
    for source in sorted(folder.iterdir()):
        if source.suffix not in (".cu", ".cuh", ".h") or not source.is_file():
            continue
        text = source.read_text(errors="replace").replace("\\\n", "")
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        for match in _INCLUDE_RE.finditer(text):
            target = match.group(1).split("//")[0].strip()
            name = target[1:-1] if len(target) > 2 and (target[0], target[-1]) in (
                ("<", ">"), ('"', '"')) else None
            if name is None or name.startswith(("/", "\\")) or ".." in Path(name).parts:
                raise SpeedRecordingError(f"{source.name}: #include {target} — only relative "
                                          "header names without '..' are compiled for speed")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_launch(launch, inputs: list, num_scratch: int, dirs: tuple[Path, ...]) -> dict:
    if not isinstance(launch, dict):
        raise SpeedRecordingError("a launch must be a dict")
    path = launch.get("path")
    if not isinstance(path, str):
        raise SpeedRecordingError("a launch needs its kernel file's 'path'")
    resolved = Path(path).resolve()
    if resolved.suffix != ".cu" or resolved.parent not in dirs or not resolved.is_file():
        raise SpeedRecordingError(f"kernel file {path!r} is not a .cu file of the graded "
                                  f"implementation's folder or its lab's")
    name = launch.get("name")
    if not (isinstance(name, str) and name.isidentifier()):
        raise SpeedRecordingError(f"kernel name {name!r} is not an identifier (extern \"C\" "
                                  "kernels only)")
    options = launch.get("options")
    if not (isinstance(options, list) and all(isinstance(o, str) and (
            _OPTION_RE.fullmatch(o) or o in _OPTIONS_ALLOWED) for o in options)):
        raise SpeedRecordingError(f"compiler options {options!r}: only -DNAME[=VALUE], "
                                  f"{sorted(_OPTIONS_ALLOWED)}")
    if launch.get("backend") not in ("nvrtc", "nvcc") or launch.get("name_expressions"):
        raise SpeedRecordingError("kernels must be compiled by NVRTC or nvcc, without name "
                                  "expressions")
    grid, block, smem = launch.get("grid"), launch.get("block"), launch.get("shared_mem")
    for what, dims, limits in (("grid", grid, (2**31 - 1, 65535, 65535)),
                               ("block", block, (1024, 1024, 64))):
        if not (isinstance(dims, list) and 1 <= len(dims) <= 3
                and all(_is_int(d) and 1 <= d <= lim for d, lim in zip(dims, limits))):
            raise SpeedRecordingError(f"{what} {dims!r} is outside CUDA's limits")
    if math.prod(block) > 1024 or not (_is_int(smem) and 0 <= smem <= MAX_SHARED_MEM):
        raise SpeedRecordingError(f"block {block} or shared memory {smem!r} outside CUDA's limits")
    args = launch.get("args")
    if not isinstance(args, list) or len(args) > 64:
        raise SpeedRecordingError("a launch needs at most 64 'args'")
    for arg in args:
        if not (isinstance(arg, list) and arg and _ARG_KINDS.get(arg[0]) == len(arg)):
            raise SpeedRecordingError(f"argument {arg!r} is not one of {sorted(_ARG_KINDS)}")
        kind = arg[0]
        if kind == "in" and not (arg[1] in inputs and _is_int(arg[2]) and arg[2] >= 0):
            raise SpeedRecordingError(f"argument {arg!r} names no input")
        if kind == "scratch" and not (_is_int(arg[1]) and 0 <= arg[1] < num_scratch
                                      and _is_int(arg[2]) and arg[2] >= 0):
            raise SpeedRecordingError(f"argument {arg!r} names no scratch buffer")
        if kind in ("i32", "i64") and not _is_int(arg[1]):
            raise SpeedRecordingError(f"argument {arg!r} is not an integer")
        if kind == "f32" and not isinstance(arg[1], (int, float)):
            raise SpeedRecordingError(f"argument {arg!r} is not a number")
    return {**launch, "path": str(resolved)}
