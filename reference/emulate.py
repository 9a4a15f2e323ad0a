"""The emulated device: the labs' own ``.cu`` kernels, compiled with g++, run on the CPU.

``PAGEDLAB_DEVICE=emulate`` (or ``with emulation():``) makes :mod:`reference.cuda` compile
kernels here instead of with CuPy, and accept CPU torch tensors where a launcher wants CUDA
ones. The launcher path is the GPU's (validate -> plan -> launch -> reduce); only the last
step differs. How the engine works, and why, is the comment at the top of
``reference/include/emulate/pagedlab_emu.h``.

Compilation (cached per source digest and options under ``~/.cache/pagedlab-emu/``):

    g++ -E  -include pagedlab_emu.h -DPAGEDLAB_EMULATE   (the kernel file, its headers)
    -> rewrite every ``__shared__`` declaration into per-block arena storage
    -> append one trampoline per ``extern "C"`` kernel
    -> g++ -O2 -std=c++17 -fPIC -shared  -> a .so loaded with ctypes

Launching copies every array argument into memory fenced by guard pages (see the header; arrays
of 256 MiB or more are paged in lazily instead), runs the grid block by block, and copies the
arrays back. Errors a GPU cannot give are raised as
:class:`~reference.errors.KernelOutOfBoundsError` and
:class:`~reference.errors.KernelDeadlockError`. :func:`racecheck` runs launches under the
emulator's shared-memory race detector (compute-sanitizer racecheck's counterpart).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reference.errors import (KernelDeadlockError, KernelFaultError, KernelOutOfBoundsError,
                              KernelTimeoutError, UnsupportedConfigError)

#: ``PAGEDLAB_DEVICE=emulate`` selects the emulated device; anything else (or unset) the GPU.
DEVICE_ENV = "PAGEDLAB_DEVICE"
#: Where compiled kernels are cached (one folder per source digest and options).
CACHE_ENV = "PAGEDLAB_EMU_CACHE"
#: The emulated device's streaming-multiprocessor count (split-K plans size the grid with it).
NUM_SMS = 8
#: The engine and the stand-in CUDA headers.
EMU_INCLUDE_DIR = Path(__file__).resolve().parent / "include" / "emulate"
ENGINE_HEADER = EMU_INCLUDE_DIR / "pagedlab_emu.h"
RUNTIME_SOURCE = EMU_INCLUDE_DIR / "pagedlab_emu_runtime.cc"
CXX = os.environ.get("CXX", "g++")
#: Kernel files compile at -O2: with the engine compiled separately (once, also -O2) a kernel
#: configuration takes under half a second of CPU, and compute-heavy kernels (Lab 5's tiled one)
#: run ~10x faster than at -O0. PAGEDLAB_EMU_OPT overrides (e.g. -O0 -g for gdb).
#: NOTE: kernels reinterpret half arrays as uint4 and wrap 32-bit offsets as the GPU does:
#: -fno-strict-aliasing and -fwrapv keep g++'s optimiser from treating either as undefined.
CXX_FLAGS = (os.environ.get("PAGEDLAB_EMU_OPT", "-O2"), "-std=c++17", "-fPIC", "-shared",
             "-fvisibility=hidden", "-fno-strict-aliasing", "-fwrapv", "-Wno-unknown-pragmas",
             "-Wno-attributes")
#: The racecheck twin of a kernel library: g++'s ThreadSanitizer instrumentation (a call before
#: every load and store, which the engine's race detector answers; libtsan itself is never
#: linked) and line tables, so that a hazard names its source lines.
RACECHECK_FLAGS = ("-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0", "-g1")
RUNTIME_FLAGS = ("-O2", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-c")

_forced: list[bool] = []


def emulating() -> bool:
    """True when kernels run on the emulated device (``PAGEDLAB_DEVICE=emulate`` or inside
    :func:`emulation`)."""
    if _forced:
        return _forced[-1]
    return os.environ.get(DEVICE_ENV, "").strip().lower() == "emulate"


@contextlib.contextmanager
def emulation(on: bool = True):
    """Turns the emulated device on (or off) inside a ``with`` block."""
    _forced.append(on)
    try:
        yield
    finally:
        _forced.pop()


#: The compute capability the emulated device reports to reference.cuda.check_hopper (it models
#: Hopper's wgmma and TMA too). NOTE: only the Hopper check reads it; the sm_80 features
#: (mma.sync, ldmatrix, cp.async) are always modelled.
EMULATED_CAPABILITY = (9, 0)
_capability: list = []


#: The capability the isolated grader's worker reports, as the test's process forwards it
#: (``"8.0"``; reference.grader.proxy): what emulated_capability set there.
CAPABILITY_ENV = "PAGEDLAB_EMU_CAPABILITY"


def capability() -> tuple[int, int]:
    """The compute capability the emulated device reports: :data:`EMULATED_CAPABILITY`, or the
    one :func:`emulated_capability` set (or, in an isolated grader's worker, forwarded)."""
    if _capability:
        return _capability[-1]
    forwarded = os.environ.get(CAPABILITY_ENV, "")
    if forwarded:
        major, minor = forwarded.split(".")
        return int(major), int(minor)
    return EMULATED_CAPABILITY


@contextlib.contextmanager
def emulated_capability(major: int, minor: int):
    """Makes the emulated device report another compute capability to the Hopper check inside a
    ``with`` block: a test of what a launcher does on a GPU without Hopper's wgmma runs on a CPU."""
    _capability.append((int(major), int(minor)))
    try:
        yield
    finally:
        _capability.pop()


def cache_dir() -> Path:
    """Returns the folder compiled kernels are cached in."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pagedlab-emu"


# ----------------------------------------------------------------------------- source rewriting

_SHARED_RE = re.compile(r"(\bextern\s+)?\b__shared__\b([^;{}]*);")
_ALIGN_RE = re.compile(r"__attribute__\s*\(\(\s*aligned\s*\(\s*(\d+)\s*\)\s*\)\)|alignas\s*\(\s*(\d+)\s*\)")
_DECL_RE = re.compile(r"^(.*?)\b([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)$", re.S)
_KERNEL_RE = re.compile(r'extern\s+"C"\s+__pl_global__\s+void\s+([A-Za-z_]\w*)\s*\(')


def _split_top(text: str, sep: str = ",", brackets: str = "([{<") -> list[str]:
    """Splits at ``sep`` outside brackets (and string literals)."""
    closing = {"(": ")", "[": "]", "{": "}", "<": ">"}
    opens, closes = set(brackets), {closing[b] for b in brackets}
    parts, depth, start, in_str = [], 0, 0, False
    for i, ch in enumerate(text):
        if ch == '"' and (i == 0 or text[i - 1] != "\\"):
            in_str = not in_str
        elif in_str:
            continue
        elif ch in opens:
            depth += 1
        elif ch in closes:
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in (q.strip() for q in parts) if p]


class _SharedRewriter:
    """Turns ``__shared__`` declarations into references to the block's shared arena."""

    def __init__(self):
        self.count = 0

    def __call__(self, m: re.Match) -> str:
        is_extern, body = m.group(1), m.group(2)
        newlines = m.group(0).count("\n")
        align = max([int(a or b) for a, b in _ALIGN_RE.findall(body)] or [16])
        body = _ALIGN_RE.sub(" ", body).strip()
        decls = _split_top(body)
        first = _DECL_RE.match(decls[0])
        if not first:
            raise ValueError(f"cannot read the __shared__ declaration {m.group(0)!r}")
        base_type = first.group(1).strip()
        out = []
        for k, decl in enumerate(decls):
            d = _DECL_RE.match(decl)
            name, dims = d.group(2), d.group(3).replace(" ", "")
            ptr_part = d.group(1).strip() if k else ""  # `*` of a later declarator
            typ = f"{base_type} {ptr_part}".strip()
            if is_extern:
                out.append(f"{typ}* const {name} = reinterpret_cast<{typ}*>("
                           f"::pagedlab_emu::dynamic_shared());")
            else:
                alias = f"__pl_shared_t{self.count}"
                out.append(f"typedef {typ} {alias}{dims}; {alias}& {name} = "
                           f"*reinterpret_cast<{alias}*>(::pagedlab_emu::static_shared("
                           f"{self.count}, sizeof({alias}), {align}, \"{name}\"));")
            self.count += 1
        return " ".join(out) + "\n" * newlines


def _close_paren(text: str, open_paren: int) -> int:
    """Index of the parenthesis closing the one at ``open_paren`` (string literals skipped)."""
    depth, i, in_str = 0, open_paren, False
    while True:
        ch = text[i]
        if ch == '"' and text[i - 1] != "\\":
            in_str = not in_str
        elif not in_str and ch == "(":
            depth += 1
        elif not in_str and ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1


_ASM_RE = re.compile(r"\b(?:asm|__asm__)\s*(?:volatile|__volatile__)?\s*\(")
_MMA_RE = re.compile(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(f16|bf16)\.\1\.f32\s*"
                     r"\{([^}]*)\}\s*,\s*\{([^}]*)\}\s*,\s*\{([^}]*)\}\s*,\s*\{([^}]*)\}")
_EX2_RE = re.compile(r"ex2\.approx(?:\.ftz)?\.f32\s+%(\d+)\s*,\s*%(\d+)")


def _asm_operand(op: str) -> str:
    m = re.match(r'\s*(?:\[\w+\]\s*)?"[^"]*"\s*\((.*)\)\s*$', op, re.S)
    if not m:
        raise ValueError(f"cannot read the inline-asm operand {op!r}")
    return f"({m.group(1)})"


def _translate_asm(stmt: str) -> str:
    """C++ for one inline-PTX statement the kernels use (mma.sync m16n8k16, ex2.approx); any
    other instruction becomes a compile error that names it."""
    inner = stmt[stmt.index("(") + 1: stmt.rindex(")")]
    parts = _split_top(inner, ":", "([{")
    ptx = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', parts[0])).replace("\\n", " ")
    ptx = ptx.replace("\\t", " ")
    ops = [_asm_operand(o) for p in parts[1:3] for o in _split_top(p, ",", "([{")]
    ref = lambda tok: ops[int(tok.strip().lstrip("%"))]  # noqa: E731
    m = _MMA_RE.search(ptx)
    if m:
        d, a, b, c = ([ref(t) for t in g.split(",")] for g in m.groups()[1:])
        bf16 = "true" if m.group(1) == "bf16" else "false"
        return ("{ float __pl_c[4] = {" + ", ".join(c) + "}; unsigned __pl_a[4] = {" +
                ", ".join(f"(unsigned){x}" for x in a) + "}; ::pagedlab_emu::mma_16816<" + bf16 +
                f">(__pl_c, __pl_a, {b[0]}, {b[1]}, 0); " +
                " ".join(f"{x} = __pl_c[{i}];" for i, x in enumerate(d)) + " }")
    m = _EX2_RE.search(ptx)
    if m:
        return f"{ref(m.group(1))} = exp2f({ref(m.group(2))});"
    what = ptx.strip().split(";")[0][:80].replace('"', "'")
    return (f'static_assert(sizeof(int) == 0, "emulated device: no emulation for the inline PTX '
            f"'{what}' (the emulator knows mma.sync m16n8k16 and ex2.approx; use the wrappers "
            'of pagedlab_ptx.cuh)");')


_LINE_MARKER_RE = re.compile(r'^# \d+ "([^"]*)"[^\n]*$', re.M)


def _rewrite_asm(src: str, user_dirs: tuple[str, ...]) -> str:
    """Translates inline asm in the parts of ``src`` that come from the kernel's own files
    (system headers and the engine keep theirs)."""
    out, pos, user = [], 0, False
    for m in _LINE_MARKER_RE.finditer(src):
        seg = src[pos: m.start()]
        out.append(_rewrite_asm_segment(seg) if user else seg)
        pos = m.start()
        f = m.group(1)
        user = f.startswith(user_dirs) and not f.startswith(str(EMU_INCLUDE_DIR))
    seg = src[pos:]
    out.append(_rewrite_asm_segment(seg) if user else seg)
    return "".join(out)


def _rewrite_asm_segment(src: str) -> str:
    out, pos = [], 0
    for m in _ASM_RE.finditer(src):
        if m.start() < pos:
            continue
        end = _close_paren(src, m.end() - 1)
        semi = src.index(";", end)
        stmt = src[m.start(): semi + 1]
        out.append(src[pos: m.start()])
        out.append(_translate_asm(stmt) + "\n" * stmt.count("\n"))
        pos = semi + 1
    out.append(src[pos:])
    return "".join(out)


def _param_names(text: str, open_paren: int) -> list[str]:
    i = _close_paren(text, open_paren)
    names = []
    for p in _split_top(text[open_paren + 1:i]):
        m = re.search(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$", p)
        names.append(m.group(1) if m and m.group(1) not in ("void",) else f"arg{len(names)}")
    return names


def rewrite(preprocessed: str, user_dirs: tuple[str, ...] = ("/",)) -> tuple[str, dict[str, list[str]]]:
    """Rewrites g++ -E output for the emulator.

    Args:
        preprocessed: the kernel file after ``g++ -E`` with the engine header forced in.
        user_dirs: folders of the kernel's own sources (their inline PTX is translated).

    Returns:
        ``(source, kernels)``: the compilable source (trampolines appended) and, per
        ``extern "C"`` kernel, its parameter names.
    """
    src = _SHARED_RE.sub(_SharedRewriter(), preprocessed)
    src = _rewrite_asm(src, user_dirs)
    kernels = {}
    for m in _KERNEL_RE.finditer(src):
        kernels[m.group(1)] = _param_names(src, m.end() - 1)
    src = src.replace("__pl_global__", "")
    table = ",\n".join(
        f'  {{"{k}", &::pagedlab_emu::Kernel<decltype(&{k}), &{k}>::call, '
        f"&::pagedlab_emu::Kernel<decltype(&{k}), &{k}>::describe}}" for k in kernels)
    src += ("\n// ---- emulate.py: kernel table\n"
            f"static const ::pagedlab_emu::KernelEntry __pl_kernel_table[] = {{\n{table}\n}};\n"
            'extern "C" __attribute__((visibility("default"))) const ::pagedlab_emu::KernelEntry* '
            "pagedlab_emu_kernels(int* n) {\n"
            f"  *n = {len(kernels)};\n  return __pl_kernel_table;\n}}\n")
    return src, kernels


# ----------------------------------------------------------------------------- compiling


class _ParamInfo(ctypes.Structure):
    _fields_ = [("is_pointer", ctypes.c_int), ("is_const", ctypes.c_int),
                ("elem_size", ctypes.c_int), ("size", ctypes.c_int), ("is_float", ctypes.c_int),
                ("is_signed", ctypes.c_int)]


class _KernelEntry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("call", ctypes.c_void_p),
                ("describe", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_ParamInfo),
                                              ctypes.c_int))]


