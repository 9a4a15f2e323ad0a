"""The contract check: everything a lab's tests hold a student to is stated where a student reads.

A test may demand an error message matching a pattern (``pytest.raises(..., match="block_id=")``)
or read an attribute of the student's objects (a helper reading ``pool.num_blocks``). A student
who was never told either loses points to guesswork. This check scans, with a pragmatic AST pass,
a lab's tests and helpers (``labs/<lab>/test_*.py``, ``_*.py``, ``conftest.py``) for:

* every ``match=`` keyword with a literal (or f-string) pattern — the identifier words in its
  literal parts (``block_id``, ``num_new_tokens``) and every ``name=`` of a ``name=value``
  fragment, however short, which must be stated with its ``=`` (``block_id=3`` in the handout:
  a student told only that the message "names the block id" writes ``block 3``);
* every attribute read on the implementation: ``impl.X``, and ``obj.attr`` where ``obj`` is a name
  that holds something the implementation built anywhere in the lab's test files (assigned from
  an expression involving ``impl``, from a helper or fixture that returns one, or a helper's
  parameter of the same name);

and reports each word not found (as a whole word) in the lab's handout or in its starter's
docstrings. Names the starter itself defines or imports (functions, classes, methods, annotated
fields, ``self.x = ...`` in given code) count as stated, and so do the docstrings and names of
the lab's given ``_*.py`` modules the starter imports from (given code kept once, out of the
starter, is still in a student's view). Attributes every array or tensor has (``shape``, ``dtype``...) are not the lab's contract
and are skipped.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from reference.paths import LABS_DIR

#: Attributes of the values labs return (NumPy arrays, torch tensors, lists, dicts, builtins).
GENERIC_ATTRS = frozenset("""
shape dtype device ndim size numel item tolist numpy cpu cuda to clone copy astype sum max min mean
any all abs float double half int long view reshape contiguous is_contiguous stride data_ptr T
append extend pop keys values items get index count sort real imag flatten transpose permute
element_size storage_offset dim type squeeze unsqueeze fill_ zero_ nbytes itemsize flags
__class__ __name__ __dict__ __len__ __iter__ __getitem__ copy_ detach float32 float16 bfloat16
is_cuda untyped_storage data grad requires_grad
""".split())
#: Words of a pattern that are regex or English filler, never a contract name.
FILLER = frozenset("the and not for with any was has are is of to in on or at an be".split())
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME_EQ = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")


@dataclass
class ContractReport:
    """What one lab's tests demand and its handout or starter docstrings do not state."""

    lab: str
    missing_match_words: dict[str, list[str]] = field(default_factory=dict)  # word -> where
    missing_attributes: dict[str, list[str]] = field(default_factory=dict)  # attr -> where
    num_patterns: int = 0
    num_attributes: int = 0

    def problems(self) -> list[str]:
        """Returns one line per unstated word, naming where the tests use it."""
        out = []
        for word, where in sorted(self.missing_match_words.items()):
            out.append(f"{self.lab}: error-message word `{word}` (match= in {', '.join(sorted(set(where))[:3])}) "
                       f"is stated in neither the handout nor the starter's docstrings")
        for attr, where in sorted(self.missing_attributes.items()):
            out.append(f"{self.lab}: attribute `{attr}` (read in {', '.join(sorted(set(where))[:3])}) "
                       f"is stated in neither the handout nor the starter's docstrings")
        return out


def _unescape_pattern(pattern: str) -> str:
    """Returns a regex's literal text: escapes and metacharacters become spaces."""
    text = re.sub(r"\\[dDwWsSbB]", " ", pattern)
    text = re.sub(r"\\(.)", r"\1", text)
    return re.sub(r"[\[\](){}|?*+^$.]", " ", text)


def match_words(pattern: str) -> set[str]:
    """Returns the words of a ``match=`` pattern a student must be told about.

    Args:
        pattern: the literal parts of the pattern (f-string holes already dropped).

    Returns:
        Identifier words of three or more characters, plus every ``name=`` of a ``name=value``
        fragment (``n=`` in ``n=2``, kept with its ``=``), minus English filler.
    """
    text = _unescape_pattern(pattern)
    words = {w for w in _WORD.findall(text) if len(w) >= 3 and w.lower() not in FILLER}
    return words | {f"{name}=" for name in _NAME_EQ.findall(text)}


def _literal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        # f"block_id={block}": the holes are values; keep the literal text, hole as a space.
        return "".join(v.value if isinstance(v, ast.Constant) else " " for v in node.values)
    return None


