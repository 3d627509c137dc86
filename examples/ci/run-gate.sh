#!/usr/bin/env bash
# The steps of fa3-verify's CI recipe (examples/ci/github-workflow*.yml), one subcommand per workflow step, so the
# workflow and a local run (and the test suite: tests/robustness/test_ci_recipe.py) run the same lines.
#
#   run-gate.sh cache-key     print the cache key: the hash of every engine recipe and of the torch pin
#   run-gate.sh install       venv, uv, torch's CPU build (python -m gpu_impl.engines.torch_build), fa3-verify
#   run-gate.sh gate [ARGS]   fa3verify gate with the settings below (+ ARGS); exits with the gate's code
#   run-gate.sh report        HTML report and a job summary of the failing rows (to $GITHUB_STEP_SUMMARY)
#   run-gate.sh all [ARGS]    install (unless FA3VERIFY_BIN is set), gate, report; exits with the gate's code
#
# The gate's code: 0 pass, 1 violation, 2 bad input, 3 inconclusive (FA3VERIFY_ALLOW_INCONCLUSIVE=1: 3 passes).
# A gate that produced no verdict -- fa3verify does not start (a broken install) or it crashed (exit 1 without a
# verdict, an internal error, a signal) -- is exit 3 and never passes, whatever FA3VERIFY_ALLOW_INCONCLUSIVE says.
# Each step leaves its outcome in the output folder for `report`: install.status (ok, or what failed) and
# install.log; outcome (pass, violation, bad-input, inconclusive, crash, not-installed), exit-code and gate.log.
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
#   FA3VERIFY_VENV      the environment fa3-verify is installed into (default .fa3verify-venv; a relative path
#                       is taken from the directory the script is started in, the workspace root in CI)
#   FA3VERIFY_PYTHON    the Python 3.11 that makes it (default python3.11, else python3)
#   FA3VERIFY_BIN       the fa3verify command to use instead of installing (e.g. "python -m fa3verify")
#   FA3VERIFY_DRY_RUN=1 install: print the commands, run none
#   FA3VERIFY_ALLOW_INCONCLUSIVE=1  treat the gate's exit 3 as a pass, with a warning

set -euo pipefail

absolute() {  # a path as given, made absolute from the directory the script was started in
    case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="${FA3VERIFY_SRC:-$(cd "$here/../.." && pwd)}"
out="$(absolute "${FA3VERIFY_OUT:-fa3verify-out}")"
venv="$(absolute "${FA3VERIFY_VENV:-.fa3verify-venv}")"

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
        # found on PATH, as after `. $venv/bin/activate`: the replay lines it prints read `fa3verify replay ...`
        export PATH="$venv/bin:$PATH"
        fa3verify=(fa3verify)
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
from gpu_impl.engines.sglang import recipes
from gpu_impl.engines.vllm import recipes as vllm_recipes
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
    # the installed command must start, away from the sources (a package missing a data file fails here)
    (cd "${TMPDIR:-/tmp}" && run "$venv/bin/fa3verify" --version)
}

install_step() {  # cmd_install with its output in install.log and its outcome in install.status
    if [[ "${FA3VERIFY_DRY_RUN:-0}" == "1" ]]; then cmd_install; return; fi
    mkdir -p "$out"
    echo "failed: the install step did not finish" >"$out/install.status"
    local rc
    set +e
    (set -e; cmd_install) 2>&1 | tee "$out/install.log"
    rc=${PIPESTATUS[0]}
    set -e
    if [[ "$rc" == 0 ]]; then echo ok >"$out/install.status"
    else echo "failed: exit $rc (install.log)" >"$out/install.status"
    fi
    return "$rc"
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
    rm -f "$out/gate.json" "$out/exit-code" "$out/outcome"
    local rc=0
    # fa3verify must start before its exit code can mean anything (a broken install's crash is not a violation)
    "${fa3verify[@]}" --version >"$out/gate.log" 2>&1 || rc=$?
    if [[ "$rc" != 0 ]]; then
        cat "$out/gate.log" >&2
        echo "run-gate: error: fa3verify does not start (${fa3verify[*]} --version exited $rc): the installation is" \
             "broken; no gate ran (exit 3, never allowed as inconclusive)" | tee -a "$out/gate.log" >&2
        echo not-installed >"$out/outcome"
        echo 3 >"$out/exit-code"
        return 3
    fi
    echo "run-gate: ${fa3verify[*]} ${args[*]} $*" >&2
    "${fa3verify[@]}" "${args[@]}" "$@" 2>&1 | tee "$out/gate.log" || rc=${PIPESTATUS[0]}
    local outcome
    outcome="$(gate_outcome "$rc")"
    echo "$outcome" >"$out/outcome"
    case "$outcome" in
        crash)
            echo "run-gate: error: the gate crashed (exit $rc with no verdict; gate.log): not a violation, no" \
                 "result (exit 3, never allowed as inconclusive)" | tee -a "$out/gate.log" >&2
            rc=3 ;;
        inconclusive)
            if [[ "${FA3VERIFY_ALLOW_INCONCLUSIVE:-0}" == "1" ]]; then
                echo "run-gate: WARNING: inconclusive (exit 3), allowed by FA3VERIFY_ALLOW_INCONCLUSIVE=1" >&2
                echo 3 >"$out/exit-code"
                return 0
            fi ;;
    esac
    echo "$rc" >"$out/exit-code"
    return "$rc"
}

