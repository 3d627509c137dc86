#!/usr/bin/env bash
# One prepared run of `fa3verify gpu-check` (real FA3 on an sm90 GPU), or its CPU dry run.
#
#   bash scripts/gpu_check.sh              # on the GPU machine: ~4-7 minutes, ends within 8
#   bash scripts/gpu_check.sh --dry-run    # anywhere: the same stages on CPU with the emulated kernel (~1 min)
#
# Any other arguments go to `fa3verify gpu-check` (--fidelity-configs N, --fuzz-budget-s S, --out DIR, ...).
# Steps: pick a Python (PYTHON, else ./.venv/bin/python, else python3); on a real run, if no FA3 module
# imports and .whl/ holds wheels (the fa3-fwd wheel, carried there), install them into /tmp/site and put
# it on PYTHONPATH; unpack .fa3builds/vllm-V.tar.xz (vLLM's FA3, scripts/prepare_fa3_builds.py) and pass each as
# --fa3-build; run the check unbuffered, teeing a log; copy the summary, the log, the JUnit XML and
# the case files (as one tarball) to $OUT when it is set. The exit status is gpu-check's:
# 0 every stage met its expectation, 1 one did not, 3 a stage could not run, 2 bad arguments.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
REPO=$(pwd)

DRY=0
OUT_DIR=""
prev=""
for arg in "$@"; do
  [ "$arg" = "--dry-run" ] && DRY=1
  [ "$prev" = "--out" ] && OUT_DIR="$arg"
  case "$arg" in --out=*) OUT_DIR="${arg#--out=}" ;; esac
  prev="$arg"
done
EXTRA=()
if [ -z "$OUT_DIR" ]; then
  OUT_DIR="fa3verify-out/gpu-check"
  EXTRA=(--out "$OUT_DIR")
fi

if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
elif [ -x "$REPO/.venv/bin/python" ]; then
  PY="$REPO/.venv/bin/python"
else
  PY=$(command -v python3 || command -v python)
fi
export PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

fa3_importable() {
  "$PY" - <<'EOF' >/dev/null 2>&1
import importlib, sys
for name in ("fa3_fwd_interface", "flash_attn_interface", "sgl_kernel.flash_attn"):
    try:
        if hasattr(importlib.import_module(name), "flash_attn_with_kvcache"):
            sys.exit(0)
    except Exception:
        pass
sys.exit(1)
EOF
}

if [ "$DRY" = 0 ] && ! fa3_importable; then
  shopt -s nullglob
  wheels=("$REPO"/.whl/*.whl)
  shopt -u nullglob
  if [ "${#wheels[@]}" -gt 0 ]; then
    echo "[gpu_check.sh] no FA3 module importable; installing ${#wheels[@]} carried wheel(s) into /tmp/site"
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "${wheels[@]}"; then
      export PYTHONPATH="$PYTHONPATH:/tmp/site"
    else
      echo "[gpu_check.sh] pip could not install the wheels; gpu-check will report why FA3 is missing"
    fi
  else
    echo "[gpu_check.sh] no FA3 module importable and no wheels in .whl/ (see docs: pip download fa3-fwd==0.0.3)"
  fi
fi

# vLLM's FA3 builds, laid out by scripts/prepare_fa3_builds.py: unpack each and check it as a build of its own
VLLM_ARGS=()
if [ "$DRY" = 0 ]; then
  shopt -s nullglob
  for archive in "$REPO"/.fa3builds/vllm-*.tar.xz; do
    dest=/tmp/fa3builds
    mkdir -p "$dest"
    if tar -xJf "$archive" -C "$dest"; then
      name=$(basename "$archive" .tar.xz)
      VLLM_ARGS+=(--fa3-build "$dest/$name")
      echo "[gpu_check.sh] vLLM FA3 build: $dest/$name"
    else
      echo "[gpu_check.sh] could not unpack $archive; that build is not checked"
    fi
  done
  shopt -u nullglob
fi

mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
echo "[gpu_check.sh] python: $PY; PYTHONPATH=$PYTHONPATH"

# Call the subcommand through the CLI; if the CLI cannot even build its parser here (another subcommand
# needing a package this machine lacks), run the gpu_check module's own entry point instead.
if "$PY" -c "import fa3verify.cli as c; c.build_parser()" >/dev/null 2>&1; then
  CMD=("$PY" -m fa3verify gpu-check)
else
  echo "[gpu_check.sh] fa3verify's CLI does not load here; using python -m fa3verify.commands.gpu_check"
  CMD=("$PY" -m fa3verify.commands.gpu_check)
fi
timeout -k 15 "${GPU_CHECK_TIMEOUT_S:-470}" "${CMD[@]}" "$@" "${EXTRA[@]}" "${VLLM_ARGS[@]}" 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
[ "$status" = 124 ] && echo "[gpu_check.sh] gpu-check was stopped after ${GPU_CHECK_TIMEOUT_S:-470}s" | tee -a "$LOG"

if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  for f in gpu_check_summary.json gpu_check.log gpu_tests.xml; do
    [ -f "$OUT_DIR/$f" ] && cp "$OUT_DIR/$f" "$OUT/"
  done
  if [ -d "$OUT_DIR/cases" ]; then
    tar -czf "$OUT/gpu_check_cases.tar.gz" -C "$OUT_DIR" cases
  fi
  echo "[gpu_check.sh] copied the summary, log, JUnit XML and cases to $OUT"
fi
exit "$status"
