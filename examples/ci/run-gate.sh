#!/usr/bin/env bash
# The steps of fa3-verify's CI recipe (examples/ci/github-workflow*.yml), one subcommand per workflow step, so the
# workflow and a local run (and the test suite: tests/test_ci_recipe.py) run the same lines.
#
#   run-gate.sh cache-key     print the cache key: the hash of every engine recipe and of the torch pin
#   run-gate.sh install       venv, uv, torch's CPU build (python -m gpu_impl.engines.torch_build), fa3-verify
#   run-gate.sh gate [ARGS]   fa3verify gate with the settings below (+ ARGS); exits with the gate's code
#   run-gate.sh report        HTML report and a job summary of the failing rows (to $GITHUB_STEP_SUMMARY)
#   run-gate.sh all [ARGS]    install (unless FA3VERIFY_BIN is set), gate, report; exits with the gate's code
#
# The gate's code: 0 pass, 1 violation, 2 bad input, 3 inconclusive (FA3VERIFY_ALLOW_INCONCLUSIVE=1: 3 passes).
#
# Environment (all optional):
#   FA3VERIFY_ENGINE    system under test: sglang-src=PATH (an sglang checkout's python/), sglang==V,
#                       vllm-src=PATH (a vLLM checkout's root), vllm==V or model (default: model, with FA3VERIFY_GUARD)
#   FA3VERIFY_GUARD     guard spec for the model (file.py:function, package.module:function, fixed, pre-fix, none)
#   FA3VERIFY_BUDGET_S  fuzz budget in seconds (default 60)
#   FA3VERIFY_CASES     fuzz case count instead of the budget (same seed: byte-identical case files)
#   FA3VERIFY_SEED      fuzz seed (default 0)
#   FA3VERIFY_OUT       output folder (default fa3verify-out): report.xml, gate.json, gate.html, summary.md,
#                       gate.log, exit-code, cases/
#   FA3VERIFY_SRC       fa3-verify's sources (default: the checkout this script is in)
#   FA3VERIFY_VENV      the environment fa3-verify is installed into (default .fa3verify-venv)
#   FA3VERIFY_PYTHON    the Python 3.11 that makes it (default python3.11, else python3)
#   FA3VERIFY_BIN       the fa3verify command to use instead of installing (e.g. "python -m fa3verify")
#   FA3VERIFY_DRY_RUN=1 install: print the commands, run none
#   FA3VERIFY_ALLOW_INCONCLUSIVE=1  treat the gate's exit 3 as a pass, with a warning

set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="${FA3VERIFY_SRC:-$(cd "$here/../.." && pwd)}"
out="${FA3VERIFY_OUT:-fa3verify-out}"
venv="${FA3VERIFY_VENV:-.fa3verify-venv}"

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

base_python() {
    if [[ -n "${FA3VERIFY_PYTHON:-}" ]]; then echo "$FA3VERIFY_PYTHON"
    elif command -v python3.11 >/dev/null 2>&1; then echo python3.11
    else echo python3
    fi
}

fa3verify_cmd() {  # sets the array `fa3verify`
    if [[ -n "${FA3VERIFY_BIN:-}" ]]; then
        read -r -a fa3verify <<<"$FA3VERIFY_BIN"
    elif [[ -x "$venv/bin/fa3verify" ]]; then
        fa3verify=("$venv/bin/fa3verify")
    else
        echo "run-gate: error: FA3VERIFY_VENV: no fa3verify in $venv (run \`$0 install\` first, or set FA3VERIFY_BIN)" >&2
        exit 2
    fi
}

run() {  # print a command, then run it unless FA3VERIFY_DRY_RUN=1
    echo "run-gate: $*" >&2
    [[ "${FA3VERIFY_DRY_RUN:-0}" == "1" ]] || "$@"
}

cmd_cache_key() {
    PYTHONPATH="$src" "$(base_python)" -c '
import hashlib
from gpu_impl.engines import recipes, vllm_recipes
parts = [recipes.TORCH] + [recipes.recipe_hash(r) for r in recipes.RELEASES]
parts += [recipes.hash_recipe(vllm_recipes.recipe(r)) for r in vllm_recipes.RELEASES]
print("fa3verify-" + hashlib.sha256(" ".join(parts).encode()).hexdigest()[:16])'
}