gate_outcome() {  # what the gate's exit code $1 means, given the verdict it printed (gate.log) and gate.json
    local verdict=0
    grep -q "^verdict: " "$out/gate.log" 2>/dev/null && verdict=1
    if grep -q "internal error: " "$out/gate.log" 2>/dev/null; then echo crash; return; fi
    case "$1" in
        0) if [[ "$verdict" == 1 || -f "$out/gate.json" ]]; then echo pass; else echo crash; fi ;;
        1) if [[ "$verdict" == 1 || -f "$out/gate.json" ]]; then echo violation; else echo crash; fi ;;
        2) echo bad-input ;;
        3) echo inconclusive ;;
        *) echo crash ;;
    esac
}

no_result() {  # a summary written here: heading $1, then the text $2 and the last lines of log $3
    {
        printf '## fa3verify gate: %s\n\n%s\n' "$1" "$2"
        if [[ -s "$3" ]]; then printf '\nThe last lines of %s:\n\n```\n' "$(basename "$3")"; tail -n 20 "$3"; printf '```\n'; fi
    } >"$out/summary.md"
}

cmd_report() {
    mkdir -p "$out"
    rm -f "$out/summary.md"
    local summary="${GITHUB_STEP_SUMMARY:-}" code outcome install
    code="$(tr -dc 0-9 <"$out/exit-code" 2>/dev/null || true)"
    outcome="$(tr -dc a-z- <"$out/outcome" 2>/dev/null || true)"
    install="$(cat "$out/install.status" 2>/dev/null || true)"
    # what the tool cannot say: the install failed, the gate never ran, fa3verify did not start or crashed
    if [[ -z "$outcome" && -n "$install" && "$install" != ok ]]; then
        no_result "NOT RUN (the install step failed)" "Installing fa3-verify into $venv failed ($install); the gate did not run. This is not a verdict on your change." "$out/install.log"
    elif [[ -z "$outcome" ]]; then
        no_result "NOT RUN (the gate step did not run)" "No gate ran${install:+ (the install step: $install)}: no verdict." ""
    elif [[ "$outcome" == not-installed ]]; then
        no_result "NO RESULT (exit ${code:-3}: fa3verify does not start)" "The install step ${install:+ended \"$install\" but }left a fa3verify that does not start, so no gate ran: a broken installation, not a violation." "$out/gate.log"
    elif [[ "$outcome" == crash ]]; then
        no_result "NO RESULT (exit ${code:-3}: the gate crashed)" "The gate ended without a verdict (a crash, not a violation; the install step: ${install:-not run here})." "$out/gate.log"
    fi
    if [[ -s "$out/summary.md" ]]; then
        if [[ -n "$summary" ]]; then cat "$out/summary.md" >>"$summary"; fi
        cat "$out/summary.md"
        return 0
    fi
    if [[ -f "$out/gate.json" ]]; then
        fa3verify_cmd
        "${fa3verify[@]}" report "$out/gate.json" --html "$out/gate.html" >/dev/null \
            || echo "run-gate: the HTML report could not be rendered" >&2
    fi
    # the job summary from the tool: the failed rows, or NO RESULT (report exits 2) when gate.json is missing
    if [[ -n "${FA3VERIFY_BIN:-}" || -x "$venv/bin/fa3verify" ]]; then
        fa3verify_cmd
        "${fa3verify[@]}" report "$out/gate.json" --markdown "$out/summary.md" --log "$out/gate.log" \
            ${code:+--exit-code "$code"} >/dev/null || true
    fi
    if [[ ! -s "$out/summary.md" ]]; then  # the gate ran (outcome above) but its summary could not be rendered
        no_result "${outcome^^} (exit ${code:-?})" "The gate's outcome: $outcome; its job summary could not be rendered (\`fa3verify report\` failed): see gate.log and the artifact." "$out/gate.log"
    fi
    if [[ -n "$summary" ]]; then cat "$out/summary.md" >>"$summary"; fi
    cat "$out/summary.md"
}

sub="${1:-}"
[[ $# -gt 0 ]] && shift
case "$sub" in
    -h|--help) usage; exit 0 ;;
    cache-key) cmd_cache_key ;;
    install) install_step ;;
    gate) cmd_gate "$@" ;;
    report) cmd_report ;;
    all)
        [[ -n "${FA3VERIFY_BIN:-}" ]] || install_step
        rc=0; cmd_gate "$@" || rc=$?
        cmd_report >/dev/null
        exit "$rc" ;;
    *) echo "run-gate: error: subcommand: want cache-key, install, gate, report or all, got '${sub}'" >&2; exit 2 ;;
esac
