"""Starter/solution parity: the same public API, signature for signature, docstring for docstring.

A student reads the starter's docstrings as the spec and the tests call the solution's
signatures; when the two drift apart, the starter lies. ``pagedlab release`` refuses to ship a
lab whose starter and solution differ in any public function, class, method, property or
dataclass field (name, arguments with annotations and defaults, return annotation, decorators,
docstring), or in the parameter list of any ``extern "C" __global__`` kernel of a ``.cu`` file
both have.

Beyond the public API it also holds what the two files keep in pairs, since nothing else checks
that such copies agree: every module-level constant both define (same value expression; a
public one missing on one side is reported too), every private helper function or private
method both define (same signature — its body is the solution's business), and every ``.cuh``
header present in both folders (identical text: a header is given code, and a lab keeps it once in ``labs/<lab>/``
when it can).

No function body may be the same in both files (given code is kept once, in a protected
``labs/<lab>/_*.py``), but for the few launchers' glue lines in :data:`SHARED_GLUE`.

A public name both files import from the workbook's code (``labs.*``, ``reference.*``) —
given code kept once and re-exported — must come from the same place on both sides.

Read from source with :mod:`ast` (nothing is imported), so a starter that cannot run yet is
still checked. Private names (``_x``) may exist on one side only; dunder methods are public.
Given code a class inherits (Lab 2's ``KVCachePool(KVCachePoolBase)``, the base kept once in a
protected ``labs/<lab>/_*.py``) is in neither file, so it cannot drift; the class line, bases
included, must match.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)


@dataclass(frozen=True)
class ApiItem:
    """One public name: what kind it is, its signature and its docstring."""

    kind: str  # function | class | method | field
    signature: str
    doc: str | None


def _public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _decorators(node) -> str:
    return "".join(f"@{ast.unparse(d)} " for d in node.decorator_list)


def _func_sig(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    ret = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return f"{_decorators(node)}{prefix} {node.name}({ast.unparse(node.args)}){ret}"


def public_api(source: str) -> dict[str, ApiItem]:
    """Returns a module's public API by qualified name (``Class.method``).

    Args:
        source: Python source text.
    """
    api: dict[str, ApiItem] = {}
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(node.name):
            api[node.name] = ApiItem("function", _func_sig(node), ast.get_docstring(node))
        elif isinstance(node, ast.ClassDef) and _public(node.name):
            bases = ", ".join(ast.unparse(b) for b in node.bases + node.keywords)
            api[node.name] = ApiItem("class", f"{_decorators(node)}class {node.name}({bases})",
                                     ast.get_docstring(node))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _public(item.name):
                    api[f"{node.name}.{item.name}"] = ApiItem("method", _func_sig(item),
                                                              ast.get_docstring(item))
                elif (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                      and _public(item.target.id)):
                    value = f" = {ast.unparse(item.value)}" if item.value is not None else ""
                    api[f"{node.name}.{item.target.id}"] = ApiItem(
                        "field", f"{item.target.id}: {ast.unparse(item.annotation)}{value}", None)
    return api


def module_constants(source: str) -> dict[str, str]:
    """Returns a module's top-level assignments to plain names: name -> value expression.

    ``A, B = 1, 2`` counts as ``A = 1`` and ``B = 2``; other tuple targets as one expression
    per name.

    Args:
        source: Python source text.
    """
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            out[node.target.id] = f"{ast.unparse(node.annotation)} = {ast.unparse(node.value)}"
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = ast.unparse(node.value)
                elif (isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                      and len(target.elts) == len(node.value.elts)):
                    for name, value in zip(target.elts, node.value.elts):
                        if isinstance(name, ast.Name):
                            out[name.id] = ast.unparse(value)
    return out


def private_helpers(source: str) -> dict[str, str]:
    """Returns a module's private functions and its classes' private methods (``_x``, not
    dunders): name (``Class._x`` for a method) -> signature.

    Args:
        source: Python source text.
    """
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _public(node.name):
            out[node.name] = _func_sig(node)
        elif isinstance(node, ast.ClassDef):
            out |= {f"{node.name}.{item.name}": _func_sig(item) for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and not _public(item.name)}
    return out


def given_imports(source: str) -> dict[str, str]:
    """Returns the public names a module imports from the workbook's own code: name -> origin.

    A given function kept once (``labs/<lab>/_numerics.py``) and re-exported by both files as
    ``from labs.<lab>._numerics import round_to`` is the same object on both sides, so it is
    paired by where it comes from, not by an AST it does not have here.

    Args:
        source: Python source text.
    """
    out: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in (
                "labs", "reference"):
            for alias in node.names:
                name = alias.asname or alias.name
                if _public(name):
                    out[name] = f"{node.module}.{alias.name}"
    return out


def _compare_pairs(where: str, what: str, got: dict[str, str], want: dict[str, str],
                   *, require_public: bool) -> list[str]:
    problems = []
    if require_public:
        for name in sorted(n for n in set(want) ^ set(got) if _public(n)):
            side = "solution" if name in want else "starter"
            other = "starter" if name in want else "solution"
            problems.append(f"{where}: {what} {name} is in the {side} but not the {other}")
    for name in sorted(set(got) & set(want)):
        if got[name] != want[name]:
            problems.append(f"{where}: {what} {name} differs:\n    starter:  {got[name]}\n"
                            f"    solution: {want[name]}")
    return problems


def compare_python(starter: Path, solution: Path) -> list[str]:
    """Returns the differences between a starter's and a solution's public API.

    Args:
        starter: ``labs/<lab>/<name>.py``.
        solution: the matching file under ``solutions/<lab>/``.

    Returns:
        One human-readable line per difference (empty when they match).
    """
    got, want = public_api(starter.read_text()), public_api(solution.read_text())
    got_given, want_given = given_imports(starter.read_text()), given_imports(solution.read_text())
    problems = []
    where = f"{starter.parent.name}/{starter.name}"

    def imported(name: str, given: dict[str, str], side: str) -> str:
        return (f" (the {side} imports it from {given[name].rsplit('.', 1)[0]}: given code is "
                f"imported by both files or defined by both)" if name in given else "")

    for name in sorted(set(want) - set(got)):
        problems.append(f"{where}: {want[name].kind} {name} is in the solution but not the starter"
                        + imported(name, got_given, "starter"))
    for name in sorted(set(got) - set(want)):
        problems.append(f"{where}: {got[name].kind} {name} is in the starter but not the solution"
                        + imported(name, want_given, "solution"))
    for name in sorted(set(got_given) & set(want_given)):
        if got_given[name] != want_given[name]:
            problems.append(f"{where}: {name} is imported from different places:\n    starter:  "
                            f"{got_given[name]}\n    solution: {want_given[name]}")
    for name in sorted(set(got) & set(want)):
        a, b = got[name], want[name]
        if a.signature != b.signature:
            problems.append(f"{where}: {name} signature differs:\n    starter:  {a.signature}\n"
                            f"    solution: {b.signature}")
        if a.doc != b.doc:
            problems.append(f"{where}: {name} docstring differs from the solution's")
    got_src, want_src = starter.read_text(), solution.read_text()
    problems += _compare_pairs(where, "constant", module_constants(got_src),
                               module_constants(want_src), require_public=True)
    problems += _compare_pairs(where, "private helper", private_helpers(got_src),
                               private_helpers(want_src), require_public=False)
    return problems


#: Functions whose body may be the same in starter and solution: the public launchers' glue,
#: one or two lines that call the student's own TODO functions in launch order. Moving them to a
#: given module would mean passing the student's functions in (and Lab 4's dispatch test swaps
#: ``paged_attention_v4``/``v6`` in the lab module, which ``paged_attention`` must look up there).
#: ``plan_decode`` / ``plan_prefill`` hand the module's ``globals()`` to the given plan code
#: (``_plan.py``), so that a plan is built on the student's TODO functions as they are now.
#: Anything else identical in both files is given code kept twice: keep it once in ``_*.py``.
SHARED_GLUE = {
    "lab04_decode_kernels": {"paged_attention_naive", "paged_attention_v3", "paged_attention",
                             "plan_decode"},
    "lab05_prefill_kernels": {"plan_for_kernel", "_prepare", "plan_prefill"},
}
#: The most statements a glue body may hold (more is logic, not glue).
MAX_GLUE_STATEMENTS = 4


def _bodies(source: str) -> dict[str, ast.AST]:
    """Returns every function and method (``Class.method``) by qualified name."""
    out: dict[str, ast.AST] = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            out |= {f"{node.name}.{m.name}": m for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return out


def _is_todo(node: ast.AST) -> bool:
    return "NotImplementedError" in ast.unparse(node)


def shared_bodies(starter: Path, solution: Path) -> list[str]:
    """Returns the problems of code kept twice: functions identical in starter and solution.

    Given code lives once, in a protected ``labs/<lab>/_*.py`` both files import; a starter and
    its solution differ only in the TODOs. The exceptions are :data:`SHARED_GLUE` (short bodies
    that call the student's functions), each held to :data:`MAX_GLUE_STATEMENTS`.
    """
    lab = starter.parent.name
    allowed = SHARED_GLUE.get(lab, set())
    got, want = _bodies(starter.read_text()), _bodies(solution.read_text())
    problems = []
    for name in sorted(set(got) & set(want)):
        a, b = got[name], want[name]
        if ast.dump(a) != ast.dump(b) or _is_todo(a):
            continue
        body = a.body[1:] if ast.get_docstring(a) is not None else a.body
        if name in allowed and len(body) <= MAX_GLUE_STATEMENTS:
            continue
        problems.append(f"{lab}/starter.py: {name} is the same in starter and solution: given code "
                        f"is kept once, in a protected labs/{lab}/_*.py both import")
    return problems


def kernel_signatures(source: str) -> dict[str, str]:
    """Returns ``extern "C" __global__`` kernels: name -> normalised parameter list."""
    no_comments = re.sub(r"//[^\n]*|/\*.*?\*/", "", source, flags=re.S)
    return {name: " ".join(params.split()) for name, params in _KERNEL.findall(no_comments)}


def compare_cuda(starter: Path, solution: Path) -> list[str]:
    """Returns kernels whose parameters differ (or that one side lacks) between two ``.cu`` files."""
    got = kernel_signatures(starter.read_text())
    want = kernel_signatures(solution.read_text())
    where = f"{starter.parent.name}/{starter.name}"
    problems = [f"{where}: kernel {k} is in the solution but not the starter"
                for k in sorted(set(want) - set(got))]
    problems += [f"{where}: kernel {k} is in the starter but not the solution"
                 for k in sorted(set(got) - set(want))]
    problems += [f"{where}: kernel {k} parameters differ:\n    starter:  ({got[k]})\n"
                 f"    solution: ({want[k]})" for k in sorted(set(got) & set(want)) if got[k] != want[k]]
    return problems


def compare_header(starter: Path, solution: Path) -> list[str]:
    """Returns a problem when a ``.cuh`` header kept in both folders differs at all."""
    if starter.read_bytes() == solution.read_bytes():
        return []
    return [f"{starter.parent.name}/{starter.name}: header differs from the solution's copy (a "
            f"given header must be identical; keep it once, in labs/, where the solution's "
            f"kernels find it too)"]


def check_lab(lab_dir: Path, solution_dir: Path) -> list[str]:
    """Returns every parity problem of one lab.

    ``starter.py`` is compared with ``solution.py``; any other ``.py`` or ``.cu`` file present
    under the same name in both folders (``solutions/`` mirrors ``labs/`` name for name) is
    compared too, and a ``.cuh`` header present in both must be identical. Test files and
    private modules (``test_*``, ``_*``) are skipped.
    """
    problems = []
    pairs = []
    if (lab_dir / "starter.py").is_file() and (solution_dir / "solution.py").is_file():
        pairs.append((lab_dir / "starter.py", solution_dir / "solution.py"))
    elif (lab_dir / "starter.py").is_file():
        problems.append(f"{lab_dir.name}: has starter.py but solutions/{lab_dir.name}/solution.py "
                        f"is missing")
    for path in sorted(solution_dir.rglob("*")):
        rel = path.relative_to(solution_dir)
        if (path.suffix not in (".py", ".cu", ".cuh") or path.name.startswith(("test_", "_"))
                or path.name == "solution.py" or "hidden" in rel.parts):
            continue
        twin = lab_dir / rel
        if twin.is_file():
            pairs.append((twin, path))
    for starter, solution in pairs:
        compare = {".cu": compare_cuda, ".cuh": compare_header}.get(starter.suffix, compare_python)
        problems += compare(starter, solution)
        if starter.name == "starter.py":
            problems += shared_bodies(starter, solution)
    return problems
