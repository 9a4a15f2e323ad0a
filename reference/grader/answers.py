"""Does a release hand out the answer to a TODO? Function bodies of the release's trusted code
(``reference/``) and of the labs' given files (``labs/<lab>/_*.py``) compared with the solution
of every TODO function.

The decision (instructor README, "What a release ships from reference/"): trusted helpers that
later labs need stay in a release, so that every lab is graded on its own; where one of them is
close to a TODO's answer, the pair is listed in :data:`KNOWN_OVERLAPS` with its reason and the
lab's handout says so in the student's words. Any *other* body in a release's ``reference/``
that resembles a solved TODO is a leak (``tests/test_release.py`` checks it).
"""

from __future__ import annotations

import ast
import io
import tokenize
from difflib import SequenceMatcher
from pathlib import Path

from reference.paths import LABS_DIR, SOLUTIONS_DIR

#: Similarity (0..1, difflib over the bodies' token sequences) at and above which two bodies
#: count as the same answer. Measured 2026-11-24 on a release of every lab: the known pairs
#: below score 0.59-0.79; the closest other pairs are the allocator's free ~ Lab 1's allocate
#: (0.56, same class) and reference.llama.write_kv ~ Lab 2's reshape_and_cache (0.53).
THRESHOLD = 0.58

#: (release function, lab:TODO function) -> why it ships anyway. Each lab named here states
#: the overlap in its handout (``tests/test_release.py`` checks that too).
KNOWN_OVERLAPS = {
    ("reference/block_allocator.py::TrustedBlockAllocator.free", "lab01_block_manager:BlockManager.free"):
        "Labs 2 and 6 build on a block allocator that must not be the student's Lab 1",
    ("reference/block_allocator.py::TrustedBlockAllocator.increase_ref_count",
     "lab01_block_manager:BlockManager.increase_ref_count"):
        "Labs 2 and 6 build on a block allocator that must not be the student's Lab 1",
    ("reference/block_allocator.py::TrustedBlockAllocator.allocate_n",
     "lab01_block_manager:BlockManager.allocate_n"):
        "Labs 2 and 6 build on a block allocator that must not be the student's Lab 1",
    ("reference/oracle.py::attention_ref", "lab03_paged_attention_oracle:dense_attention"):
        "the float64 dense oracle Labs 3-5 are graded against; TODO(lab3.1) is the warm-up",
}
# Lab 4's given launchers are the worked example of a launcher's shape (validate, allocate,
# launch, finish); v1's and v2's Python follows it by design, their task is the kernel.
KNOWN_OVERLAPS.update({
    (f"labs/lab04_decode_kernels/_launch.py::{given}", f"lab04_decode_kernels:{todo}"):
        "the worked example of a launcher (TODO(lab4.1)/(lab4.2) are the kernels)"
    for given in ("launch_naive", "launch_v0")
    for todo in ("paged_attention_v1", "paged_attention_v2")})
#: Labs whose handout must state an overlap, and a phrase each must contain.
STATED_IN_HANDOUT = {"lab01_block_manager": "reference/block_allocator.py",
                     "lab03_paged_attention_oracle": "reference/oracle.py",
                     "lab04_decode_kernels": "worked example of a launcher"}


def _bodies(path: Path, rel: str) -> dict[str, list[str]]:
    """Returns ``rel::[Class.]function`` -> its body's tokens (docstring dropped)."""
    out = {}
    tree = ast.parse(path.read_text())

    def visit(nodes, prefix):
        for node in nodes:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    body = body[1:]
                if body:
                    out[f"{rel}::{prefix}{node.name}"] = _tokens(ast.unparse(body))

    visit(tree.body, "")
    return out


def _tokens(source: str) -> list[str]:
    skip = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT,
            tokenize.ENDMARKER}
    return [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type not in skip]


