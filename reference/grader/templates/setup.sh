#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (written by
# `pagedlab gradescope-bundle`). It makes a virtual environment with the CPU build of torch and
# the workbook's test dependencies; run_autograder grades with it.
#
# Outside Gradescope: PAGEDLAB_AUTOGRADER_ROOT replaces /autograder, and PAGEDLAB_TORCH_INDEX
# replaces PyTorch's CPU wheel index (set it empty to use pip's configured indexes).
set -euo pipefail
ROOT="${PAGEDLAB_AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
TORCH_INDEX="${PAGEDLAB_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"

if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
    apt-get update && apt-get install -y python3 python3-venv python3-pip
fi
python3 -m venv "$ROOT/venv"
if [ -n "$TORCH_INDEX" ]; then
    # The CPU build first, from its own index (PyPI's torch is the multi-GB CUDA build).
    "$ROOT/venv/bin/pip" install -q "@TORCH@" --index-url "$TORCH_INDEX"
fi
# The workbook's own code always runs from the bundle's files (run_autograder works in a copy);
# installing it here just pulls its dependencies (pytest, hypothesis, pytest-timeout, ...).
"$ROOT/venv/bin/pip" install -q "@TORCH@" -e "$SOURCE[dev]"
"$ROOT/venv/bin/python" -c "import torch, numpy, pytest, hypothesis; print('setup ok: torch', torch.__version__)"
