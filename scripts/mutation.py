"""`make mutation`: mutation testing of the oracle (refmodel), the verdicts (spec) and fa3verify's verdict modules.

Invariant checked: every mutant of a listed module that is not in the reviewed equivalent list is killed by the
tests mapped to that module (the score is killed / (mutants - equivalent)).

The tool is mutmut (pinned in pyproject's `mutation` extra). Each module runs in its own scratch copy of the
project under build/mutation/work/<module>, with a generated `[tool.mutmut]` that mutates that one file and
selects the tests mapped to it in mutation/targets.toml (the mapping is data). mutmut forks each mutant from a
warm process and runs only the selected tests that reached the mutated function, so no mutant pays for
importing torch and z3 again. The equivalent list is mutation/equivalent.tsv: one mutant a line, with the
mutated line (so a stale entry is noticed) and the reason.

Options (environment variables, for the Makefile): MUTATION_MODULES (comma-separated module paths, default: all
in targets.toml), MUTATION_SAMPLE (N: run a seeded sample of N mutants per module instead of all),
MUTATION_SEED, MUTATION_ONLY (comma-separated mutmut name globs, e.g. `refmodel.prepare.x_sort_key*`: run
only those; for iterating on one function), MUTATION_EXCLUDE_TESTS (comma-separated test files dropped from every
mapping: what the score was without them, e.g. a module's pins), MUTATION_JOBS (parallel mutant workers, default 2), MUTATION_FAIL_UNDER (percent: exit 1 when a
module scores lower), MUTATION_REPORT (default build/mutation/report.json; a run merges into it: its modules replace their entries, the
others stay), MUTATION_RERUN=survivors (run again only
the mutants the previous report left undetected, for modules whose source is unchanged since, and merge: a
killed mutant stays killed when tests are only added), MUTATION_RERUN=recount (run no mutant: count the previous
report's undetected mutants again against the current equivalent list, after reviewing new entries).

Exit codes follow the project: 0 done (and every module at or above MUTATION_FAIL_UNDER when given), 1 a module
below it, 2 bad input (names the variable and its allowed values), 3 inconclusive (mutmut did not complete,
or a module ran no mutant).
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "mutation" / "targets.toml"
EQUIVALENT = ROOT / "mutation" / "equivalent.tsv"
WORK = ROOT / "build" / "mutation" / "work"
#: What each scratch copy holds: the packages the tests import, and the tests.
COPIED = ("refmodel", "spec", "gpu_impl", "fa3verify", "tests", "examples", "docs")  # guard files and docs the tests read
PACKAGES = ("refmodel", "spec", "gpu_impl", "fa3verify")

#: mutmut's exit codes per mutant (mutmut/stats.py) grouped as this report counts them.
KILLED = {"killed", "timeout", "segfault", "caught by type check"}
SURVIVED = {"survived", "no tests", "suspicious"}


class BadInput(Exception):
    """A bad option: exit 2 with the message."""


class Inconclusive(Exception):
    """mutmut did not complete: exit 3 with the message."""


@dataclass(frozen=True)
class Target:
    module: str
    tests: tuple[str, ...]
    deselect: tuple[str, ...] = ()


@dataclass
class Equivalent:
    name: str
    line: str
    reason: str


@dataclass
class ModuleResult:
    module: str
    mutants: int = 0
    killed: int = 0
    equivalent: int = 0
    survivors: list = field(default_factory=list)
    stale_equivalents: list = field(default_factory=list)
    statuses: dict = field(default_factory=dict)
    seconds: float = 0.0
    sampled: bool = False
    not_mutated: list = field(default_factory=list)
    equivalent_names: list = field(default_factory=list)
    source_sha256: str = ""
    rerun_of: str = ""

    @property
    def scored(self) -> int:
        return self.mutants - self.equivalent

    @property
    def score(self) -> float | None:
        return None if self.scored <= 0 else 100.0 * self.killed / self.scored

    def as_json(self) -> dict:
        return {"module": self.module, "mutants": self.mutants, "killed": self.killed,
                "equivalent": self.equivalent, "survived": len(self.survivors), "score": self.score,
                "seconds": round(self.seconds, 1), "sampled": self.sampled, "statuses": self.statuses,
                "survivors": self.survivors, "stale_equivalents": self.stale_equivalents,
                "not_mutated": self.not_mutated, "equivalent_names": self.equivalent_names,
                "source_sha256": self.source_sha256, "rerun_of": self.rerun_of}


def load_targets(path: Path = TARGETS) -> dict[str, Target]:
    data = tomllib.loads(path.read_text())
    out = {}
    for module, spec in data.get("modules", {}).items():
        if not (ROOT / module).is_file():
            raise BadInput(f"{path.name}: module {module!r} is not a file of the project")
        tests = tuple(spec.get("tests", ()))
        if not tests:
            raise BadInput(f"{path.name}: module {module!r} has no tests")
        out[module] = Target(module, tests, tuple(spec.get("deselect", ())))
    return out


#: What mutation/targets.toml must map: every module of the oracle, spec's verdicts and its build-related theorems.
REQUIRED = ("refmodel/*.py", "spec/invariants.py", "spec/lifecycle_invariants.py", "spec/theorems/fork_tile.py",
            "spec/theorems/symbolic.py")


def unmapped_modules(targets: dict, root: Path = ROOT) -> list[str]:
    """The modules REQUIRED names that define a function (mutmut mutates functions only) and have no target."""
    out = []
    for pattern in REQUIRED:
        for path in sorted(root.glob(pattern)):
            module = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text())
            has_function = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree))
            if has_function and module not in targets:
                out.append(module)
    return out


def load_equivalents(path: Path = EQUIVALENT) -> dict[str, Equivalent]:
    """The reviewed equivalent mutants: `name<TAB>mutated line<TAB>reason`, '#' comments and blank lines skipped."""
    out = {}
    if not path.exists():
        return out
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        parts = raw.split("\t")
        if len(parts) != 3 or not all(p.strip() for p in parts):
            raise BadInput(f"{path.name} line {number}: expected 'mutant<TAB>mutated line<TAB>reason'")
        name, line, reason = (p.strip() for p in parts)
        if name in out:
            raise BadInput(f"{path.name} line {number}: {name} listed twice")
        out[name] = Equivalent(name, line, reason)
    return out


def mutated_line(diff: str) -> str:
    """The first added line of a mutant's diff, stripped: what an equivalent entry records."""
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return ""


