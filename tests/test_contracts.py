"""Infrastructure (no points): the contract check finds what tests demand but nobody states, and
every lab passes it."""

from __future__ import annotations

import textwrap

import pytest

import reference.grader.contracts as contracts
from reference.grader.contracts import check_lab_contract, match_words
from reference.paths import lab_names


@pytest.mark.parametrize("lab", lab_names())
def test_every_lab_states_its_contract(lab):
    """Every match= word and every implementation attribute a lab's tests or helpers read is
    named in the lab's handout or starter docstrings."""
    problems = check_lab_contract(lab).problems()
    assert not problems, "\n".join(problems) + "\n(state them in the handout or starter docstrings)"


def test_match_words_keep_names_and_drop_regex():
    """A pattern's words are its identifiers (3+ characters) and every name= fragment, however
    short, kept with its = (the handout must show it so); regex escapes and metacharacters are
    not words."""
    assert match_words(r"\bn=2\b") == {"n="}
    assert match_words("block_id=2") == {"block_id", "block_id="}
    assert match_words(r"block_ids\[0\] .* repeats") == {"block_ids", "repeats"}
    assert match_words("num_new_tokens") == {"num_new_tokens"}


def _lab(tmp_path, handout: str, starter: str, test: str, helper: str = "") -> str:
    lab = tmp_path / "lab09_demo"
    lab.mkdir()
    (lab / "README.md").write_text(handout)
    (lab / "starter.py").write_text(textwrap.dedent(starter))
    (lab / "test_lab09_demo.py").write_text(textwrap.dedent(test))
    if helper:
        (lab / "_state.py").write_text(textwrap.dedent(helper))
    return lab.name


def test_unstated_words_and_attributes_are_reported(tmp_path, monkeypatch):
    """A match= word given through a parametrize list or a helper's argument (a name= fragment
    also with its =), an attribute read by a helper on an object the implementation built, and
    an impl.X the starter does not define are all reported; words the docstrings state are
    not."""
    monkeypatch.setattr(contracts, "LABS_DIR", tmp_path)
    lab = _lab(tmp_path, "# Lab 9\nErrors name `budget`.\n", '''
        """Lab 9."""
        class Pool:
            """A pool.

            Attributes:
                num_blocks: blocks in the pool.
            """
    ''', '''
        import pytest
        from _state import check

        def _refused(call, error, match=None):
            with pytest.raises(error, match=match):
                call()

        @pytest.mark.parametrize("value, word", [(1, "budget"), (2, "secret_word")])
        def test_a(impl, value, word):
            pool = impl.Pool()
            with pytest.raises(ValueError, match=word):
                pool.grow(value)
            _refused(lambda: pool.grow(3), ValueError, "hidden_rule=")
            check(pool)
            impl.UNDEFINED_CONSTANT
    ''', helper='''
        def check(pool):
            assert pool.num_blocks >= pool.num_slots
    ''')
    report = check_lab_contract(lab)
    assert set(report.missing_match_words) == {"secret_word", "hidden_rule", "hidden_rule="}
    assert set(report.missing_attributes) == {"num_slots", "grow", "UNDEFINED_CONSTANT"}
    assert all(lab in line for line in report.problems())


def test_given_modules_the_starter_imports_count_as_stated(tmp_path, monkeypatch):
    """Given code kept once in a protected ``_*.py`` module (a base class the starter subclasses)
    states what it sets and documents, exactly as if it sat in the starter; a ``_*.py`` the
    starter does not import (a test helper) states nothing."""
    monkeypatch.setattr(contracts, "LABS_DIR", tmp_path)
    lab = _lab(tmp_path, "# Lab 9\n", '''
        """Lab 9."""
        from labs.lab09_demo._base import PoolBase

        class Pool(PoolBase):
            """A pool."""
    ''', '''
        import pytest

        def test_a(impl):
            pool = impl.Pool()
            assert pool.num_blocks > pool.peak_num_used_blocks
            with pytest.raises(ValueError, match="budget"):
                pool.grow(1)
            assert pool.helper_only_word
    ''', helper='''
        """Test helper: mentions helper_only_word."""
    ''')
    (tmp_path / lab / "_base.py").write_text(textwrap.dedent('''
        """Given: the pool's constructor. Errors name the budget."""
        class PoolBase:
            def __init__(self):
                self.num_blocks = 4
                self.peak_num_used_blocks = 0

            def grow(self, n):
                """Grows the pool."""
    '''))
    report = check_lab_contract(lab)
    assert set(report.missing_match_words) == set()
    assert set(report.missing_attributes) == {"helper_only_word"}


def test_a_test_helper_the_starter_does_not_import_states_nothing(tmp_path, monkeypatch):
    """Docstrings and names of a lab's own ``_*.py`` module that the starter imports (given code
    a student reads) state a contract; a test helper the starter does not import states
    nothing."""
    monkeypatch.setattr(contracts, "LABS_DIR", tmp_path)
    lab = _lab(tmp_path, "# Lab 9\n", '''
        """Lab 9."""
        from labs.lab09_demo._given import PoolBase

        class Pool(PoolBase):
            """A pool."""
    ''', '''
        import pytest

        def test_a(impl):
            pool = impl.Pool()
            with pytest.raises(ValueError, match="given_word"):
                pool.grow(-1)
            with pytest.raises(ValueError, match="helper_word"):
                pool.shrink(-1)
            assert pool.num_free_rows >= 0 and pool.num_slots >= 0
    ''', helper='''
        def check(pool):
            """Mentions helper_word and num_slots, which a student is not told here."""
    ''')
    (tmp_path / lab / "_given.py").write_text(textwrap.dedent('''
        """Given code: grow() refuses a negative size (the message names given_word)."""

        class PoolBase:
            num_free_rows: int

            def grow(self, n):
                """Grows the pool."""

            def shrink(self, n):
                """Shrinks the pool."""
    '''))
    report = check_lab_contract(lab)
    assert set(report.missing_match_words) == {"helper_word"}
    assert set(report.missing_attributes) == {"num_slots"}


def test_a_name_fragment_must_be_stated_with_its_equals_sign(tmp_path, monkeypatch):
    """``match="block_id=3"``: a handout that names `block_id` but never shows `block_id=` is
    reported (the Lab 1 gap a student found, 2026-11-29); one that shows `block_id=3` is not."""
    monkeypatch.setattr(contracts, "LABS_DIR", tmp_path)
    test = '''
        import pytest

        def test_a(impl):
            with pytest.raises(ValueError, match="block_id=3"):
                impl.free(3)
    '''
    starter = '''
        """Lab 9."""
        def free(block_id):
            """Frees a block."""
    '''
    lab = _lab(tmp_path, "# Lab 9\nThe message names the block id (`block_id`).\n", starter, test)
    assert set(check_lab_contract(lab).missing_match_words) == {"block_id="}
    (tmp_path / lab / "README.md").write_text("# Lab 9\nThe message says `block_id=3`.\n")
    assert not check_lab_contract(lab).missing_match_words
