"""Trusted shared code for the PagedAttention Lab workbook.

Nothing in this package is a lab solution. It holds what every lab leans on: the implementation
loader (``LAB_IMPL``), the grader, the test-strength check, float64 oracles, seeded input
generators, the CUDA loader, benchmarks and the ``pagedlab`` command line.
"""
