"""Infrastructure (no points): each handout's Files table names every file of its lab folder.

A student finds their way through a lab by its handout's Files table; a file the table does not
name (a given module added later, a test helper) is one the student meets unexplained. Names may
be globs (``test_lab01_*.py``) and may be written with or without the ``labs/<lab>/`` prefix.
"""

from __future__ import annotations

import fnmatch
import re

import pytest

from reference.paths import LABS_DIR, lab_names

_NAME = re.compile(r"`([\w./*-]+)`")


def files_table(lab: str) -> list[str]:
    """Returns the names written in backticks in the handout's ``## Files`` section."""
    text = (LABS_DIR / lab / "README.md").read_text()
    match = re.search(r"^## Files\n(.*?)^## ", text, re.S | re.M)
    assert match, f"labs/{lab}/README.md has no '## Files' section"
    return _NAME.findall(match.group(1))


@pytest.mark.parametrize("lab", lab_names())
def test_files_table_names_every_file_of_the_lab(lab):
    """Every file in ``labs/<lab>/`` (but ``__init__.py``) matches a name of the Files table."""
    names = [n.split("/")[-1] for n in files_table(lab)]
    unnamed = [p.name for p in sorted((LABS_DIR / lab).iterdir())
               if p.is_file() and p.name != "__init__.py"
               and not any(fnmatch.fnmatch(p.name, n) for n in names)]
    assert not unnamed, (f"labs/{lab}/README.md's Files table does not name {unnamed}: add a row "
                         f"saying what each is (given code, a test helper, ...)")
