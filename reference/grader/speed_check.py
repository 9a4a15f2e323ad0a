"""Speed grading: the trusted side's check of a recording, before anything of it compiles.

A recording (:mod:`reference.grader.speed_record`) is the student code's word. This module
decides whether the trusted timing process (:mod:`reference.grader.speed_replay`) may compile
and launch it: at most :data:`MAX_LAUNCHES` launches of ``extern "C"`` kernels in ``.cu`` files
of the graded implementation's own folder or its lab's, whose ``#include`` lines stay inside the
workbook's and the toolkit's headers; ``-D`` options (and a few harmless flags) only; grids,
blocks and shared memory within CUDA's limits; arguments that name an input, a scratch buffer,
null, a scalar or a TMA map of a cache; scratch within :data:`MAX_SCRATCH_BYTES`.
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

_OPTION_RE = re.compile(r"-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.:+-]*)?")
_OPTIONS_ALLOWED = frozenset({"-lineinfo", "--use_fast_math", "-use_fast_math"})
_ARG_KINDS = {"in": 3, "scratch": 3, "null": 1, "i32": 2, "i64": 2, "f32": 2, "tmap": 3,
              "tmap_rows": 3}
#: Inputs a TMA map may describe (the paged caches), and its largest box (TMA's limit).
TMAP_INPUTS = ("key_cache", "value_cache")
MAX_BOX_ROWS = 256


class SpeedRecordingError(ValueError):
    """A recorded stage that the trusted side will not replay (the stage scores 0)."""


def allowed_dirs(lab: str) -> tuple[Path, ...]:
    """Folders whose ``.cu`` files a recording of ``lab`` may name: the graded implementation's
    own (the lab folder for the starter, ``solutions/<lab>`` or a mutant's copy) and the lab's."""
    from reference.loader import MUTANT_DIR_ENV, impl_file

    mutant = os.environ.get(MUTANT_DIR_ENV)
    own = Path(mutant) if mutant else impl_file(lab).parent
    return tuple({own.resolve(), (LABS_DIR / lab).resolve()})


#: Largest file check_includes reads.
MAX_SOURCE_BYTES = 8 << 20
#: Input names a recording's pointers may name (what ``speed_record.build_inputs`` makes).
INPUT_NAMES = ("query", "key_cache", "value_cache", "block_tables", "cu_seqlens_q",
               "context_lens", "out")


def check_recording(recording, lab: str, dirs: tuple[Path, ...] | None = None,
                    files: tuple[str, ...] | None = None) -> dict:
    """Checks an untrusted recording before anything of it is compiled or launched.

    Args:
        recording: what :func:`reference.grader.speed_record.record` returned (any value).
        lab: the stage's lab.
        dirs: folders the kernel files must be in (default :func:`allowed_dirs`).
        files: the kernel file names the stage may launch (None: any ``.cu`` there).

    Returns:
        A new recording built from the checked fields only (paths resolved).

    Raises:
        SpeedRecordingError: naming what is wrong.
    """
    try:
        return _check_recording(recording, dirs or allowed_dirs(lab), files)
    except SpeedRecordingError:
        raise
    except (TypeError, ValueError, OSError, KeyError, IndexError, AttributeError) as exc:
        # NOTE: a malformed value the checks above did not foresee is refused, never a crash.
        raise SpeedRecordingError(f"a malformed recording ({type(exc).__name__})") from None


def _check_recording(recording, dirs: tuple[Path, ...], files) -> dict:
    if not isinstance(recording, dict):
        raise SpeedRecordingError(f"the recording is a {type(recording).__name__}, not a dict")
    if "error" in recording:
        raise SpeedRecordingError(str(recording["error"])[:500])
    inputs, scratch, launches = (recording.get(k) for k in ("inputs", "scratch", "launches"))
    if not (isinstance(inputs, list) and isinstance(scratch, list) and isinstance(launches, list)):
        raise SpeedRecordingError("the recording needs lists 'inputs', 'scratch', 'launches'")
    inputs = [name for name in inputs if isinstance(name, str) and name in INPUT_NAMES]
    if not 1 <= len(launches) <= MAX_LAUNCHES:
        raise SpeedRecordingError(f"{len(launches)} launches recorded; a stage may make 1 to "
                                  f"{MAX_LAUNCHES}")
    total = content_total = 0
    checked_scratch = []
    for s in scratch:
        if not (isinstance(s, dict) and _is_int(s.get("nbytes")) and s["nbytes"] > 0):
            raise SpeedRecordingError("a scratch buffer needs a positive 'nbytes'")
        content = s.get("content")
        if content is not None and (not isinstance(content, str)
                                    or len(content) != 2 * s["nbytes"]):
            raise SpeedRecordingError("a scratch buffer's content must be hex of its nbytes")
        bytes.fromhex(content or "")  # NOTE: hex only (a ValueError otherwise)
        total += s["nbytes"]
        content_total += s["nbytes"] if content is not None else 0
        checked_scratch.append({"nbytes": s["nbytes"], "content": content})
    if total > MAX_SCRATCH_BYTES or content_total > MAX_CONTENT_BYTES:
        raise SpeedRecordingError(f"{total} bytes of scratch ({content_total} with content); at "
                                  f"most {MAX_SCRATCH_BYTES} ({MAX_CONTENT_BYTES})")
    checked = [_check_launch(launch, inputs, len(scratch), dirs) for launch in launches]
    if files is not None:
        for launch in checked:
            if Path(launch["path"]).name not in files:
                raise SpeedRecordingError(f"{Path(launch['path']).name} is not this stage's "
                                          f"kernel file ({', '.join(files)})")
    for folder in sorted(dirs):  # the kernels' folders, and the lab's headers they include
        check_includes(folder)
    return {"inputs": inputs, "scratch": checked_scratch, "launches": checked}


#: Any preprocessor line that reads another file, however spelled (``#``, the ``%:`` digraph;
#: include, include_next, import, embed).
_READS_FILE_RE = re.compile(r"^[ \t]*(?:#|%:)[ \t]*(include(?:_next)?|import|embed)\b(.*)$",
                            re.M)


def check_includes(folder: Path) -> None:
    """Refuses kernel sources that could make the compiler read a file outside the workbook's
    folders.

    Every file under ``folder`` (any name: a ``.inc`` can be included too) may ``#include``
    ``<name>`` or ``"name"`` by a relative path free of ``..`` — the file's folder, its lab's,
    the workbook's ``reference/include`` and the CUDA toolkit's headers are all the compiler
    searches — and nothing else (``include_next``, ``import``, ``embed``, a macro). Comments are
    not skipped: an include inside one is refused too. Symbolic links are refused. NOTE: an
    absolute or ``..`` path could compile another kernel (a library's headers on the grading
    machine) as the student's, or echo a file the grader can read in a compiler message.

    Raises:
        SpeedRecordingError: naming the file and the line.
    """
    for source in sorted(folder.rglob("*")):
        if source.is_symlink():
            raise SpeedRecordingError(f"{source.name}: a symbolic link (kernel sources must be "
                                      "plain files)")
        if not source.is_file() or "__pycache__" in source.parts:
            continue
        if source.stat().st_size > MAX_SOURCE_BYTES:
            raise SpeedRecordingError(f"{source.name}: over {MAX_SOURCE_BYTES >> 20} MiB, too "
                                      "large to check (kernel folders hold sources)")
        text = source.read_text(errors="replace").replace("\\\n", "").replace("\\\r\n", "")
        for match in _READS_FILE_RE.finditer(text):
            directive, target = match.group(1), match.group(2).split("//")[0].strip()
            name = target[1:-1] if len(target) > 2 and (target[0], target[-1]) in (
                ("<", ">"), ('"', '"')) else None
            if (directive != "include" or name is None or name.startswith(("/", "\\"))
                    or ".." in Path(name).parts or ":" in name):
                raise SpeedRecordingError(f"{source.name}: #{directive} {target} — only "
                                          "#include of relative header names without '..' is "
                                          "compiled for speed")


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
        if kind in ("tmap", "tmap_rows") and not (arg[1] in inputs and arg[1] in TMAP_INPUTS
                                   and _is_int(arg[2]) and 1 <= arg[2] <= MAX_BOX_ROWS):
            raise SpeedRecordingError(f"argument {arg!r} is not a tensor map of a cache with "
                                      f"1..{MAX_BOX_ROWS} rows a box")
        if kind in ("i32", "i64") and not _is_int(arg[1]):
            raise SpeedRecordingError(f"argument {arg!r} is not an integer")
        if kind == "f32" and not isinstance(arg[1], (int, float)):
            raise SpeedRecordingError(f"argument {arg!r} is not a number")
    # Rebuilt from the checked fields only: nothing unchecked reaches the timing process.
    return {"path": str(resolved), "name": name, "options": list(options),
            "backend": launch["backend"], "grid": list(grid), "block": list(block),
            "shared_mem": smem, "args": [list(arg) for arg in args]}