def todo_solutions() -> dict[str, list[str]]:
    """Returns ``lab:[Class.]function`` -> the solution's body tokens, for every function whose
    starter body raises a ``TODO`` (the answers a release must not hand out)."""
    out = {}
    for starter in sorted(LABS_DIR.glob("lab*/starter.py")):
        lab = starter.parent.name
        solution = SOLUTIONS_DIR / lab / "solution.py"
        if not solution.is_file():
            continue
        todo = {name.split("::")[1] for name, toks in _bodies(starter, "s").items()
                if "NotImplementedError" in toks and any("TODO(" in t for t in toks)}
        for name, toks in _bodies(solution, "s").items():
            if name.split("::")[1] in todo:
                out[f"{lab}:{name.split('::')[1]}"] = toks
    return out


def overlaps(release: Path, min_tokens: int = 25) -> list[tuple[float, str, str]]:
    """Returns (similarity, release function, TODO function) for every pair at or above
    :data:`THRESHOLD`, most similar first.

    Args:
        release: a release folder (its ``reference/`` is compared).
        min_tokens: shorter bodies (a one-line getter) are left out: they match by accident.
    """
    answers = {k: v for k, v in todo_solutions().items() if len(v) >= min_tokens}
    found = []
    # Trusted shared code, and each lab's given files (``_*.py``, protected): neither may hold
    # a TODO's steps (a given plan that re-implements the launcher would be one).
    given = sorted((release / "labs").glob("lab*/_*.py"))
    for path in sorted((release / "reference").rglob("*.py")) + given:
        rel = path.relative_to(release).as_posix()
        for name, toks in _bodies(path, rel).items():
            if len(toks) < min_tokens:
                continue
            for todo, answer in answers.items():
                matcher = SequenceMatcher(None, toks, answer, autojunk=False)
                if matcher.real_quick_ratio() >= THRESHOLD and matcher.quick_ratio() >= THRESHOLD:
                    ratio = matcher.ratio()
                    if ratio >= THRESHOLD:
                        found.append((round(ratio, 2), name, todo))
    return sorted(found, reverse=True)


#: Shipped helpers that compute a TODO's result without resembling its answer: the float64
#: paged oracles answer Lab 3's paged functions with a dense pass over gathered pages (no
#: online softmax, so the body comparison above does not pair them). A starter that calls
#: one gets the same note (a red team scored 37.6 of Lab 3's 75 points with them, 2026-11-30).
ANSWERING_HELPERS = {
    "lab03_paged_attention_oracle": {"reference.oracle.paged_decode_ref": "paged_decode",
                                     "reference.oracle.paged_prefill_ref": "paged_prefill"},
}


def _overlap_names() -> dict[str, dict[str, str]]:
    """lab -> {module.name of a shipped helper in ``reference/`` -> the TODO it overlaps}."""
    out: dict[str, dict[str, str]] = {lab: dict(h) for lab, h in ANSWERING_HELPERS.items()}
    for (shipped, todo), _ in KNOWN_OVERLAPS.items():
        path, qual = shipped.split("::")
        if not path.startswith("reference/"):
            continue  # a lab's own given file (its worked example) is meant to be used
        module = path[:-3].replace("/", ".")
        lab, func = todo.split(":")
        out.setdefault(lab, {})[f"{module}.{qual.split('.')[0]}"] = func.split(".")[0]
    return out


def helper_uses(lab: str, source: str) -> list[str]:
    """Notes for each shipped helper that overlaps one of ``lab``'s TODOs and that ``source``
    (the student's ``starter.py``) imports or names — the grade stands, the instructor is told.

    Args:
        lab: the lab folder name.
        source: the student's module source.

    Returns:
        One note per helper used (empty when none, or when the source does not parse).
    """
    wanted = _overlap_names().get(lab, {})
    if not wanted:
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{a.name}" for a in node.names)
            # ``from reference import oracle`` then ``oracle.attention_ref``: the module itself
            names.update(f"{node.module}.{a.name}.*" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(f"{a.name}.*" for a in node.names)
        elif isinstance(node, ast.Attribute):
            names.add(f"attr:{node.attr}")
    notes = []
    for helper, todo in sorted(wanted.items()):
        module, name = helper.rsplit(".", 1)
        if helper in names or (f"{module}.*" in names and f"attr:{name}" in names):
            notes.append(f"{lab}: starter.py uses {helper}, which the handout asks you not to "
                         f"use (it overlaps your {todo}): the score stands; this note goes to "
                         f"your instructor")
    return notes
