"""The ``pagedlab`` command line (``cli``) and its tools: ``doctor``, ``status``, ``compile``,
``labinfo`` and the benchmarks (``bench``). Nothing a lab imports."""
