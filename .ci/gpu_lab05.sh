#!/usr/bin/env bash
# Lab 5 on a GPU machine: the GPU tests, the GPU-only mutants and `pagedlab bench prefill`.
# Usage: .ci/gpu_lab05.sh [tests] [mutants] [bench] [diag]   (default: tests mutants bench)
# (diag: the tensor-core kernel under compute-sanitizer racecheck and memcheck)
# Logs, JSON and the plot go to $OUT (default bench_results/lab05). FlashInfer is installed from
# .whl/ when that folder is present (see reference/tools/flashinfer_wheels.sh).
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench_results/lab05}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(tests mutants bench)

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-} CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} \
              FLASHINFER_WORKSPACE_BASE=/tmp/fi
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv \
  | tee "$OUT/gpu.txt"
python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/gpu.txt"

status=0
for phase in "${phases[@]}"; do
  echo "=== $phase ($(date +%T))"
  case "$phase" in
    tests)
      timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest labs/lab05_prefill_kernels -q \
        -p no:cacheprovider --tb=short -rfE 2>&1 | tee "$OUT/tests.log" || status=1 ;;
    mutants)
      timeout "${MUTANTS_TIMEOUT:-240}" python3 -m reference.tools.cli check 5 --skip-solution \
        --skip-starter -j "${MUTANT_JOBS:-4}" 2>&1 | tee "$OUT/mutants.log" || status=1 ;;
    bench)
      timeout "${BENCH_TIMEOUT:-240}" python3 -m reference.tools.cli bench prefill --out "$OUT" \
        ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || status=1 ;;
    diag)  # the tensor-core kernel under racecheck and memcheck (cp.async + ldmatrix)
      CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
      SCRIPT=$(python3 -c 'from labs.lab05_prefill_kernels.test_lab05_kernels import RACECHECK_SCRIPT as S; print(S.format(kernel="tc"))')
      for tool in racecheck memcheck; do
        timeout "${DIAG_TIMEOUT:-60}" "$CS" --tool $tool --print-limit 5 python3 -c "$SCRIPT" 2>&1 \
          | grep -v "^$" | tail -25 | tee -a "$OUT/sanitizer_tc.log" || status=1
      done ;;
    *) echo "unknown phase $phase"; status=2 ;;
  esac
done
echo "=== done ($(date +%T)), status $status"
exit $status