cmd_install() {
    local py="$venv/bin/python"
    [[ -x "$py" ]] || run "$(base_python)" -m venv "$venv"
    run "$py" -m pip install -q --disable-pip-version-check "uv>=0.13"
    # torch's CPU build: the configured indexes' +cpu build, else uv's --torch-backend cpu (never the CUDA build)
    if [[ "${FA3VERIFY_DRY_RUN:-0}" == "1" ]] || ! "$py" -c "import torch" 2>/dev/null; then
        (cd "$src" && run "$py" -m gpu_impl.engines.torch_build --python "$py")
    fi
    # fa3-verify itself, with uv when pip's configuration translates (hard links from the uv cache), else pip
    (cd "$src" && run "$py" -m gpu_impl.engines.installers install --python "$py" "$src")
}

cmd_gate() {
    fa3verify_cmd
    local args=(gate --seed "${FA3VERIFY_SEED:-0}" --cases-dir "$out/cases" --junit "$out/report.xml"
                --json "$out/gate.json")
    if [[ -n "${FA3VERIFY_CASES:-}" ]]; then args+=(--cases "$FA3VERIFY_CASES")
    else args+=(--budget-s "${FA3VERIFY_BUDGET_S:-60}")
    fi
    [[ -n "${FA3VERIFY_ENGINE:-}" ]] && args+=(--engine "$FA3VERIFY_ENGINE")
    [[ -n "${FA3VERIFY_GUARD:-}" ]] && args+=(--guard "$FA3VERIFY_GUARD")
    mkdir -p "$out"
    rm -f "$out/gate.json" "$out/exit-code"
    echo "run-gate: ${fa3verify[*]} ${args[*]} $*" >&2
    local rc=0
    "${fa3verify[@]}" "${args[@]}" "$@" 2>&1 | tee "$out/gate.log" || rc=${PIPESTATUS[0]}
    echo "$rc" >"$out/exit-code"
    if [[ "$rc" == 3 && "${FA3VERIFY_ALLOW_INCONCLUSIVE:-0}" == "1" ]]; then
        echo "run-gate: WARNING: inconclusive (exit 3), allowed by FA3VERIFY_ALLOW_INCONCLUSIVE=1" >&2
        rc=0
    fi
    return "$rc"
}

cmd_report() {
    mkdir -p "$out"
    rm -f "$out/summary.md"
    if [[ -f "$out/gate.json" ]]; then
        fa3verify_cmd
        "${fa3verify[@]}" report "$out/gate.json" --html "$out/gate.html" >/dev/null \
            || echo "run-gate: the HTML report could not be rendered" >&2
    fi
    local summary="${GITHUB_STEP_SUMMARY:-}" code
    code="$(tr -dc 0-9 <"$out/exit-code" 2>/dev/null || true)"
    # the job summary from the tool: the failed rows, or NO RESULT (report exits 2) when gate.json is missing
    if [[ -n "${FA3VERIFY_BIN:-}" || -x "$venv/bin/fa3verify" ]]; then
        fa3verify_cmd
        "${fa3verify[@]}" report "$out/gate.json" --markdown "$out/summary.md" --log "$out/gate.log" \
            ${code:+--exit-code "$code"} >/dev/null || true
    fi
    if [[ ! -s "$out/summary.md" ]]; then  # fa3-verify itself is not installed: nothing ran
        printf '## fa3verify gate: NO RESULT (exit %s)\n\nfa3-verify is not installed in %s (the install step failed).\n' \
            "${code:-?}" "$venv" >"$out/summary.md"
    fi
    if [[ -n "$summary" ]]; then cat "$out/summary.md" >>"$summary"; fi
    cat "$out/summary.md"
}

sub="${1:-}"
[[ $# -gt 0 ]] && shift
case "$sub" in
    -h|--help) usage; exit 0 ;;
    cache-key) cmd_cache_key ;;
    install) cmd_install ;;
    gate) cmd_gate "$@" ;;
    report) cmd_report ;;
    all)
        [[ -n "${FA3VERIFY_BIN:-}" ]] || cmd_install
        rc=0; cmd_gate "$@" || rc=$?
        cmd_report >/dev/null
        exit "$rc" ;;
    *) echo "run-gate: error: subcommand: want cache-key, install, gate, report or all, got '${sub}'" >&2; exit 2 ;;
esac