class _BufferArg(ctypes.Structure):
    _fields_ = [("host", ctypes.c_uint64), ("nbytes", ctypes.c_uint64),
                ("elem_size", ctypes.c_int), ("is_const", ctypes.c_int),
                ("name", ctypes.c_char_p)]


class _KernelArg(ctypes.Structure):
    _fields_ = [("value", ctypes.c_uint64), ("kind", ctypes.c_int), ("buf", ctypes.c_int)]


class EmulatorCompileError(RuntimeError):
    """g++ rejected a kernel file (the message holds the compiler's first errors)."""


@functools.lru_cache(maxsize=1)
def _compiler_version() -> str:
    try:
        return subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise EmulatorCompileError(f"the emulated device needs a C++ compiler: {CXX} not found "
                                   "(install g++, or set CXX)") from None


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln] or lines
        raise EmulatorCompileError(f"{what} failed (emulated device):\n" + "\n".join(errors[:20]))
    return proc.stdout


def _engine_digest() -> str:
    h = hashlib.sha256()
    for f in sorted(EMU_INCLUDE_DIR.iterdir()):
        if f.suffix in (".h", ".cc"):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    h.update(_compiler_version().encode())
    h.update(repr(RUNTIME_FLAGS).encode())
    return h.hexdigest()[:20]