def parse_options(env: dict, targets: dict[str, Target]) -> dict:
    modules = [m.strip() for m in env.get("MUTATION_MODULES", "").split(",") if m.strip()] or list(targets)
    unknown = [m for m in modules if m not in targets]
    if unknown:
        raise BadInput(f"MUTATION_MODULES: unknown module(s) {', '.join(unknown)}; allowed: {', '.join(targets)}")

    def integer(name: str, default, low: int, high: int):
        raw = env.get(name, "")
        if raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise BadInput(f"{name}: must be an integer in [{low}, {high}], got {raw!r}") from None
        if not low <= value <= high:
            raise BadInput(f"{name}: must be an integer in [{low}, {high}], got {value}")
        return value

    only = [g.strip() for g in env.get("MUTATION_ONLY", "").split(",") if g.strip()]
    exclude = [t.strip() for t in env.get("MUTATION_EXCLUDE_TESTS", "").split(",") if t.strip()]
    every_test = {t.split("::")[0] for target in targets.values() for t in target.tests}
    stray = [t for t in exclude if t not in every_test]
    if stray:
        raise BadInput(f"MUTATION_EXCLUDE_TESTS: {', '.join(stray)} is in no mapping of {TARGETS.name}")
    return {"modules": modules, "sample": integer("MUTATION_SAMPLE", None, 1, 10**6), "only": only, "exclude": exclude,
            "seed": integer("MUTATION_SEED", 0, 0, 2**31 - 1), "jobs": integer("MUTATION_JOBS", 2, 1, 64),
            "fail_under": integer("MUTATION_FAIL_UNDER", None, 0, 100),
            "report": Path(env.get("MUTATION_REPORT", "") or ROOT / "build" / "mutation" / "report.json"),
            "rerun": rerun(env)}


