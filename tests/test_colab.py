"""Colab: one repository URL (pyproject.toml's [tool.pagedlab]) behind every badge and every
notebook's setup cell; the setup cell is a no-op where the workbook is importable and, on Colab,
installs the workbook and CuPy and turns on the emulated device without a GPU.
No points: infrastructure."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from reference import colab
from reference.paths import REPO_ROOT


def _labs() -> list[str]:
    return [p.stem for p in sorted((REPO_ROOT / "notebooks").glob("lab*.ipynb"))]


def _first_code_cell(notebook: str) -> str:
    nb = json.loads((REPO_ROOT / "notebooks" / f"{notebook}.ipynb").read_text())
    return "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])


def test_every_copy_agrees_with_pyproject():
    """Each handout's badge, the README's badge line and each notebook's first code cell are
    built from [tool.pagedlab] repository (``python -m reference.colab --write`` after a change)."""
    assert colab.check() == []
    url, branch = colab.settings()
    labs = _labs()
    assert len(labs) == 6
    assert colab.readme_badge(labs) in (REPO_ROOT / "README.md").read_text().splitlines()
    for lab in labs:
        handout = (REPO_ROOT / "labs" / lab / "README.md").read_text().splitlines()
        assert colab.handout_badge(lab) in handout, f"labs/{lab}/README.md has no Colab badge"
        assert f"/blob/{branch}/notebooks/{lab}.ipynb" in colab.handout_badge(lab)
        cell = _first_code_cell(lab)
        assert cell == colab.setup_cell(), f"notebooks/{lab}.ipynb: first code cell is not the setup cell"
        assert f'"{url}"' in cell


def test_the_readme_says_the_url_is_a_placeholder_while_it_is_one():
    """While the URL is the placeholder, the README says plainly that the badges cannot work."""
    if colab.is_placeholder():
        text = " ".join((REPO_ROOT / "README.md").read_text().split())
        assert "placeholder" in text and "the badges lead nowhere" in text


def test_changing_the_url_is_caught_and_written_everywhere(tmp_path):
    """A new URL in pyproject.toml makes every copy disagree (check lists all 13 files);
    write() rewrites them and check() is clean again, with the new URL in each."""
    root = tmp_path / "repo"
    for rel in ["pyproject.toml", "README.md", "notebooks"] + [f"labs/{lab}/README.md" for lab in _labs()]:
        src, dst = REPO_ROOT / rel, root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    pyproject = root / "pyproject.toml"
    url = colab.settings()[0]
    pyproject.write_text(pyproject.read_text().replace(url, "https://github.com/uni-x/paged-2027"))
    assert len(colab.check(root)) == 13
    assert len(colab.write(root)) == 13
    assert colab.check(root) == []
    assert "https://github.com/uni-x/paged-2027" in colab.setup_cell(root)
    assert "github/uni-x/paged-2027/blob/main/notebooks/lab04_decode_kernels.ipynb" in (
        root / "labs/lab04_decode_kernels/README.md").read_text()
    assert not colab.is_placeholder(root)


def test_a_url_colab_cannot_open_is_refused(tmp_path):
    """Colab opens notebooks from GitHub: another URL is refused, naming the setting."""
    (tmp_path / "pyproject.toml").write_text('[tool.pagedlab]\nrepository = "https://example.org/x"\n')
    with pytest.raises(ValueError, match=r"\[tool.pagedlab\] repository"):
        colab.settings(tmp_path)


class _Ran:
    """Records subprocess.run calls instead of running them."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def __call__(self, cmd, *args, **kwargs):
        self.calls.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 0)


def _run_setup_cell(monkeypatch, *, importable: bool, cuda: bool) -> tuple[_Ran, list]:
    import torch

    ran, moved = _Ran(), []
    monkeypatch.setattr(subprocess, "run", ran)
    monkeypatch.setattr(os, "chdir", moved.append)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setenv("PAGEDLAB_DEVICE", "")  # recorded, so the cell's setting is undone
    monkeypatch.delenv("PAGEDLAB_DEVICE")
    if not importable:
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "reference" else real(name, *a))
    exec(compile(colab.setup_cell(), "<setup cell>", "exec"), {})
    return ran, moved


def test_setup_cell_is_a_no_op_where_the_workbook_is_importable(monkeypatch):
    """In a clone (and in CI's nbval run) the cell runs nothing and sets nothing."""
    ran, moved = _run_setup_cell(monkeypatch, importable=True, cuda=False)
    assert ran.calls == [] and moved == []
    assert "PAGEDLAB_DEVICE" not in os.environ


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu-runtime", "gpu-runtime"])
def test_setup_cell_on_colab(monkeypatch, tmp_path, cuda):
    """On Colab (workbook not importable): clone the pyproject URL, install the workbook; with a
    GPU install cupy-cuda12x, without one set PAGEDLAB_DEVICE=emulate (and install no CuPy)."""
    monkeypatch.chdir(tmp_path)  # no clone folder here yet
    ran, moved = _run_setup_cell(monkeypatch, importable=False, cuda=cuda)
    url, branch = colab.settings()
    assert ran.calls[0] == ["git", "clone", "--depth", "1", "--branch", branch, url]
    assert moved == [url.rsplit("/", 1)[-1]]
    assert [sys.executable, "-m", "pip", "install", "-q", "-e", "."] in ran.calls
    cupy = [sys.executable, "-m", "pip", "install", "-q", "cupy-cuda12x"]
    if cuda:
        assert cupy in ran.calls and "PAGEDLAB_DEVICE" not in os.environ
    else:
        assert cupy not in ran.calls and os.environ["PAGEDLAB_DEVICE"] == "emulate"


def test_student_readme_carries_the_same_badge_line():
    """A release's student README has the README's badge line, from the same URL."""
    from reference.grader.student_readme import render_student_readme

    labs = _labs()
    text = render_student_readme(labs, {lab: 1.0 for lab in labs}, "torch==2.13.0")
    assert any(line.startswith(colab.readme_badge(labs)) for line in text.splitlines())