def runtime_object() -> Path:
    """The engine compiled once (cached per engine source and compiler): every kernel links it.

    Raises:
        EmulatorCompileError: g++ is missing or rejects the engine.
    """
    out = cache_dir() / f"runtime-{_engine_digest()}.o"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".runtime-", suffix=".o", dir=out.parent)
    os.close(fd)
    try:
        _run([CXX, *RUNTIME_FLAGS, f"-I{EMU_INCLUDE_DIR}", str(RUNTIME_SOURCE), "-o", tmp],
             "compiling the emulator's engine")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _digest(cu_path: Path, defines: tuple[str, ...], include_dirs: tuple[Path, ...]) -> str:
    h = hashlib.sha256()
    files = [cu_path, RUNTIME_SOURCE] + [h for d in include_dirs for h in sorted(d.glob("*.cuh"))]
    files += sorted(EMU_INCLUDE_DIR.glob("*.h"))
    for f in files:
        h.update(str(f.name).encode())
        h.update(f.read_bytes())
    h.update(repr(defines).encode())
    h.update(repr(CXX_FLAGS).encode())
    h.update(_compiler_version().encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:20]


def compile_kernel_file(cu_path: str | Path, options: tuple[str, ...] = (),
                        include_dir: Path | None = None, *, racecheck: bool = False) -> Path:
    """Compiles a ``.cu`` file for the emulated device (cached); returns the ``.so`` path.

    Args:
        cu_path: the kernel file; ``#include "x.cuh"`` resolves against its folder, then its
            lab's (:func:`reference.cuda.kernel_include_dirs`), then ``include_dir``.
        options: compiler options; ``-D`` / ``-U`` ones are used, the rest (``-std``,
            ``-I``, GPU flags) are the GPU compiler's business.
        include_dir: the workbook's shared headers (``reference/include``).
        racecheck: build the racecheck twin: every load and store of the kernel code calls the
            engine's shared-memory race detector (see :func:`racecheck`); slower, so only
            launches inside ``with racecheck():`` use it.

    Raises:
        EmulatorCompileError: g++ is missing, or rejects the source.
    """
    from reference.cuda import INCLUDE_DIR, kernel_include_dirs

    path = Path(cu_path).resolve()
    include_dir = include_dir or INCLUDE_DIR
    # The kernel's folder, its lab's folder (a solution includes the lab's given headers), then
    # the workbook's shared headers: the order the GPU compile uses too.
    dirs = tuple(dict.fromkeys((path.parent, *kernel_include_dirs(path), include_dir)))
    defines = tuple(o for o in options if o.startswith(("-D", "-U")))
    key = _digest(path, defines, dirs) + ("-race" if racecheck else "")
    out_dir = cache_dir() / key
    so = out_dir / f"{path.stem}.so"
    if so.exists():
        return so
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=out_dir.parent))
    try:
        pre = _run([CXX, "-E", "-std=c++17", "-DPAGEDLAB_EMULATE=1", "-include", str(ENGINE_HEADER),
                    f"-I{EMU_INCLUDE_DIR}", *(f"-I{d}" for d in dirs), *defines,
                    "-x", "c++", str(path)], f"preprocessing {path.name}")
        source, kernels = rewrite(pre, tuple(str(d) for d in dirs))
        (tmp / f"{path.stem}.ii").write_text(source)
        (tmp / "kernels.txt").write_text(
            "\n".join(f"{k} {' '.join(v)}" for k, v in kernels.items()) + "\n")
        if racecheck:
            # Compile with the access hooks, then link without libtsan: the engine defines them.
            obj = tmp / f"{path.stem}.o"
            _run([CXX, *(f for f in CXX_FLAGS if f != "-shared"), *RACECHECK_FLAGS, "-c",
                  "-x", "c++-cpp-output", str(tmp / f"{path.stem}.ii"), "-o", str(obj)],
                 f"compiling {path.name} for racecheck")
            _run([CXX, "-shared", str(obj), str(runtime_object()), "-o", str(tmp / so.name)],
                 f"linking {path.name} for racecheck")
        else:
            _run([CXX, *CXX_FLAGS, "-x", "c++-cpp-output", str(tmp / f"{path.stem}.ii"),
                  "-x", "none", str(runtime_object()), "-o", str(tmp / so.name)],
                 f"compiling {path.name}")
        try:
            tmp.rename(out_dir)
        except OSError:  # another process finished first: use its copy
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return so


