#!/usr/bin/env bash
# Lab 4 on a GPU machine in one pass: GPU tests, GPU mutants, the decode benchmark (with
# FlashInfer when its wheels are in .whl/). Run from the repository root; logs and results go
# to $OUT (default /tmp/lab04_out). Each stage has a time limit so the logs always come back.
set -uo pipefail
OUT=${OUT:-/tmp/lab04_out}
mkdir -p "$OUT/bench"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} FLASHINFER_WORKSPACE_BASE=/tmp/fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
{
  nvidia-smi -L
  python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__, torch.cuda.get_device_name())"
  command -v compute-sanitizer || ls -l "$CUDA_HOME/bin/compute-sanitizer"
  nproc
} > "$OUT/env.log" 2>&1

stamp "start: FlashInfer JIT warm-up and mutants in the background, tests in the foreground"
MAX_JOBS=${MAX_JOBS:-6} timeout "${WARM_S:-230}" python3 .ci/lab04_warm_flashinfer.py > "$OUT/fi_warm.log" 2>&1 &
WARM=$!
( timeout "${MUTANTS_S:-250}" python3 -m reference.tools.cli check lab04_decode_kernels --skip-solution \
    --skip-starter -j "${JOBS:-3}"; echo "exit $?" ) > "$OUT/mutants.log" 2>&1 &
MUT=$!
( timeout "${TESTS_S:-230}" python3 -m pytest labs/lab04_decode_kernels tests/test_lab04_naive_baseline.py \
    -q -p no:cacheprovider -rs --durations=15; echo "exit $?" ) > "$OUT/tests.log" 2>&1
stamp "tests done: $(tail -n 3 "$OUT/tests.log" | head -n 1)"
wait $MUT; stamp "mutants done: $(grep -c caught "$OUT/mutants.log") caught"
wait $WARM; stamp "flashinfer warm-up done: $(tail -n 1 "$OUT/fi_warm.log")"
( timeout "${BENCH_S:-200}" python3 -m reference.tools.cli bench decode --out "$OUT/bench" ${BENCH_ARGS:-}; echo "exit $?" ) \
  > "$OUT/bench.log" 2>&1
stamp "bench done"
tail -n 45 "$OUT/bench.log"
grep -E "passed|failed|error" "$OUT/tests.log" | tail -n 3
grep -E "caught|PROBLEM|problem" "$OUT/mutants.log" | tail -n 20
