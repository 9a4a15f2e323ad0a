#!/usr/bin/env bash
# Fetches FlashInfer — the library `pagedlab bench decode` and `pagedlab bench prefill` compare
# your kernels against — as wheels, for a GPU machine that cannot reach the package registry.
# Run it from the repository root on any machine that can; the wheels land in .whl/ (ignored by
# git). Copy .whl/ to the GPU machine; there `.ci/gpu` (workbook repository) installs them, or do
# it by hand before the benchmark:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PYTHONPATH CUDA_HOME=/usr/local/cuda FLASHINFER_WORKSPACE_BASE=/tmp/fi
#
# A GPU machine that reaches the registry needs none of this: pip install flashinfer-python==0.6.7.post3
# NOTE: FlashInfer compiles its kernels with the GPU machine's nvcc the first time they run (1-4
# minutes), so that machine needs the CUDA toolkit. `.ci/gpu` hands that JIT cache back as
# $OUT/flashinfer_jit_cache.tgz: copy it into .whl/ and the next `.ci/gpu` starts with it. The
# committed benchmarks used 0.6.7.post3 with torch 2.11 and CUDA 13.0 on an H200.
#
# Usage: bash reference/tools/flashinfer_wheels.sh [PYTHON_VERSION]   (the GPU machine's; default 3.12)
set -euo pipefail
PY=${1:-3.12}
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  flashinfer-python==0.6.7.post3 'apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0' cuda-tile
ls -la .whl
