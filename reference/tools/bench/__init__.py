"""Benchmarks: ``pagedlab bench <name>`` runs ``reference/tools/bench/<name>.py``'s ``main(argv)``.

Each prints a table, writes JSON (and a PNG plot where matplotlib is installed) with the device
name and date, so figures in handouts and notebooks are traceable to a run.
"""
