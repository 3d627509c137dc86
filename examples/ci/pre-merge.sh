#!/usr/bin/env bash
# fa3-verify pre-merge check for a repository that vendors the FA3 metadata-precompute guard.
#
# Run it from the repository root before merging (or from a pre-push hook, or any CI system):
#
#   examples/ci/pre-merge.sh path/to/guard.py:should_disable [extra fa3verify gate options]
#
# It skips (exit 0) when the change touches none of the watched paths, runs
# `fa3verify gate` on the guard otherwise, renders an HTML report next to the JUnit XML and JSON,
# and exits with the gate's code: 0 pass, 1 violation, 2 bad input, 3 inconclusive.
#
# Environment (all optional):
#   FA3VERIFY_GUARD     guard spec when no argument is given (file.py:function or package.module:function)
#   FA3VERIFY_BASE      git revision to diff against (default: origin/main, else HEAD~1)
#   FA3VERIFY_WATCH     extended regex of paths that trigger the gate (default: attention|model_runner|
#                       model_executor|server_args|fa3)
#   FA3VERIFY_ALWAYS=1  run even when no watched path changed
#   FA3VERIFY_BUDGET_S  fuzz budget in seconds (default 30)
#   FA3VERIFY_SEED      fuzz seed (default 0: the same cases on every run)
#   FA3VERIFY_OUT       output folder (default fa3verify-out)
#   FA3VERIFY_BIN       the fa3verify command (default: fa3verify on PATH, else python3 -m fa3verify)
#   FA3VERIFY_ALLOW_INCONCLUSIVE=1  treat exit 3 (solver timeout, empty budget) as a pass with a warning

set -euo pipefail

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    usage
    exit 0
fi

guard="${1:-${FA3VERIFY_GUARD:-}}"
[[ $# -gt 0 ]] && shift
if [[ -z "$guard" ]]; then
    echo "pre-merge: error: GUARD: give the guard spec as the first argument or in FA3VERIFY_GUARD" >&2
    echo "           e.g. $0 python/mypkg/attention/fa3_guard.py:should_disable" >&2
    exit 2
fi

watch="${FA3VERIFY_WATCH:-attention|model_runner|model_executor|server_args|fa3}"
budget="${FA3VERIFY_BUDGET_S:-30}"
seed="${FA3VERIFY_SEED:-0}"
out="${FA3VERIFY_OUT:-fa3verify-out}"

# 1. Only run when the change can affect the guard or the backend.
if [[ "${FA3VERIFY_ALWAYS:-0}" != "1" ]] && git rev-parse --git-dir >/dev/null 2>&1; then
    base="${FA3VERIFY_BASE:-}"
    if [[ -z "$base" ]]; then
        if git rev-parse --verify --quiet origin/main >/dev/null; then base=origin/main; else base=HEAD~1; fi
    fi
    guard_file="${guard%:*}"
    if git rev-parse --verify --quiet "${base}^{commit}" >/dev/null; then
        changed="$({ git diff --name-only "$base"...HEAD; git diff --name-only HEAD; } 2>/dev/null || true)"
        if ! grep -Eq "$watch" <<<"$changed" && ! grep -Fqx "$guard_file" <<<"$changed"; then
            echo "pre-merge: nothing matching /$watch/ and no change to $guard_file since $base:" \
                 "fa3-verify gate skipped (FA3VERIFY_ALWAYS=1 to run it anyway)"
            exit 0
        fi
    else
        echo "pre-merge: cannot resolve $base; running the gate"
    fi
fi

# 2. Find fa3verify.
if [[ -n "${FA3VERIFY_BIN:-}" ]]; then
    read -r -a fa3verify <<<"$FA3VERIFY_BIN"
elif command -v fa3verify >/dev/null 2>&1; then
    fa3verify=(fa3verify)
elif python3 -c "import fa3verify" >/dev/null 2>&1; then
    fa3verify=(python3 -m fa3verify)
else
    echo "pre-merge: error: fa3verify is not installed; install it from a checkout: pip install ./fa3-verify" >&2
    exit 2
fi

# 3. Run the gate.
mkdir -p "$out"
echo "pre-merge: fa3verify gate --guard $guard (budget ${budget}s, seed $seed) -> $out/"
set +e
"${fa3verify[@]}" gate --guard "$guard" --budget-s "$budget" --seed "$seed" \
    --cases-dir "$out/cases" --junit "$out/report.xml" --json "$out/gate.json" "$@"
rc=$?
set -e

if [[ -f "$out/gate.json" ]]; then
    "${fa3verify[@]}" report "$out/gate.json" --html "$out/gate.html" >/dev/null || true
fi

case "$rc" in
    0) echo "pre-merge: PASS: the guard keeps reused FA3 metadata within the call's buffers" ;;
    1) echo "pre-merge: FAIL: a violation was found; replay the case files above (fa3verify replay CASE.json)," \
            "report: $out/gate.html" >&2 ;;
    2) echo "pre-merge: BAD INPUT: see the message above (guard spec or options)" >&2 ;;
    3) if [[ "${FA3VERIFY_ALLOW_INCONCLUSIVE:-0}" == "1" ]]; then
           echo "pre-merge: WARNING: inconclusive (solver timeout or empty budget); allowed by" \
                "FA3VERIFY_ALLOW_INCONCLUSIVE=1" >&2
           rc=0
       else
           echo "pre-merge: INCONCLUSIVE: raise FA3VERIFY_BUDGET_S or the z3 timeout (--timeout-s)" >&2
       fi ;;
    *) echo "pre-merge: fa3verify exited with $rc" >&2 ;;
esac
exit "$rc"
