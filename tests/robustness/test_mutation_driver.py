"""`make mutation`'s scoring (scripts/mutation.py): survivors count, only reviewed equivalents are excused, bad
options exit 2, a mutant that did not run makes the run inconclusive. Runs no mutmut (that is `make mutation`)."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mutation_driver", ROOT / "scripts" / "mutation.py")
drv = importlib.util.module_from_spec(_spec)
sys.modules["mutation_driver"] = drv  # dataclasses look their module up
_spec.loader.exec_module(drv)

DIFF_A = "--- refmodel/x.py\n+++ refmodel/x.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2"
DIFF_B = "--- refmodel/x.py\n+++ refmodel/x.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 3"


def test_score_counts_killed_over_non_equivalent():
    statuses = {"m.x_f__mutmut_1": "killed", "m.x_f__mutmut_2": "timeout", "m.x_f__mutmut_3": "survived",
                "m.x_f__mutmut_4": "survived"}
    eq = {"m.x_f__mutmut_4": drv.Equivalent("m.x_f__mutmut_4", "return 3", "no input tells them apart")}
    r = drv.classify("refmodel/x.py", statuses, {"m.x_f__mutmut_3": DIFF_A, "m.x_f__mutmut_4": DIFF_B}, eq)
    assert (r.mutants, r.killed, r.equivalent, r.scored) == (4, 2, 1, 3)
    assert [s["name"] for s in r.survivors] == ["m.x_f__mutmut_3"]
    assert r.score == pytest.approx(200 / 3)


def test_a_survivor_that_is_not_listed_lowers_the_score():
    # negative control: the same run without the equivalent entry scores lower
    statuses = {"m.x_f__mutmut_1": "killed", "m.x_f__mutmut_2": "survived"}
    r = drv.classify("refmodel/x.py", statuses, {"m.x_f__mutmut_2": DIFF_A}, {})
    assert r.score == 50.0 and len(r.survivors) == 1


def test_a_stale_equivalent_entry_excuses_nothing():
    statuses = {"m.x_f__mutmut_1": "survived"}
    eq = {"m.x_f__mutmut_1": drv.Equivalent("m.x_f__mutmut_1", "return 3", "was equivalent")}
    r = drv.classify("refmodel/x.py", statuses, {"m.x_f__mutmut_1": DIFF_A}, eq)
    assert r.equivalent == 0 and r.score == 0.0
    assert r.stale_equivalents == [{"name": "m.x_f__mutmut_1", "listed": "return 3", "now": "return 2"}]


def test_untested_and_suspicious_mutants_are_survivors():
    r = drv.classify("refmodel/x.py", {"a": "no tests", "b": "suspicious", "c": "segfault"}, {}, {})
    assert r.killed == 1 and len(r.survivors) == 2


def test_a_mutant_that_did_not_run_is_inconclusive():
    with pytest.raises(drv.Inconclusive, match="not run to the end"):
        drv.classify("refmodel/x.py", {"a": "killed", "b": "not checked"}, {}, {})


def test_bad_options_name_the_variable_and_the_range():
    targets = drv.load_targets()
    with pytest.raises(drv.BadInput, match="MUTATION_MODULES: unknown module"):
        drv.parse_options({"MUTATION_MODULES": "refmodel/nope.py"}, targets)
    with pytest.raises(drv.BadInput, match=r"MUTATION_SAMPLE: must be an integer in \[1, 1000000\], got 0"):
        drv.parse_options({"MUTATION_SAMPLE": "0"}, targets)
    with pytest.raises(drv.BadInput, match="MUTATION_JOBS: must be an integer"):
        drv.parse_options({"MUTATION_JOBS": "two"}, targets)
    assert drv.main({"MUTATION_SAMPLE": "-3"}) == 2


def test_the_sample_is_seeded_and_only_filters_by_glob():
    every = [f"refmodel.prepare.x_f__mutmut_{i}" for i in range(50)] + ["refmodel.prepare.x_g__mutmut_1"]
    opts = {"only": [], "sample": 5, "seed": 7}
    assert drv.select_mutants(every, opts) == drv.select_mutants(every, opts)
    assert len(drv.select_mutants(every, opts)) == 5
    assert drv.select_mutants(every, {"only": ["*x_g_*"], "sample": None, "seed": 0}) == [every[-1]]


def test_the_committed_mapping_and_equivalent_list_are_well_formed():
    targets = drv.load_targets()
    for target in targets.values():
        for test in target.tests + target.deselect:
            assert (ROOT / test.split("::")[0]).is_file(), test
    modules = {t.module.removesuffix(".py").replace("/", ".") for t in targets.values()}
    for name, entry in drv.load_equivalents().items():
        assert name.rsplit(".", 1)[0] in modules, name
        assert entry.line and len(entry.reason) > 20, name


def test_a_malformed_equivalent_line_is_bad_input(tmp_path):
    bad = tmp_path / "equivalent.tsv"
    bad.write_text("# comment\nrefmodel.prepare.x_f__mutmut_1\treturn 2\n")
    with pytest.raises(drv.BadInput, match="line 2: expected"):
        drv.load_equivalents(bad)


def test_mutated_line_is_the_first_added_line():
    assert drv.mutated_line(DIFF_A) == "return 2"
    assert drv.mutated_line("") == ""


def test_decorated_functions_are_listed_as_not_mutated():
    # properties of a top-level class are lifted (mutated); a cache, a property with a setter and a nested class's
    # property are not, and are listed
    source = ("import functools\nclass A:\n    @property\n    def p(self):\n        return 1\n"
              "    @staticmethod\n    def s():\n        return 2\n    def m(self):\n        return 3\n"
              "    @property\n    def w(self):\n        return 5\n    @w.setter\n    def w(self, v):\n        pass\n"
              "    class B:\n        @property\n        def q(self):\n            return 6\n"
              "    @functools.lru_cache(maxsize=2)\n    def c(self):\n        return 7\n"
              "@functools.lru_cache(maxsize=4)\ndef f():\n    return 4\n"
              "@functools.wraps(f)\ndef g():\n    return 8\n")
    assert drv.not_mutated_by_mutmut(source) == ["A.w (@property)", "A.w (@w.setter)", "A.B.q (@property)",
                                                 "A.c (@functools.lru_cache(maxsize=2))", "g (@functools.wraps(f))"]


LIFT_SOURCE = '''import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Box:
    n: int
    k: int

    @property
    def ratio(self) -> int:
        """n per k."""
        return self.n // self.k

    @functools.cached_property
    def key(self): return (self.n, self.k)

    def twice(self) -> int:
        return 2 * self.ratio
'''


def _load(source: str, tmp_path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_property_bodies_are_lifted_into_plain_methods_with_the_same_values(tmp_path):
    lifted = drv.lift_properties(LIFT_SOURCE)
    assert "    def _property_ratio(self) -> int:\n" in lifted and "    ratio = property(_property_ratio)\n" in lifted
    assert "    def _property_key(self): return (self.n, self.k)\n    key = functools.cached_property(_property_key)\n" in lifted
    assert "@property" not in lifted and "@functools.cached_property" not in lifted
    assert drv.not_mutated_by_mutmut(LIFT_SOURCE) == []
    before, after = _load(LIFT_SOURCE, tmp_path, "lift_before"), _load(lifted, tmp_path, "lift_after")
    for n, k in ((7, 2), (9, 3)):
        a, b = before.Box(n, k), after.Box(n, k)
        assert (a.ratio, a.key, a.twice()) == (b.ratio, b.key, b.twice())
    assert isinstance(after.Box.__dict__["ratio"], property) and after.Box.__dict__["ratio"].fget.__doc__ == "n per k."
    assert [f.name for f in __import__("dataclasses").fields(after.Box)] == ["n", "k"]


def test_a_lifted_property_body_is_what_the_attribute_runs(tmp_path):
    # negative control: a one-edit mutant of the lifted body changes the property's value (mutmut's mutant of it is
    # therefore observable through the attribute the tests read)
    mutant = drv.lift_properties(LIFT_SOURCE).replace("return self.n // self.k", "return self.n * self.k")
    box = _load(mutant, tmp_path, "lift_mutant").Box(7, 2)
    assert box.ratio == 14 and box.twice() == 28


MEMO_SOURCE = '''from functools import lru_cache

CALLS = []


@lru_cache(maxsize=None)
def table(n: int) -> tuple:
    CALLS.append(n)
    return tuple(range(n))
'''


def test_a_lifted_memo_is_the_same_memo_in_one_process_and_empty_in_another(tmp_path, monkeypatch):
    (tmp_path / f"{drv.FORK_CACHE_MODULE}.py").write_text(drv.FORK_CACHE_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    lifted = drv.lift_properties(MEMO_SOURCE)
    assert "def _cached_table(n: int) -> tuple:" in lifted and "@lru_cache" not in lifted
    assert drv.not_mutated_by_mutmut(MEMO_SOURCE) == []
    mod = _load(lifted, tmp_path, "memo_lifted")
    assert mod.table(3) == (0, 1, 2) and mod.table(3) == (0, 1, 2) and mod.CALLS == [3]   # memoised
    assert mod.table.cache_info().hits == 1
    mod.table.cache_clear()
    mod.table(3)
    assert mod.CALLS == [3, 3]
    # negative control: the plain lru_cache keeps answering in a forked process; the lifted memo computes again
    plain = _load(MEMO_SOURCE, tmp_path, "memo_plain")
    plain.table(2)
    real_pid = drv.os.getpid()
    monkeypatch.setattr("os.getpid", lambda: real_pid + 1)   # what a forked mutant sees
    plain.table(2)
    mod.table(3)
    assert plain.CALLS == [2] and mod.CALLS == [3, 3, 3]
    # mutmut's stats run records the tests that reach each function: there every call reaches it
    monkeypatch.setenv("MUTANT_UNDER_TEST", "stats")
    mod.table(3)
    mod.table(3)
    assert mod.CALLS == [3, 3, 3, 3, 3]


def test_the_scratch_copy_mutates_the_lifted_module(tmp_path):
    target = drv.Target("refmodel/attention.py", ("tests/oracle/test_attention.py",))
    drv.write_workdir(target, tmp_path)
    copied = (tmp_path / "refmodel" / "attention.py").read_text()
    assert "def _property_seqlen_q(self) -> int:" in copied and "seqlen_q = property(_property_seqlen_q)" in copied
    assert copied != (ROOT / "refmodel" / "attention.py").read_text()
    assert (tmp_path / f"{drv.FORK_CACHE_MODULE}.py").read_text() == drv.FORK_CACHE_SOURCE
    assert f'"{drv.FORK_CACHE_MODULE}.py"' in (tmp_path / "pyproject.toml").read_text()   # copied where tests run


def test_a_rerun_needs_a_full_previous_run_of_the_same_source(tmp_path):
    report = tmp_path / "report.json"
    with pytest.raises(drv.BadInput, match="MUTATION_RERUN: no previous report"):
        drv.previous_result(report, "refmodel/cint.py")
    import json
    entry = {"module": "refmodel/cint.py", "sampled": False, "source_sha256": "0" * 64}
    report.write_text(json.dumps({"modules": [entry]}))
    with pytest.raises(drv.BadInput, match="changed since"):
        drv.previous_result(report, "refmodel/cint.py")
    with pytest.raises(drv.BadInput, match="has no full run of refmodel/prepare.py"):
        drv.previous_result(report, "refmodel/prepare.py")
    entry["source_sha256"] = drv.source_hash("refmodel/cint.py")
    report.write_text(json.dumps({"modules": [entry]}))
    assert drv.previous_result(report, "refmodel/cint.py") == entry
    with pytest.raises(drv.BadInput, match="MUTATION_RERUN: must be 'survivors', 'recount' or empty, got 'all'"):
        drv.rerun({"MUTATION_RERUN": "all"})
    assert [drv.rerun({"MUTATION_RERUN": v}) for v in ("", "survivors", "recount")] == ["", "survivors", "recount"]


def test_a_recount_reclassifies_the_previous_undetected_mutants_only():
    prev = {"module": "refmodel/x.py", "mutants": 10, "killed": 7, "seconds": 12.5, "source_sha256": "ab",
            "survivors": [{"name": "m.a", "status": "survived", "diff": DIFF_A},
                          {"name": "m.b", "status": "survived", "diff": DIFF_B}],
            "equivalent_names": ["m.c"]}
    eq = {"m.a": drv.Equivalent("m.a", "return 2", "why"), "m.c": drv.Equivalent("m.c", "x", "why")}
    r = drv.recount("refmodel/cint.py", prev, eq)
    assert (r.mutants, r.killed, r.equivalent, [s["name"] for s in r.survivors]) == (10, 7, 2, ["m.b"])
    assert r.score == pytest.approx(87.5) and r.seconds == 12.5 and r.rerun_of.startswith("recount of")
    # an entry dropped from the list, or listed with another line, excuses nothing any more
    r = drv.recount("refmodel/cint.py", prev, {"m.a": drv.Equivalent("m.a", "return 9", "why")})
    assert (r.equivalent, sorted(s["name"] for s in r.survivors)) == (0, ["m.a", "m.b", "m.c"])


def test_a_rerun_without_its_previous_report_is_bad_input_and_writes_nothing(tmp_path, capsys):
    report = tmp_path / "out" / "report.json"
    env = {"MUTATION_RERUN": "recount", "MUTATION_REPORT": str(report), "MUTATION_MODULES": "refmodel/cint.py"}
    assert drv.main(env) == 2
    assert "MUTATION_RERUN: no previous report at" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_run_merges_into_the_report_and_keeps_the_modules_it_did_not_score(tmp_path):
    """A module this run did not score (not selected, or inconclusive) keeps its earlier entry; one it scored is
    replaced; each entry keeps the options it was scored under."""
    import json
    earlier = {"tool": "mutmut", "sample": None, "seed": 0, "only": [], "excluded_tests": [],
               "modules": [{"module": "refmodel/splitkv.py", "mutants": 412, "killed": 387},
                           {"module": "refmodel/cint.py", "mutants": 53, "killed": 1}]}
    opts = {"sample": 5, "seed": 3, "only": [], "exclude": []}
    now = drv.ModuleResult("refmodel/cint.py", mutants=5, killed=5)
    report = drv.merged_report(earlier, [now], ["refmodel/combine.py: mutmut exited 1"], opts)
    by = {m["module"]: m for m in report["modules"]}
    assert list(by) == ["refmodel/splitkv.py", "refmodel/cint.py"]
    assert by["refmodel/splitkv.py"]["killed"] == 387 and by["refmodel/splitkv.py"]["run"]["sample"] is None
    assert by["refmodel/cint.py"]["killed"] == 5 and by["refmodel/cint.py"]["run"]["sample"] == 5
    assert report["kept_from_earlier_runs"] == ["refmodel/splitkv.py"] and report["sample"] == 5
    assert report["inconclusive"] == ["refmodel/combine.py: mutmut exited 1"]
    assert drv.merged_report({}, [now], [], opts)["modules"][0]["module"] == "refmodel/cint.py"
    path = tmp_path / "report.json"
    assert drv.existing_report(path) == {}
    path.write_text(json.dumps(earlier))
    assert drv.existing_report(path) == earlier


def test_a_report_path_holding_something_else_is_bad_input_and_is_left_alone(tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_text("my notes, not a report\n")
    env = {"MUTATION_REPORT": str(report), "MUTATION_MODULES": "refmodel/cint.py"}
    assert drv.main(env) == 2
    err = capsys.readouterr().err
    assert "MUTATION_REPORT:" in err and "is not a mutation report" in err
    assert report.read_text() == "my notes, not a report\n"
    assert not (tmp_path / "mutmut.log").exists()


def test_every_refmodel_module_and_the_build_theorems_are_in_the_mapping():
    targets = drv.load_targets()
    assert drv.unmapped_modules(targets) == []
    assert {"refmodel/__init__.py", "refmodel/fa3_builds.py", "refmodel/metadata_layout.py", "refmodel/kv_blocks.py", "spec/invariants.py",
            "spec/lifecycle_invariants.py", "spec/theorems/fork_tile.py"} <= set(targets)


def test_a_refmodel_module_missing_from_the_mapping_is_named(tmp_path):
    # negative control: a mapping without one module, and a new module with a function that nobody mapped
    targets = drv.load_targets()
    fewer = {m: t for m, t in targets.items() if m != "refmodel/metadata_layout.py"}  # a module with functions
    assert drv.unmapped_modules(fewer) == ["refmodel/metadata_layout.py"]
    (tmp_path / "refmodel").mkdir()
    (tmp_path / "spec").mkdir()
    (tmp_path / "refmodel" / "__init__.py").write_text("from .new import f\n")
    (tmp_path / "refmodel" / "new.py").write_text("def f():\n    return 1\n")
    (tmp_path / "refmodel" / "data_only.py").write_text("TABLE = {1: 2}\n")
    assert drv.unmapped_modules({}, root=tmp_path) == ["refmodel/new.py"]


def test_mutants_run_without_the_theorem_memo(monkeypatch):
    # the memo answers by argument and module-attribute identity; a mutmut mutant changes neither, so a memo left on
    # would hand every mutant the warm parent's theorem results (the first sample of spec/theorems/fork_tile.py kept
    # a mutant alive that passes the wrong argument to sym_tile)
    monkeypatch.setenv("FA3VERIFY_THEOREM_MEMO", "1")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    env = drv.mutmut_env()
    assert env["FA3VERIFY_THEOREM_MEMO"] == "0" and "PYTHONPATH" not in env