def rerun(env: dict) -> str:
    """'' (a full run), 'survivors' (run the previous report's undetected mutants again) or 'recount' (run none:
    count the previous report's undetected mutants again against the current equivalent list)."""
    value = env.get("MUTATION_RERUN", "")
    if value not in ("", "survivors", "recount"):
        raise BadInput(f"MUTATION_RERUN: must be 'survivors', 'recount' or empty, got {value!r}")
    return value


def source_hash(module: str) -> str:
    return hashlib.sha256((ROOT / module).read_bytes()).hexdigest()


def previous_result(report: Path, module: str) -> dict:
    """The module's entry in the previous report, for MUTATION_RERUN=survivors (same source, full run)."""
    try:
        entries = {m["module"]: m for m in json.loads(report.read_text())["modules"]}
    except (OSError, ValueError, KeyError) as exc:
        raise BadInput(f"MUTATION_RERUN: no previous report at {report} ({exc})") from None
    prev = entries.get(module)
    if prev is None or prev.get("sampled"):
        raise BadInput(f"MUTATION_RERUN: {report} has no full run of {module}")
    if prev.get("source_sha256") != source_hash(module):
        raise BadInput(f"MUTATION_RERUN: {module} changed since {report}; run it in full")
    return prev


def existing_report(path: Path) -> dict:
    """The report already at ``path`` (``{}`` when none): this run's report is merged into it, so a module this run
    does not score (not selected, or inconclusive) keeps its earlier entry; an unreadable one is bad input."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        entries = data["modules"]
        if not isinstance(entries, list) or not all(isinstance(m, dict) and "module" in m for m in entries):
            raise ValueError("'modules' is not a list of module entries")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"MUTATION_REPORT: {path} exists but is not a mutation report ({exc}); "
                       f"name another file or move it away") from None
    return data


def merged_report(previous: dict, results: list, errors: list, opts: dict) -> dict:
    """This run's modules replace their entries in ``previous``, every other entry stays (modules in file order,
    new ones last); each entry carries the run options it was scored under, the top level this run's."""
    run = {"sample": opts["sample"], "seed": opts["seed"], "only": opts["only"], "excluded_tests": opts["exclude"]}
    inherited = {k: previous.get(k) for k in run}  # a report written before entries carried their own options
    entries = {m["module"]: {"run": inherited, **m} for m in previous.get("modules", [])}
    for r in results:
        entries[r.module] = {"run": run, **r.as_json()}
    kept = [m for m in entries if m not in {r.module for r in results}]
    return {"tool": "mutmut", **run, "modules": list(entries.values()), "inconclusive": errors,
            "kept_from_earlier_runs": kept}


def classify(module: str, statuses: dict[str, str], diffs: dict[str, str],
             equivalents: dict[str, Equivalent]) -> ModuleResult:
    """Count one module's mutants: killed, equivalent (listed with the same mutated line), survivors."""
    result = ModuleResult(module)
    for name, status in sorted(statuses.items()):
        result.mutants += 1
        result.statuses[status] = result.statuses.get(status, 0) + 1
        if status in KILLED:
            result.killed += 1
            continue
        if status not in SURVIVED:
            raise Inconclusive(f"{module}: mutant {name} was not run to the end ({status})")
        diff = diffs.get(name, "")
        entry = equivalents.get(name)
        if entry is not None and entry.line == mutated_line(diff):
            result.equivalent += 1
            result.equivalent_names.append(name)
            continue
        if entry is not None:
            result.stale_equivalents.append({"name": name, "listed": entry.line, "now": mutated_line(diff)})
        result.survivors.append({"name": name, "status": status, "diff": diff})
    return result


def select_mutants(every: list[str], opts: dict) -> list[str]:
    """The mutants a partial run tries: those matching MUTATION_ONLY, then a seeded sample of MUTATION_SAMPLE."""
    names = [n for n in every if not opts["only"] or any(fnmatch.fnmatchcase(n, g) for g in opts["only"])]
    if opts["sample"] is not None:
        names = random.Random(opts["seed"]).sample(names, min(opts["sample"], len(names)))
    return sorted(names)