def _parametrize_values(func: ast.FunctionDef, name: str) -> list[ast.AST] | None:
    """Returns the values ``@pytest.mark.parametrize`` gives parameter ``name``, or None."""
    for deco in func.decorator_list:
        if not (isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize"
                and len(deco.args) >= 2):
            continue
        names = _literal(deco.args[0])
        if names is None:
            continue
        argnames = [n.strip() for n in names.split(",")]
        if name not in argnames or not isinstance(deco.args[1], (ast.List, ast.Tuple)):
            continue
        index = argnames.index(name)
        out = []
        for item in deco.args[1].elts:
            if isinstance(item, ast.Call) and getattr(item.func, "attr", "") == "param":
                item = ast.Tuple(elts=item.args) if len(argnames) > 1 else item.args[0]
            if len(argnames) == 1:
                out.append(item)
            elif isinstance(item, ast.Tuple) and index < len(item.elts):
                out.append(item.elts[index])
        return out
    return None


def _resolve(node: ast.AST, func: ast.FunctionDef | None, ctx: "_Scan", depth: int = 0) -> list[str]:
    """Returns the literal patterns an expression passed as ``match=`` can take.

    Pragmatic: a literal; a parametrize argument; a name unpacked from a module-level dict of
    tuples (``error, name = CASES[case]``); a helper's parameter, resolved at its call sites.
    """
    text = _literal(node)
    if text is not None:
        return [text]
    if not isinstance(node, ast.Name) or func is None or depth > 2:
        return []
    name = node.id
    values = _parametrize_values(func, name)
    if values is not None:
        return [t for v in values for t in _resolve(v, None, ctx, depth + 1)]
    for sub in ast.walk(func):
        if isinstance(sub, ast.Assign) and isinstance(sub.targets[0], ast.Tuple) \
                and isinstance(sub.value, ast.Subscript) and isinstance(sub.value.value, ast.Name):
            names = [e.id if isinstance(e, ast.Name) else None for e in sub.targets[0].elts]
            table = ctx.dicts.get(sub.value.value.id)
            if name in names and table is not None:
                index = names.index(name)
                return [t for v in table.values if isinstance(v, ast.Tuple) and index < len(v.elts)
                        for t in _resolve(v.elts[index], None, ctx, depth + 1)]
    params = [a.arg for a in func.args.args]
    if name in params:
        index = params.index(name)
        out = []
        for call, caller in ctx.calls.get(func.name, []):
            arg = next((k.value for k in call.keywords if k.arg == name), None)
            if arg is None and index < len(call.args):
                arg = call.args[index]
            if arg is not None:
                out += _resolve(arg, caller, ctx, depth + 1)
        return out
    return []


@dataclass
class _Scan:
    """Module-level dicts and call sites of a lab's test files (for :func:`_resolve`)."""

    dicts: dict[str, ast.Dict] = field(default_factory=dict)
    calls: dict[str, list[tuple[ast.Call, ast.FunctionDef | None]]] = field(default_factory=dict)


def _scan(trees: dict[str, ast.Module]) -> tuple[_Scan, dict[int, ast.FunctionDef]]:
    """Returns the lab's module-level dicts and helper call sites, and node -> enclosing function."""
    ctx = _Scan()
    owner: dict[int, ast.FunctionDef] = {}
    for tree in trees.values():
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) \
                    and isinstance(node.targets[0], ast.Name):
                ctx.dicts[node.targets[0].id] = node.value
        for func in ast.walk(tree):
            if isinstance(func, ast.FunctionDef):
                for sub in ast.walk(func):
                    owner.setdefault(id(sub), func) if sub is not func else None
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                ctx.calls.setdefault(node.func.id, []).append((node, owner.get(id(node))))
    return ctx, owner


def _mentions_impl(node: ast.AST, tainted: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and (n.id == "impl" or n.id in tainted) for n in ast.walk(node))


def _is_given(func: ast.AST) -> bool:
    return isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "given"


def lab_test_files(lab: str) -> list[Path]:
    """Returns a lab's test files and helpers (tests, ``_*.py``, ``conftest.py``)."""
    folder = LABS_DIR / lab
    return sorted(p for p in folder.glob("*.py")
                  if p.name.startswith(("test_", "_")) and p.name != "__init__.py"
                  or p.name == "conftest.py")


