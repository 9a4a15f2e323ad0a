#!/usr/bin/env bash
# The workbook under every Python it supports that this machine has (3.10, 3.12, 3.13; CI's
# own run covers python3). For each interpreter found — on PATH as python3.X, or installed by
# pyenv under $PYENV_ROOT/versions/ — in a fresh clone of this repository:
#
#   smoke (default): install the workbook alone (no torch: seconds, not gigabytes) and check that
#     `pagedlab --help` and `pagedlab doctor` run and end without a traceback;
#   --quickstart: the README's two Quickstart commands as printed (python3 -> python3.X).
#     NOTE: on Linux this downloads the registry's CUDA build of torch (2.7 GB, ~4.8 GB on disk)
#     per interpreter: only the cp311 CPU wheel may lie on a local disk.
#
# An interpreter that is not installed is reported and skipped, never downloaded (no registry
# ships CPython itself). Exit 1 when any check fails. Usage: .ci/python_versions.sh [--quickstart] [3.X ...]
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
MODE=smoke
VERSIONS=()
for arg in "$@"; do
  case "$arg" in
    --quickstart) MODE=quickstart ;;
    3.*) VERSIONS+=("$arg") ;;
    *) echo "unknown argument $arg"; exit 2 ;;
  esac
done
[ ${#VERSIONS[@]} -eq 0 ] && VERSIONS=(3.10 3.12 3.13)
WORK=$(mktemp -d /tmp/pagedlab-pyver-XXXXXX)
FAILED=0

find_python() {  # prints a working interpreter for version $1, or nothing
  local v=$1 cand
  for cand in "$(command -v "python$v" 2>/dev/null)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v"; do
    if [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c 'import sys, venv' >/dev/null 2>&1; then
      echo "$cand"; return
    fi
  done
}

check() {  # check NAME LOG COMMAND...: runs it; fails on a traceback or an exit code above 1
  local name=$1 log=$2; shift 2
  "$@" >"$log" 2>&1
  local rc=$?
  if grep -q "^Traceback" "$log" || [ $rc -gt 1 ]; then
    echo "  FAIL $name (exit $rc; log $log)"; tail -5 "$log" | sed 's/^/       /'; FAILED=1
  else
    echo "  ok   $name (exit $rc)"
  fi
}

for v in "${VERSIONS[@]}"; do
  py=$(find_python "$v")
  if [ -z "$py" ]; then
    echo "== Python $v: not installed here, skipped"
    continue
  fi
  echo "== Python $v: $py ($MODE)"
  clone="$WORK/py$v"
  # The commit checked out here (a clone of a worktree would otherwise take another HEAD).
  git clone -q --no-checkout "$REPO" "$clone" && git -C "$clone" checkout -q "$(git rev-parse HEAD)" \
    && cd "$clone" || { echo "  FAIL clone"; FAILED=1; continue; }
  if [ "$MODE" = smoke ]; then
    "$py" -m venv .venv
    # The workbook without its dependencies, plus tomli where TOML is not in the stdlib (3.10).
    check "install (no deps)" "$WORK/py$v-install.log" \
      .venv/bin/pip install -q --disable-pip-version-check --no-deps -e . "tomli>=2; python_version < '3.11'"
    check "pagedlab --help" "$WORK/py$v-help.log" .venv/bin/pagedlab --help
    check "pagedlab doctor" "$WORK/py$v-doctor.log" .venv/bin/pagedlab doctor
    grep -E "^(ok  |MISS|--  ) (Python|torch) " "$WORK/py$v-doctor.log" | sed 's/^/       /'
  else
    # The README's Quickstart, word for word but for the interpreter.
    quick=$(sed -n '/^## Quickstart/,/^## /p' README.md | sed -n '/^```bash$/,/^```$/p' | sed '1d;$d' | head -2)
    first=$(echo "$quick" | sed -n 1p | sed "s/^python3 /$(echo "$py" | sed 's/[\/&]/\\&/g') /")
    second=$(echo "$quick" | sed -n 2p)
    start=$SECONDS
    env -u VIRTUAL_ENV -u LAB_IMPL bash -c "$first && $second" >"$WORK/py$v-quick.log" 2>&1
    rc=$?
    echo "  Quickstart exit $rc in $((SECONDS - start)) s; $(grep -E '^score ' "$WORK/py$v-quick.log" | tail -1); $(tail -1 "$WORK/py$v-quick.log")"
    echo "  environment: $(du -sh .venv | cut -f1)"
    [ $rc -eq 0 ] || { echo "  FAIL Quickstart (log $WORK/py$v-quick.log)"; FAILED=1; }
  fi
  cd "$REPO"
done
echo "logs in $WORK"
exit $FAILED