class EmulatedKernel:
    """One ``extern "C"`` kernel of an emulated module (what ``get_function`` returns).

    Attributes:
        name: the kernel's name.
        param_names: its parameters' names, in order (they name arrays in error messages).
        params: ctypes descriptions of the parameters' types.
        max_dynamic_shared_size_bytes: accepted and ignored (the emulated device's limit is
            fixed), like the CuPy attribute the launcher raises.
    """

    def __init__(self, module: "EmulatedModule", entry: _KernelEntry, param_names: list[str]):
        self.module = module
        self.name = entry.name.decode()
        self._entry = entry
        infos = (_ParamInfo * 64)()
        n = entry.describe(infos, 64)
        self.params = [infos[i] for i in range(n)]
        self.param_names = (param_names if len(param_names) == n
                            else [f"arg{i}" for i in range(n)])
        self.max_dynamic_shared_size_bytes = 0

    def __repr__(self):
        return f"<EmulatedKernel {self.name} of {self.module.path.name}>"

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        """Launches the kernel the way a ``cupy.RawKernel`` call does: on CuPy's current
        stream, which is not torch's (see :data:`DEFAULT_STREAM`).

        Args:
            grid, block, args, shared_mem: as for :func:`launch`.
        """
        launch(self, grid, block, args, shared_mem, stream=DEFAULT_STREAM)