#: Decorators whose method bodies the scratch copy lifts into plain methods (lift_properties), so mutmut mutates them.
LIFTED = ("property", "cached_property", "functools.cached_property")
#: The name a lifted body gets: `_property_<name>`; mutmut's mutant names then read `xǁClassǁ_property_<name>__mutmut_N`.
LIFTED_PREFIX = "_property_"
#: Memo decorators of module-level functions that the scratch copy makes fork-local (lift_properties).
CACHES = re.compile(r"(functools\.)?(lru_cache(\(.*\))?|cache)")
#: The name a lifted memoised body gets: `_cached_<name>` (mutants `x__cached_<name>__mutmut_N`).
CACHED_PREFIX = "_cached_"
#: The helper module the lifted memos import, written into each scratch copy (and mutmut's copy of it).
FORK_CACHE_MODULE = "mutation_fork_cache"
FORK_CACHE_SOURCE = '''"""A memo that forgets what it learnt in another process (written by scripts/mutation.py into the scratch copy).

mutmut forks each mutant from a warm process that already ran the tests: a plain lru_cache would answer the mutant
from the original code's results. This one starts empty in every process, and is the same memo within one. During
mutmut's stats run (MUTANT_UNDER_TEST=stats) it does not memoise at all: that run records which tests reach each
function, and a test answered from the memo would not be recorded, so its mutants would never run that test.
"""
import functools
import os


def fork_local(decorator):
    def wrap(fn):
        state = {"pid": None, "memo": None}

        def memo():
            if state["pid"] != os.getpid():
                state["pid"], state["memo"] = os.getpid(), decorator(fn)
            return state["memo"]

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if os.environ.get("MUTANT_UNDER_TEST") == "stats":
                return fn(*args, **kwargs)
            return memo()(*args, **kwargs)

        call.cache_clear = lambda: memo().cache_clear()
        call.cache_info = lambda: memo().cache_info()
        return call
    return wrap
'''


def _liftable(node) -> bool:
    return (isinstance(node, ast.FunctionDef) and len(node.decorator_list) == 1
            and ast.unparse(node.decorator_list[0]) in LIFTED)


def _cached(node) -> bool:
    return (isinstance(node, ast.FunctionDef) and len(node.decorator_list) == 1
            and CACHES.fullmatch(ast.unparse(node.decorator_list[0])) is not None)


