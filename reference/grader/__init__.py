"""The grader and the release machinery: nothing a lab imports.

The pytest plugin (``grading``) and its signed log (``signed_log``), the per-lab runner
(``runner``), the grade table and reports (``grade``, ``gradebook``, ``results``), hidden tests
(``hidden``), the release and its manifest (``release``, ``manifest``, ``parity``,
``notebook_strip``), the grading paths (``classroom``, ``gradescope``, ``autograder``), and the
test-strength check (``mutants``, ``strength``).
"""