class EmulatedModule:
    """A compiled kernel file for the emulated device (CuPy RawModule's stand-in)."""

    def __init__(self, so_path: Path):
        self.path = so_path
        self._lib = ctypes.CDLL(str(so_path))
        self._lib.pagedlab_emu_kernels.restype = ctypes.POINTER(_KernelEntry)
        self._lib.pagedlab_emu_kernels.argtypes = [ctypes.POINTER(ctypes.c_int)]
        run = self._lib.pagedlab_emu_run
        run.restype = ctypes.c_int
        run.argtypes = [ctypes.POINTER(_KernelEntry), ctypes.POINTER(ctypes.c_uint),
                        ctypes.POINTER(ctypes.c_uint), ctypes.c_uint64, ctypes.c_int,
                        ctypes.POINTER(_BufferArg), ctypes.c_int, ctypes.POINTER(_KernelArg),
                        ctypes.c_char_p, ctypes.c_int]
        self._run = run
        n = ctypes.c_int()
        table = self._lib.pagedlab_emu_kernels(ctypes.byref(n))
        names = {}
        for line in (so_path.parent / "kernels.txt").read_text().splitlines():
            if line.strip():
                k, *params = line.split()
                names[k] = params
        self._entries = {table[i].name.decode(): ctypes.pointer(table[i]) for i in range(n.value)}
        self._names = names
        self._kernels: dict[str, EmulatedKernel] = {}
        #: ``(cu_path, options)`` it was built from (set by :func:`load_module`).
        self.source: tuple[str, tuple[str, ...]] | None = None

    def racecheck_twin(self) -> "EmulatedModule":
        """The same kernel file built for racecheck (compiled on first use, cached).

        Raises:
            EmulatorCompileError: g++ rejected the instrumented build.
        """
        if self.source is None:
            raise RuntimeError(f"{self.path.name}: racecheck needs a module from load_module()")
        cu_path, options = self.source
        twin = _load(str(compile_kernel_file(cu_path, options, racecheck=True)))
        twin.source = self.source
        twin._lib.pagedlab_emu_set_racecheck.argtypes = [ctypes.c_int]
        twin._lib.pagedlab_emu_race_report.restype = ctypes.c_longlong
        twin._lib.pagedlab_emu_race_report.argtypes = [ctypes.c_char_p, ctypes.c_int]
        return twin

    def get_function(self, name: str) -> EmulatedKernel:
        """Returns the kernel ``name``.

        Raises:
            KeyError: no ``extern "C" __global__`` kernel of that name in the file.
        """
        if name not in self._kernels:
            if name not in self._entries:
                raise KeyError(f"{self.path.stem}.cu has no extern \"C\" __global__ kernel "
                               f"named {name!r}; it has {sorted(self._entries)}")
            entry = self._entries[name]
            self._kernels[name] = EmulatedKernel(self, entry.contents, self._names.get(name, []))
        return self._kernels[name]


@functools.lru_cache(maxsize=None)
def _load(so_path: str) -> EmulatedModule:
    return EmulatedModule(Path(so_path))


def load_module(cu_path: str | Path, *, options: tuple[str, ...] = (),
                name_expressions: tuple[str, ...] | None = None) -> EmulatedModule:
    """Compiles (cached) and loads a ``.cu`` file for the emulated device.

    Args:
        cu_path: the kernel file.
        options: compiler options (``-D`` ones are used).
        name_expressions: unsupported (template kernels): must be None.

    Returns:
        An :class:`EmulatedModule`.

    Raises:
        UnsupportedConfigError: ``name_expressions`` given.
        EmulatorCompileError: g++ rejected the file.
    """
    if name_expressions:
        raise UnsupportedConfigError("the emulated device runs extern \"C\" kernels only, not "
                                     f"template instantiations {name_expressions}")
    module = _load(str(compile_kernel_file(cu_path, tuple(options))))
    module.source = (str(cu_path), tuple(options))
    return module


# ----------------------------------------------------------------------------- launching


class HostArray:
    """A kernel argument array on the host: what :func:`reference.cuda.ptr` returns for a CPU
    tensor or NumPy array under emulation (the extent lets the engine fence the array).

    Attributes:
        obj: the tensor or array (kept alive until the launch is done).
        address: its first byte.
        nbytes: bytes from the first to one past the last element.
        itemsize: bytes per element.
    """

    def __init__(self, x):
        self.obj = x
        if hasattr(x, "data_ptr"):
            self.address = int(x.data_ptr())
            self.itemsize = int(x.element_size())
            if x.numel() == 0:
                self.nbytes = 0
            else:
                span = sum((s - 1) * st for s, st in zip(x.shape, x.stride()) if s > 0) + 1
                self.nbytes = span * self.itemsize
        else:
            arr = np.asarray(x)
            self.address = int(arr.ctypes.data)
            self.itemsize = arr.itemsize
            self.nbytes = arr.nbytes

    def __repr__(self):
        return f"HostArray(0x{self.address:x}, {self.nbytes} bytes)"


def is_emulated(kernel) -> bool:
    """True for a kernel of the emulated device."""
    return isinstance(kernel, EmulatedKernel)


def _struct_bytes(kernel: EmulatedKernel, i: int, value) -> bytes:
    """The bytes of a by-value struct argument: a :class:`reference.tma.TensorMap` (encoded
    for the emulated device) or anything of exactly the parameter's size (a NumPy scalar)."""
    from reference.tma import TensorMap

    p, name = kernel.params[i], kernel.param_names[i]
    raw = value.value.tobytes() if isinstance(value, TensorMap) else (
        value.tobytes() if hasattr(value, "tobytes") else None)
    if raw is None or len(raw) != p.size:
        got = f"{len(raw)} bytes" if raw is not None else type(value).__name__
        raise TypeError(f"kernel {kernel.name}, parameter {i} ({name}) is a {p.size}-byte "
                        f"struct passed by value but got {got}")
    return raw