def _tainted_names(trees: dict[str, ast.Module]) -> set[str]:
    """Returns names that hold implementation objects somewhere in a lab's test files."""
    tainted: set[str] = set()
    returning: set[str] = set()  # helper / fixture functions whose result is an impl object
    for _ in range(4):  # a few rounds: helpers of helpers
        before = (len(tainted), len(returning))
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef):
                    for sub in ast.walk(node):
                        if isinstance(sub, (ast.Return, ast.Yield)) and sub.value is not None \
                                and (_mentions_impl(sub.value, tainted) or any(
                                    isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                                    and c.func.id in returning for c in ast.walk(sub.value))):
                            returning.add(node.name)
                value = getattr(node, "value", None)
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, (ast.AnnAssign, ast.NamedExpr))
                           else [node.optional_vars] if isinstance(node, ast.withitem) else [])
                if isinstance(node, ast.withitem):
                    value = node.context_expr
                if value is None or not targets:
                    continue
                # NOTE: ``given(impl, Sequence)(...)`` makes an object of *given* lab code
                # where the implementation runs (reference.grader.proxy.given): its attributes
                # are the given code's, not a contract of the student's.
                from_impl = isinstance(value, ast.Call) and not _is_given(value.func) and (
                    _mentions_impl(value.func, set())
                    or isinstance(value.func, ast.Name) and value.func.id in returning)
                if from_impl:
                    # Plain names (and tuples of them) only: `self.pool = ...` taints no `self`.
                    for target in targets:
                        elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
                        tainted |= {e.id for e in elts if isinstance(e, ast.Name)}
        # Fixtures that return an impl object are parameters of that name in the tests.
        tainted |= returning & {n.name for t in trees.values() for n in ast.walk(t)
                                if isinstance(n, ast.FunctionDef)}
        if (len(tainted), len(returning)) == before:
            break
    tainted.discard("impl")
    return tainted


def _given_modules(folder: Path, tree: ast.Module) -> list[Path]:
    """Returns the lab's protected ``_*.py`` modules that the starter imports from.

    Given code moved out of the starter (base classes, helpers kept once for starter and
    solution) is still what a student reads: its docstrings and the names it defines count.
    """
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            last = node.module.split(".")[-1]
            path = folder / f"{last}.py"
            inside = node.level > 0 or node.module == f"labs.{folder.name}.{last}"
            if last.startswith("_") and inside and path.is_file() and path not in found:
                found.append(path)
    return found


def _collect(tree: ast.Module, parts: list[str], defined: set[str]) -> None:
    """Adds a module's docstrings to ``parts`` and the names it defines to ``defined``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                parts.append(doc)
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):
            defined |= {a.asname or a.name for a in node.names}
        # Attributes the given code sets (``self.hash_to_block = {}``) are in plain view.
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name) and t.value.id == "self"}


def stated_text(lab: str) -> tuple[str, set[str]]:
    """Returns (handout + starter docstrings, names the starter defines).

    The starter's side includes the given ``_*.py`` modules of the lab that it imports from
    (see :func:`_given_modules`), since a student reads those too.
    """
    folder = LABS_DIR / lab
    parts = []
    handout = folder / "README.md"
    if handout.is_file():
        parts.append(handout.read_text())
    defined: set[str] = set()
    starter = folder / "starter.py"
    if starter.is_file():
        tree = ast.parse(starter.read_text())
        _collect(tree, parts, defined)
        for given in _given_modules(folder, tree):
            _collect(ast.parse(given.read_text()), parts, defined)
    return "\n".join(parts), defined


def check_lab_contract(lab: str) -> ContractReport:
    """Scans one lab's tests and helpers and reports what they demand but nobody states.

    Args:
        lab: lab folder name.

    Returns:
        The lab's report (empty dicts when everything is stated).
    """
    report = ContractReport(lab)
    trees = {p.name: ast.parse(p.read_text()) for p in lab_test_files(lab)}
    text, defined = stated_text(lab)

    def stated(word: str) -> bool:
        if word.endswith("="):  # a ``name=`` fragment: the handout must show it with its ``=``
            return re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}", text) is not None
        return word in defined or re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])",
                                             text) is not None

    tainted = _tainted_names(trees)
    ctx, enclosing = _scan(trees)
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "match":
                for pattern in _resolve(node.value, enclosing.get(id(node.value)), ctx):
                    report.num_patterns += 1
                    for word in match_words(pattern):
                        if not stated(word):
                            report.missing_match_words.setdefault(word, []).append(
                                f"{name}:{node.value.lineno}")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and isinstance(node.ctx, ast.Load):
                owner = node.value.id
                if owner != "impl" and owner not in tainted:
                    continue
                attr = node.attr
                if attr in GENERIC_ATTRS or (attr.startswith("_") and owner != "impl"):
                    continue
                report.num_attributes += 1
                if not stated(attr):
                    report.missing_attributes.setdefault(attr, []).append(f"{name}:{node.lineno}")
    return report
