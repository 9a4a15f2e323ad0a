"""Infrastructure (no points): every .cu file, starter and solution, compiles for sm_80 and sm_90.

Runs wherever nvcc or NVRTC is available (CI has nvcc); no GPU is needed.
"""

from __future__ import annotations

import pytest

from reference.tools.compile import DEFAULT_ARCHS, compile_cu, compiler_available, find_cu_files

# Minutes on 2 cores (builds, subprocess grading runs): CI runs them with `pytest -m slow`.
pytestmark = pytest.mark.slow

CU_FILES = find_cu_files()


@pytest.mark.skipif(compiler_available() is None, reason="neither nvcc nor NVRTC is available")
@pytest.mark.parametrize("path", CU_FILES, ids=[str(p.relative_to(p.parents[2])) for p in CU_FILES])
def test_cu_file_compiles(path):
    """The file compiles (through ptxas) for sm_80 and sm_90, so no student starts from a broken file."""
    ok, log = compile_cu(path, DEFAULT_ARCHS)
    assert ok, f"{path} does not compile for {' and '.join(DEFAULT_ARCHS)}:\n{log}"