def _scalar_bits(kernel: EmulatedKernel, i: int, value) -> int:
    p, name = kernel.params[i], kernel.param_names[i]
    where = f"kernel {kernel.name}, parameter {i} ({name})"
    # NOTE: CuPy passes a Python float as a double (8 bytes) and a Python int as a 64-bit
    # integer, whatever the kernel's parameter: into a 4-byte int or float the GPU reads
    # garbage (and every later argument shifted). Refused here as well, so a launcher that
    # passes float(scale) fails emulated too, not only on a GPU.
    if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
        size, is_float = (1, False) if isinstance(value, bool) else (8, isinstance(value, float))
        if size != p.size or is_float != p.is_float:
            kind = "np.float32" if p.is_float and p.size == 4 else (
                "np.int32" if p.size == 4 else f"a NumPy scalar of {p.size} bytes")
            raise TypeError(f"{where} takes {p.size} bytes but got a Python "
                            f"{type(value).__name__} {value!r}, which CuPy passes as "
                            f"{size} bytes: the kernel would read garbage; pass {kind}(...)")
    if isinstance(value, (np.floating, float)) and not p.is_float:
        raise TypeError(f"{where} is an integer of {p.size} bytes but got "
                        f"{type(value).__name__} {value!r}: the kernel would read its bits as "
                        "an integer")
    if isinstance(value, (np.integer, int, bool)) and p.is_float:
        if isinstance(value, np.integer):
            raise TypeError(f"{where} is a float of {p.size} bytes but got "
                            f"{type(value).__name__} {value!r}: pass np.float32(...)")
    if isinstance(value, np.generic) and value.dtype.itemsize != p.size:
        raise TypeError(f"{where} takes {p.size} bytes but got {value.dtype} "
                        f"({value.dtype.itemsize} bytes): on the GPU the kernel would read "
                        "garbage")
    if p.is_float:
        dtype = np.float32 if p.size == 4 else np.float64
    else:
        dtype = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[p.size]
        if not p.is_signed:
            dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[p.size]
    raw = np.array([value]).astype(dtype).tobytes()
    return int.from_bytes(raw.ljust(8, b"\0"), "little")


#: The stream a launch through :func:`reference.cuda.launch` goes to: torch's current stream.
TORCH_STREAM = "torch's current stream"
#: The stream a direct kernel call goes to: CuPy's current stream, the legacy default stream
#: unless CuPy was told otherwise. On the GPU such a launch does not wait for work queued on
#: torch's side stream; the emulator runs every launch at once, so it only records the stream.
DEFAULT_STREAM = "CuPy's current stream (the legacy default stream)"
_stream_logs: list[list[tuple[str, str]]] = []

# ----------------------------------------------------------------------------- isolated grading
# Graded isolated, kernels run in the worker (reference.grader.proxy), the student's process:
# what a test records around them (streams, racecheck) must be recorded there. Each live
# worker client registers here; a recording block asks each to begin, then for its data.
# NOTE: a racecheck verdict recorded in the worker is the student's process's word (the
# kernels run there): the threat model lists it.
_remotes: list = []


def _begin_remotes(kind: str) -> list:
    started = []
    for remote in list(_remotes):
        try:
            remote.emulate_begin(kind)
            started.append(remote)
        except Exception:  # noqa: BLE001 — a dead worker records nothing; its test fails anyway
            pass
    return started


def _end_remotes(remotes: list, kind: str) -> list:
    out = []
    for remote in remotes:
        try:
            out.append(remote.emulate_end(kind))
        except Exception:  # noqa: BLE001
            pass
    return out


def worker_recording(kind: str):
    """The worker's side of a test's recording block: a context manager that yields a function
    returning what it recorded, as plain data (reference.grader.worker).

    Args:
        kind: ``"racecheck"`` or ``"streams"``.
    """
    if kind == "streams":
        cm = recorded_streams()
        log = cm.__enter__()
        return cm, lambda: [[name, stream] for name, stream in log]
    if kind == "racecheck":
        cm = racecheck()
        report = cm.__enter__()
        return cm, lambda: {"launches": report.launches, "seconds": report.seconds,
                            "hazards": [[h.kernel, h.kind, h.count, h.location, h.block,
                                         list(h.first), list(h.second)] for h in report.hazards]}
    raise ValueError(f"unknown recording {kind!r}")


@contextlib.contextmanager
def recorded_streams():
    """Records the stream of every emulated launch inside the ``with`` block.

    Launches are synchronous here, so stream order cannot be observed; what can be checked is
    the stream a launch was *given*: :data:`TORCH_STREAM` for :func:`reference.cuda.launch`,
    :data:`DEFAULT_STREAM` for a direct call of the kernel object.

    Yields:
        A list that fills with ``(kernel name, stream)`` pairs.
    """
    log: list[tuple[str, str]] = []
    _stream_logs.append(log)
    remotes = _begin_remotes("streams")
    try:
        yield log
    finally:
        _stream_logs.remove(log)
        for data in _end_remotes(remotes, "streams"):
            log.extend((str(name), str(stream)) for name, stream in data)


# ----------------------------------------------------------------------------- racecheck

#: ``PAGEDLAB_EMU_RACECHECK=1`` runs every emulated launch under racecheck and raises
#: :class:`~reference.errors.KernelRaceError` at the first launch with a hazard.
RACECHECK_ENV = "PAGEDLAB_EMU_RACECHECK"


