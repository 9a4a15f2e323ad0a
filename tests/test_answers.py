"""Infrastructure (no points): a release's trusted code hands out no TODO's answer beyond the
overlaps the instructor README decides (reference/grader/answers.py)."""

from __future__ import annotations

import shutil
import textwrap

import pytest

from reference.grader.answers import KNOWN_OVERLAPS, STATED_IN_HANDOUT, overlaps
from reference.grader.release import is_released, source_files
from reference.paths import LABS_DIR, REPO_ROOT, SOLUTIONS_DIR, lab_names

pytestmark = pytest.mark.skipif(not SOLUTIONS_DIR.is_dir(), reason="needs solutions/")


@pytest.fixture(scope="module")
def released_reference(tmp_path_factory):
    """The ``reference/`` and given ``labs/<lab>/_*.py`` a release of every lab ships (copied as
    the builder selects them)."""
    out = tmp_path_factory.mktemp("rel")
    for rel in source_files():
        given = rel.startswith("labs/") and rel.rsplit("/", 1)[-1].startswith("_")
        if ((rel.startswith("reference/") or given) and rel.endswith(".py")
                and is_released(rel, lab_names())):
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / rel, out / rel)
    return out


def test_release_reference_holds_no_answer_beyond_the_decided_overlaps(released_reference):
    """Every function body of a release's reference/ and given lab files that resembles the solution of a TODO
    function (similarity >= the threshold) is one of the decided, documented overlaps."""
    found = overlaps(released_reference)
    unknown = [f"{r:.2f}  {ref} ~ {todo}" for r, ref, todo in found
               if (ref, todo) not in KNOWN_OVERLAPS]
    assert not unknown, (
        "a release's reference/ holds code close to a TODO's solution — the student gets the "
        "answer. Move it out of reference/, rewrite it so it is not that answer, or decide the "
        "overlap in reference/grader/answers.py (KNOWN_OVERLAPS) and state it in the handout:\n"
        + "\n".join(unknown))


def test_each_decided_overlap_is_stated_in_its_handout():
    """A lab whose TODO a shipped helper resembles says so in its handout, naming the file."""
    labs = {todo.split(":")[0] for _, todo in KNOWN_OVERLAPS}
    missing = [lab for lab in sorted(labs)
               if STATED_IN_HANDOUT.get(lab, "\0") not in (LABS_DIR / lab / "README.md").read_text()]
    assert not missing, f"handouts that do not state their overlap with reference/: {missing}"


def test_a_planted_copy_of_a_solution_is_found(tmp_path):
    """The detector works: Lab 3's paged_decode solution pasted (renamed) into reference/ is
    reported, though it is in no decided overlap."""
    import ast

    solution = (SOLUTIONS_DIR / "lab03_paged_attention_oracle" / "solution.py").read_text()
    func = next(n for n in ast.parse(solution).body
                if isinstance(n, ast.FunctionDef) and n.name == "paged_decode_split_k")
    func.name = "helper"
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "util.py").write_text(textwrap.dedent(ast.unparse(func)))
    found = overlaps(tmp_path)
    assert any(todo.endswith(":paged_decode_split_k") and r > 0.95 for r, _, todo in found), found


def test_a_given_lab_file_holding_a_todo_is_found(tmp_path):
    """Given files are scanned too: Lab 4's ``_split_kv_launch`` solution pasted (renamed) into
    a given ``labs/<lab>/_*.py`` is reported."""
    import ast

    solution = (SOLUTIONS_DIR / "lab04_decode_kernels" / "solution.py").read_text()
    func = next(n for n in ast.parse(solution).body
                if isinstance(n, ast.FunctionDef) and n.name == "_split_kv_launch")
    func.name = "launch_planned"
    (tmp_path / "labs" / "lab04_decode_kernels").mkdir(parents=True)
    (tmp_path / "labs" / "lab04_decode_kernels" / "_plan.py").write_text(ast.unparse(func))
    found = overlaps(tmp_path)
    assert any(todo.endswith(":_split_kv_launch") and r > 0.95 for r, _, todo in found), found


@pytest.mark.parametrize("source", [
    "from reference.oracle import attention_ref\n",
    "from reference.oracle import attention_ref as ref\n",
    "from reference import oracle\nout = oracle.attention_ref(q, k, v)\n",
    "import reference.oracle\nout = reference.oracle.attention_ref(q, k, v)\n",
])
def test_a_starter_using_the_overlapping_helper_is_noted(source):
    """``pagedlab grade`` notes (for the instructor) a starter that imports or calls the shipped
    helper its TODO overlaps, in every import form; the note names the helper and the TODO."""
    from reference.grader.answers import helper_uses

    notes = helper_uses("lab03_paged_attention_oracle", source)
    assert len(notes) == 1 and "reference.oracle.attention_ref" in notes[0], notes
    assert "dense_attention" in notes[0]


@pytest.mark.parametrize("helper, todo", [("paged_decode_ref", "paged_decode"),
                                          ("paged_prefill_ref", "paged_prefill")])
def test_a_starter_using_a_paged_oracle_is_noted(helper, todo):
    """The float64 paged oracles answer Lab 3's paged functions without resembling them (no
    online softmax): a starter that calls one is noted like one using attention_ref."""
    from reference.grader.answers import helper_uses

    notes = helper_uses("lab03_paged_attention_oracle",
                        f"from reference import oracle\nout = oracle.{helper}(q)\n")
    assert len(notes) == 1 and f"reference.oracle.{helper}" in notes[0] and todo in notes[0], notes


def test_untouched_starters_and_unrelated_imports_are_not_noted():
    """No note for the starters as shipped, for another helper of the same module, or for a lab
    whose given worked example is meant to be used (Lab 4's launchers)."""
    from reference.grader.answers import helper_uses

    for lab in lab_names():
        assert helper_uses(lab, (LABS_DIR / lab / "starter.py").read_text()) == [], lab
    assert helper_uses("lab03_paged_attention_oracle",
                       "from reference.oracle import gather_kv\n") == []
    assert helper_uses("lab04_decode_kernels",
                       "from labs.lab04_decode_kernels._launch import launch_naive\n") == []
