"""Trusted shared code for the PagedAttention Lab workbook. Nothing here is a lab solution.

This package has three homes, one per audience:

* ``reference/`` itself — what labs, tests and notebooks import (about a thousand lines; read
  these, you will meet them in the handouts):

  ``errors``           typed errors every lab raises (``OutOfBlocksError``, ...)
  ``checks``           small argument checks that raise those errors, naming the argument
  ``layout``           the one KV-cache layout and its constants (``PAD_BLOCK_ID``)
  ``block_allocator``  a trusted allocator with Lab 1's interface (Lab 2 runs on it)
  ``oracle``           float64 attention oracles (Labs 3-5 are checked against them)
  ``inputs``           seeded paged K/V caches with poisoned padding
  ``cuda``, ``gpu``    the CUDA loader/launcher for ``.cu`` files, and "is there a GPU?"
  ``loader``, ``paths`` ``LAB_IMPL``: which implementation the tests load, and where things live
  ``include/``         CUDA headers shared by the kernel labs (PTX wrappers)

* ``reference.grader`` — the grader and the release machinery (pytest plugin, signed log,
  runner, manifest, release, Classroom and Gradescope, mutants and the strength check).
  Instructors and maintainers read it; students never need to.

* ``reference.tools`` — the ``pagedlab`` command line and its helpers (``doctor``, ``status``,
  ``compile``) and the benchmarks (``reference.tools.bench``).
"""