@dataclass
class Hazard:
    """One shared-memory hazard site found by the emulated racecheck.

    Attributes:
        kernel: the kernel's name.
        kind: ``"RAW"`` (read after an unordered write), ``"WAR"`` (write over an unordered
            read) or ``"WAW"``.
        count: conflicting byte accesses seen at this pair of sites.
        location: the ``__shared__`` array and byte offset (``"s_q+24"``).
        block: the block, as ``"(x, y, z)"``.
        first: ``(thread, source line)`` of the earlier access.
        second: ``(thread, source line)`` of the later one.
    """

    kernel: str
    kind: str
    count: int
    location: str
    block: str
    first: tuple[str, str]
    second: tuple[str, str]

    def __str__(self):
        what = {"RAW": "read after an unordered write", "WAR": "write over an unordered read",
                "WAW": "two unordered writes"}[self.kind]
        return (f"{self.kind} hazard ({what}) in kernel {self.kernel} on shared {self.location}, "
                f"block {self.block}: thread {self.first[0]} at {self.first[1]} and thread "
                f"{self.second[0]} at {self.second[1]} ({self.count} byte accesses)")


@dataclass
class RaceReport:
    """What the emulated racecheck saw inside one ``with racecheck():`` block.

    Attributes:
        hazards: one :class:`Hazard` per (kernel, kind, pair of sites).
        launches: how many launches ran under racecheck.
        seconds: their total time.
    """

    hazards: list[Hazard] = field(default_factory=list)
    launches: int = 0
    seconds: float = 0.0

    def add(self, hazards: list[Hazard]) -> None:
        """Files a launch's hazards; a site pair seen before (another launch) adds its count."""
        for h in hazards:
            for seen in self.hazards:
                if (seen.kernel, seen.kind, seen.first[1], seen.second[1]) == (
                        h.kernel, h.kind, h.first[1], h.second[1]):
                    seen.count += h.count
                    break
            else:
                self.hazards.append(h)

    def summary(self, limit: int = 8) -> str:
        """Racecheck's summary line, then up to ``limit`` hazards, one per line."""
        lines = [f"RACECHECK SUMMARY: {len(self.hazards)} hazard(s) in {self.launches} "
                 "emulated launch(es)"]
        lines += [f"  {h}" for h in self.hazards[:limit]]
        if len(self.hazards) > limit:
            lines.append(f"  ... and {len(self.hazards) - limit} more")
        return "\n".join(lines)


_race_reports: list[RaceReport] = []


@contextlib.contextmanager
def racecheck():
    """Runs the emulated launches inside the ``with`` block under racecheck.

    The emulated counterpart of ``compute-sanitizer --tool racecheck``: each launch runs the
    kernel's racecheck build, which reports every pair of accesses to the same shared-memory
    byte by two threads that no ``__syncthreads`` (or, within a warp, no ``__syncwarp``)
    orders, at least one of them a write; a ``cp.async`` write counts as in flight until the wait that
    lands it. Unlike a GPU run, the verdict does not depend on timing. Launches are a few times
    slower than without it.

    Yields:
        A :class:`RaceReport` that fills as kernels run.
    """
    report = RaceReport()
    _race_reports.append(report)
    remotes = _begin_remotes("racecheck")
    try:
        yield report
    finally:
        _race_reports.remove(report)
        for data in _end_remotes(remotes, "racecheck"):
            report.add([Hazard(str(k), str(kind), int(n), str(loc), str(blk),
                               (str(a), str(b)), (str(c), str(d)))
                        for k, kind, n, loc, blk, (a, b), (c, d) in data["hazards"]])
            report.launches += int(data["launches"])
            report.seconds += float(data["seconds"])


def _racechecking() -> bool:
    return bool(_race_reports) or os.environ.get(RACECHECK_ENV, "").strip() in ("1", "true", "yes")