def lift_properties(source: str) -> str:
    """The module with every property body and memoised function made a plain function mutmut mutates.

    mutmut 3 mutates no decorated function but staticmethod/classmethod ones. In the scratch copy only:

    - each `@property` (or `@cached_property`) method `name` of a top-level class becomes an undecorated method
      `_property_name` followed by `name = property(_property_name)` in the same class: the same attribute, the
      same value on every instance, and mutmut's trampoline on the body;
    - each module-level function `name` memoised by `lru_cache`/`cache` becomes an undecorated `_cached_name`
      followed by `name = fork_local(lru_cache(...))(_cached_name)`: the same memo (and `cache_clear`), except
      that it starts empty in each process, so a forked mutant computes its own values instead of reading the
      warm parent's (which hid every mutant of a function called only under a memo).

    Properties with a setter or a decorator of another kind, properties of nested classes (mutmut mutates methods
    of top-level classes only) and memoised methods are left as they are and listed by not_mutated_by_mutmut.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits = []   # (line index, replacement lines), applied bottom-up
    top_names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    groups = [(None, [n for n in tree.body if _cached(n) and top_names.count(n.name) == 1])]
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef):
            names = [n.name for n in cls.body if isinstance(n, ast.FunctionDef)]
            # a setter/deleter reuses the name: left alone
            groups.append((cls, [n for n in cls.body if _liftable(n) and names.count(n.name) == 1]))
    for cls, nodes in groups:
        for node in nodes:
            deco = node.decorator_list[0]
            decorator = ast.unparse(deco)
            def_line = lines[node.lineno - 1]
            indent = def_line[:len(def_line) - len(def_line.lstrip())]
            if deco.lineno != deco.end_lineno or lines[deco.lineno - 1].strip() != "@" + decorator:
                continue   # a decorator sharing its line with something else: left alone
            lifted = (LIFTED_PREFIX if cls is not None else CACHED_PREFIX) + node.name
            wrapper = decorator if cls is not None else f"__import__({FORK_CACHE_MODULE!r}).fork_local({decorator})"
            body = lines[node.lineno - 1:node.end_lineno]
            body[0] = def_line.replace(f"def {node.name}(", f"def {lifted}(", 1)
            if not body[-1].endswith("\n"):
                body[-1] += "\n"
            edits.append((node.lineno, node.end_lineno, body + [f"{indent}{node.name} = {wrapper}({lifted})\n"]))
            edits.append((deco.lineno, deco.lineno, ["\n"]))   # the decorator's line, kept as a blank line
    for start, end, new in sorted(edits, key=lambda e: e[0], reverse=True):
        lines[start - 1:end] = new
    return "".join(lines)


def not_mutated_by_mutmut(source: str) -> list[str]:
    """Functions mutmut 3 leaves alone: decorated ones other than staticmethod/classmethod (caches, setters).

    Property and cached_property bodies of top-level classes are not listed: the scratch copy lifts them into
    plain methods that mutmut mutates (lift_properties). mutmut also skips module-level statements (constants,
    tables); those are not listed. The report names these functions so that what the score does not measure is
    said, not hidden.
    """
    lifted_tree = ast.parse(lift_properties(source))
    lifted = {(cls.name, node.name) for cls in lifted_tree.body
              if isinstance(cls, ast.ClassDef) for node in cls.body
              if isinstance(node, ast.FunctionDef) and node.name.startswith(LIFTED_PREFIX)}
    lifted |= {(None, LIFTED_PREFIX + node.name.removeprefix(CACHED_PREFIX)) for node in lifted_tree.body
               if isinstance(node, ast.FunctionDef) and node.name.startswith(CACHED_PREFIX)}
    out = []

    def visit(node, prefix: str, top: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", child.name if node is tree else "")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [ast.unparse(d) for d in child.decorator_list]
                if (top, LIFTED_PREFIX + child.name) in lifted:
                    continue
                if names and not (len(names) == 1 and names[0] in ("staticmethod", "classmethod")):
                    out.append(f"{prefix}{child.name} (@{', @'.join(names)})")
    tree = ast.parse(source)
    visit(tree, "", None)
    return out


def slug(module: str) -> str:
    return module.replace("/", "_").removesuffix(".py")


def write_workdir(target: Target, workdir: Path, exclude: tuple = ()) -> None:
    """A scratch copy of the project with a `[tool.mutmut]` that mutates `target.module` only."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        dst = workdir / name
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(ROOT / name, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    mutated = workdir / target.module
    mutated.write_text(lift_properties(mutated.read_text()))
    (workdir / f"{FORK_CACHE_MODULE}.py").write_text(FORK_CACHE_SOURCE)
    pytest_ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    tests = [t for t in target.tests if t.split("::")[0] not in exclude]
    if not tests:
        raise Inconclusive(f"{target.module}: MUTATION_EXCLUDE_TESTS leaves no test")
    selection = tests + [f"--deselect={d}" for d in target.deselect]
    lines = ["[tool.pytest.ini_options]"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in pytest_ini.items()]
    lines += ["", "[tool.mutmut]",
              f"source_paths = {json.dumps(list(PACKAGES))}",
              f"only_mutate = {json.dumps([target.module])}",
              f"pytest_add_cli_args_test_selection = {json.dumps(selection)}",
              # the project's own pytest plugin adds nothing to these tests and costs start-up time
              'pytest_add_cli_args = ["-p", "no:fa3verify"]',
              # into mutmut's mutants/ tree, where the tests run: files they read, and the lifted memos' helper
              f'also_copy = ["examples", "docs", "{FORK_CACHE_MODULE}.py"]',
              "use_git_change_detection = false", ""]
    (workdir / "pyproject.toml").write_text("\n".join(lines))


MUTMUT = [sys.executable, "-c", "import sys; from mutmut.__main__ import cli; sys.argv[0] = 'mutmut'; cli()"]

#: Generates the mutants without running them (mutmut's own steps of `run`), so a sample can be drawn.
GENERATE = """
import os
from mutmut.__main__ import copy_src_dir, copy_also_copy_files, setup_source_paths, create_mutants
os.makedirs('mutants', exist_ok=True)
copy_src_dir(); copy_also_copy_files(); setup_source_paths(); create_mutants(1)
"""

#: Prints {mutant: diff} for the named mutants (mutmut's own diff).
DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
names = json.load(sys.stdin)
print(json.dumps({n: get_diff_for_mutant(n, path=p) for n, p in names}))
"""


def mutmut_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    # The suite's theorem memo (tests/conftest.py) would answer a forked mutant from the warm parent's results: a
    # mutant switches code by mutmut's trampoline, not by replacing an attribute, so the memo's fingerprint cannot
    # see it. Every theorem part a mutant's tests run is computed again.
    env["FA3VERIFY_THEOREM_MEMO"] = "0"
    return env


def meta_statuses(workdir: Path, module: str) -> dict[str, str]:
    from mutmut.stats import status_by_exit_code
    meta = workdir / "mutants" / (module + ".meta")
    if not meta.exists():
        raise Inconclusive(f"{module}: mutmut wrote no results ({meta.relative_to(ROOT)} missing)")
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: status_by_exit_code[code] for name, code in codes.items()}


def run_module(target: Target, opts: dict, equivalents: dict[str, Equivalent], log) -> ModuleResult:
    workdir = WORK / slug(target.module)
    if workdir.exists():
        shutil.rmtree(workdir)  # build output of this command only: every run starts from the current tree
    write_workdir(target, workdir, tuple(opts["exclude"]))
    env = mutmut_env()
    start = time.monotonic()
    names: list[str] = []
    prev = opts.get("previous", {}).get(target.module)
    if prev is not None and opts["rerun"] == "recount":
        return recount(target.module, prev, equivalents)
    if prev is not None:
        names = sorted([s["name"] for s in prev["survivors"]] + list(prev.get("equivalent_names", [])))
        if not names:
            result = ModuleResult(**{k: prev[k] for k in ("module", "mutants", "killed", "equivalent")})
            result.source_sha256, result.rerun_of = prev["source_sha256"], str(opts["report"])
            return result
    elif opts["sample"] is not None or opts["only"]:
        subprocess.run([sys.executable, "-c", GENERATE], cwd=workdir, env=env, check=True,
                       stdout=log, stderr=subprocess.STDOUT)
        names = select_mutants(sorted(meta_statuses(workdir, target.module)), opts)
        if not names:
            raise Inconclusive(f"{target.module}: MUTATION_ONLY matches no mutant of this module")
    proc = subprocess.run(MUTMUT + ["run", "--max-children", str(opts["jobs"])] + names, cwd=workdir, env=env,
                          stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise Inconclusive(f"{target.module}: mutmut run exited {proc.returncode} (log: {log.name})")
    statuses = meta_statuses(workdir, target.module)
    if names:
        statuses = {n: statuses[n] for n in names}
    not_run = sorted(n for n, s in statuses.items() if s == "not checked")
    if not statuses or not_run:
        raise Inconclusive(f"{target.module}: {len(not_run)} of {len(statuses)} mutants not run")
    undetected = [n for n, s in statuses.items() if s in SURVIVED]
    diffs = {}
    if undetected:
        out = subprocess.run([sys.executable, "-c", DIFFS], cwd=workdir, env=env, check=True, text=True,
                             input=json.dumps([[n, target.module] for n in undetected]), capture_output=True)
        diffs = json.loads(out.stdout)
    result = classify(target.module, statuses, diffs, equivalents)
    result.seconds = time.monotonic() - start
    result.sampled = bool(names) and prev is None
    result.source_sha256 = source_hash(target.module)
    if prev is not None:   # the rest were killed in the previous full run and stay killed (tests were only added)
        result.mutants, result.killed = prev["mutants"], prev["killed"] + result.killed
        result.rerun_of = str(opts["report"])
    result.not_mutated = not_mutated_by_mutmut((ROOT / target.module).read_text())
    return result


def recount(module: str, prev: dict, equivalents: dict[str, Equivalent]) -> ModuleResult:
    """MUTATION_RERUN=recount: the previous run's verdicts, its undetected mutants classified against the current
    equivalent list (no mutant runs; the source is unchanged, checked by hash, so every mutant is the same)."""
    statuses = {s["name"]: s["status"] for s in prev["survivors"]}
    diffs = {s["name"]: s["diff"] for s in prev["survivors"]}
    result = classify(module, statuses, diffs, equivalents)
    for name in prev.get("equivalent_names", []):
        if name in equivalents:     # listed when the previous run matched its mutated line; the source is unchanged
            result.equivalent += 1
            result.equivalent_names.append(name)
        else:
            result.survivors.append({"name": name, "status": "survived", "diff": ""})
    result.mutants, result.killed = prev["mutants"], prev["killed"]
    result.seconds, result.source_sha256 = prev["seconds"], prev["source_sha256"]  # the run that decided them
    result.rerun_of = "recount of " + str(prev.get("rerun_of") or "a full run")
    result.not_mutated = not_mutated_by_mutmut((ROOT / module).read_text())
    return result


def print_result(r: ModuleResult) -> None:
    score = "n/a" if r.score is None else f"{r.score:.1f}%"
    print(f"{r.module}: {score} ({r.killed} killed of {r.scored} scored; {r.mutants} mutants, "
          f"{r.equivalent} equivalent, {len(r.survivors)} survived){' [sample]' if r.sampled else ''} "
          f"in {r.seconds:.0f} s")
    for s in r.survivors:
        print(f"  survived ({s['status']}): {s['name']}")
        for line in s["diff"].splitlines()[2:]:
            if line.startswith(("+", "-")):
                print(f"      {line}")
    if r.not_mutated:
        print(f"  not mutated by mutmut: {', '.join(r.not_mutated)}")
    for s in r.stale_equivalents:
        print(f"  stale equivalent entry: {s['name']} lists {s['listed']!r}, mutant is now {s['now']!r}")


def main(env: dict | None = None) -> int:
    env = dict(os.environ if env is None else env)
    try:
        targets = load_targets()
        opts = parse_options(env, targets)
        equivalents = load_equivalents()
        # a rerun's previous report is input too: checked for every module before anything runs or is written
        opts["previous"] = ({m: previous_result(opts["report"], m) for m in opts["modules"]} if opts["rerun"] else {})
        earlier = existing_report(opts["report"])
    except BadInput as exc:
        print(f"mutation: {exc}", file=sys.stderr)
        return 2
    try:
        import mutmut  # noqa: F401
    except ImportError:
        print("mutation: mutmut is not installed (pip install -e '.[mutation]')", file=sys.stderr)
        return 2
    opts["report"].parent.mkdir(parents=True, exist_ok=True)
    results, errors = [], []
    log_path = opts["report"].parent / "mutmut.log"
    with open(log_path, "w") as log:
        for module in opts["modules"]:
            log.write(f"===== {module}\n")
            log.flush()
            try:
                result = run_module(targets[module], opts, equivalents, log)
            except (Inconclusive, subprocess.CalledProcessError) as exc:
                errors.append(f"{module}: {exc}")
                print(f"{module}: inconclusive: {exc}")
                continue
            results.append(result)
            print_result(result)
    report = merged_report(earlier, results, errors, opts)
    tmp = opts["report"].with_suffix(opts["report"].suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(opts["report"])
    kept = report["kept_from_earlier_runs"]
    kept = f" (kept from earlier runs: {', '.join(kept)})" if kept else ""
    print(f"report: {opts['report']}{kept}")
    if errors:
        return 3
    if opts["fail_under"] is not None and any((r.score or 0.0) < opts["fail_under"] for r in results):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