@functools.lru_cache(maxsize=4096)
def _source_line(so_path: str, offset: int) -> str:
    """``file.cu:123`` for a code offset of an emulated library (``?`` when unknown)."""
    try:
        out = subprocess.run(["addr2line", "-i", "-e", so_path, hex(offset)], capture_output=True,
                             text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return "?"
    # Innermost first: prefer the first frame in a kernel file over the shared headers.
    frames = [Path(f.split(" ")[0]).name for f in out if ":" in f and not f.startswith("??")]
    frames = [f for f in frames if not f.startswith("pagedlab_emu")]
    for f in frames:
        if f.split(":")[0].endswith(".cu"):
            return f
    return frames[0] if frames else "?"


def _parse_hazards(text: str, kernel: EmulatedKernel) -> list[Hazard]:
    so = str(kernel.module.path)

    def line(tok: str) -> str:
        m = re.fullmatch(r"@pc:([0-9a-f]+)@", tok)
        return _source_line(so, int(m.group(1), 16)) if m else tok

    hazards = []
    for row in text.splitlines():
        parts = row.split("\t")
        if len(parts) != 8:
            continue
        kind, count, location, block, t1, pc1, t2, pc2 = parts
        hazards.append(Hazard(kernel.name, kind, int(count), location, block, (t1, line(pc1)),
                              (t2, line(pc2))))
    return hazards


def _run_racecheck(kernel: EmulatedKernel, run) -> None:
    """Runs ``run(twin_kernel)`` with the racecheck twin and files its hazards."""
    from reference.errors import KernelRaceError

    twin = kernel.module.racecheck_twin().get_function(kernel.name)
    lib = twin.module._lib
    lib.pagedlab_emu_set_racecheck(1)
    start = time.perf_counter()
    try:
        run(twin)
    finally:
        lib.pagedlab_emu_set_racecheck(0)
    elapsed = time.perf_counter() - start
    buf = ctypes.create_string_buffer(1 << 16)
    lib.pagedlab_emu_race_report(buf, len(buf))
    hazards = _parse_hazards(buf.value.decode(errors="replace"), twin)
    for report in _race_reports:
        report.add(hazards)
        report.launches += 1
        report.seconds += elapsed
    if hazards and not _race_reports:
        raise KernelRaceError("\n".join(str(h) for h in hazards[:8]) + "\n(racecheck: "
                              f"{RACECHECK_ENV}=1; a hazard means two threads touch the same "
                              "shared memory with no __syncthreads() between them)")


def launch(kernel: EmulatedKernel, grid, block, args, shared_mem: int = 0, *,
           stream: str = TORCH_STREAM) -> None:
    """Runs an emulated kernel over ``grid`` (the CuPy launch's stand-in).

    Args:
        kernel: from :meth:`EmulatedModule.get_function`.
        grid: grid dimensions (up to 3 ints).
        block: block dimensions (up to 3 ints).
        args: :class:`HostArray` pointers (``np.uint64(0)`` for a null one), ``np.int32`` /
            ``np.float32`` scalars.
        shared_mem: dynamic shared memory in bytes.
        stream: the stream the launch was given (recorded by :func:`recorded_streams`).

    Raises:
        TypeError: an argument does not fit its parameter (count, kind or size).
        KernelOutOfBoundsError: the kernel read or wrote outside an argument array.
        KernelDeadlockError: a barrier or warp collective that not every thread reaches.
        KernelFaultError: any other fault (shared memory limit, division by zero, ...).
    """
    if _racechecking() and not getattr(kernel, "_is_twin", False):
        def run(twin):
            twin._is_twin = True
            launch(twin, grid, block, args, shared_mem, stream=stream)
        _run_racecheck(kernel, run)
        return
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(tuple(grid)))
    block = tuple(int(b) for b in block) + (1,) * (3 - len(tuple(block)))
    if len(args) != len(kernel.params):
        raise TypeError(f"kernel {kernel.name} takes {len(kernel.params)} arguments "
                        f"({', '.join(kernel.param_names)}), got {len(args)}")
    if min(grid) < 1 or min(block) < 1 or block[0] * block[1] * block[2] > 1024:
        raise ValueError(f"kernel {kernel.name}: invalid launch grid {grid} / block {block} "
                         "(every extent >= 1, at most 1024 threads per block)")
    # Arrays that overlap (views of one tensor passed twice) share one fenced buffer.
    arrays = [(i, a) for i, a in enumerate(args) if isinstance(a, HostArray)]
    spans = sorted(((a.address, a.address + a.nbytes, i) for i, a in arrays))
    groups: list[list] = []
    for lo, hi, i in spans:
        if groups and lo < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], hi)
            groups[-1][2].append(i)
        else:
            groups.append([lo, hi, [i]])
    buf_of = {}
    bufs = (_BufferArg * max(1, len(groups)))()
    names = []
    for b, (lo, hi, members) in enumerate(groups):
        first = min(members)
        name = "/".join(kernel.param_names[i] for i in sorted(members)).encode()
        names.append(name)
        p = kernel.params[first]
        bufs[b] = _BufferArg(lo, hi - lo, p.elem_size,
                             int(all(kernel.params[i].is_const for i in members)), name)
        for i in members:
            buf_of[i] = (b, args[i].address - lo)
    kargs = (_KernelArg * max(1, len(args)))()
    keep = []  # by-value structs' bytes, alive until the launch returns
    for i, a in enumerate(args):
        p = kernel.params[i]
        if not p.is_pointer and p.size > 8:
            # A struct passed by value (a TMA map, 128 bytes): its bytes, by address (kind 3).
            raw = _struct_bytes(kernel, i, a)
            # NOTE: 64-byte aligned, as the struct's type (TmaDesc is alignas(64)) promises.
            buf = ctypes.create_string_buffer(len(raw) + 64)
            at = ctypes.addressof(buf) + (-ctypes.addressof(buf) % 64)
            ctypes.memmove(at, raw, len(raw))
            keep.append(buf)
            kargs[i] = _KernelArg(at, 3, -1)
            continue
        if p.is_pointer:
            if isinstance(a, HostArray):
                b, off = buf_of[i]
                kargs[i] = _KernelArg(off, 1, b)
            elif int(a) == 0:
                kargs[i] = _KernelArg(0, 2, -1)
            else:
                raise TypeError(f"kernel {kernel.name}, parameter {i} ({kernel.param_names[i]}) "
                                "got a raw address: under emulation pass arrays as CPU tensors "
                                "through reference.cuda.ptr()")
        else:
            if isinstance(a, HostArray):
                raise TypeError(f"kernel {kernel.name}, parameter {i} "
                                f"({kernel.param_names[i]}) is a scalar but got an array")
            kargs[i] = _KernelArg(_scalar_bits(kernel, i, a), 0, -1)
    for log in _stream_logs:
        log.append((kernel.name, stream))
    err = ctypes.create_string_buffer(4096)
    start = time.perf_counter()
    rc = kernel.module._run(ctypes.pointer(kernel._entry), (ctypes.c_uint * 3)(*grid),
                            (ctypes.c_uint * 3)(*block), int(shared_mem), len(groups), bufs,
                            len(args), kargs, err, len(err))
    kernel.last_seconds = time.perf_counter() - start
    if rc:
        msg = err.value.decode(errors="replace")
        if "PAGEDLAB_EMU_TIMEOUT" in msg:
            raise KernelTimeoutError(msg)
        if "deadlock" in msg:
            raise KernelDeadlockError(msg)
        if "out-of-bounds" in msg or "invalid read" in msg or "invalid write" in msg or (
                "const input" in msg):
            raise KernelOutOfBoundsError(msg)
        raise KernelFaultError(msg)
