"""The suite runs its test files longest first (tests/conftest.py, by tests/file_seconds.json), and
scripts/file_seconds.py refreshes that table from a timing run's JUnit XML."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import conftest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("file_seconds", ROOT / "scripts" / "file_seconds.py")
FS = importlib.util.module_from_spec(spec)
spec.loader.exec_module(FS)

JUNIT = """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="tests.test_a" name="t1" time="2.5"/><testcase classname="tests.test_a" name="t2" time="1.5"/>
<testcase classname="tests.test_b" name="t1" time="0.25"/>
<testcase classname="tests.gpu.test_g.TestK" name="t1" time="1.0"/>
</testsuite></testsuites>"""


def test_files_run_longest_first_unknown_ones_at_the_median_and_each_file_keeps_its_order(tmp_path):
    table = {"tests/test_a.py": 1.0, "tests/test_b.py": 50.0, "tests/test_c.py": 5.0}
    assert conftest.file_order(["tests/test_a.py", "tests/test_new.py", "tests/test_b.py", "tests/test_c.py"],
                               table) == ["tests/test_b.py", "tests/test_new.py", "tests/test_c.py", "tests/test_a.py"]
    items = [SimpleNamespace(path=ROOT / f"tests/test_{f}.py", n=n) for f, n in
             [("a", 0), ("a", 1), ("c", 0), ("b", 0), ("a", 2), ("b", 1)]]
    table_file = tmp_path / "file_seconds.json"
    table_file.write_text(json.dumps(table))
    saved, conftest.FILE_SECONDS = conftest.FILE_SECONDS, table_file
    try:
        conftest.pytest_collection_modifyitems(None, SimpleNamespace(rootpath=ROOT), items)
    finally:
        conftest.FILE_SECONDS = saved
    assert [(i.path.name, i.n) for i in items] == [("test_b.py", 0), ("test_b.py", 1), ("test_c.py", 0),
                                                   ("test_a.py", 0), ("test_a.py", 1), ("test_a.py", 2)]
    # negative control: without a table the collection order stays as collected
    unordered = list(items[::-1])
    conftest.FILE_SECONDS = tmp_path / "missing.json"
    try:
        conftest.pytest_collection_modifyitems(None, SimpleNamespace(rootpath=ROOT), unordered)
    finally:
        conftest.FILE_SECONDS = saved
    assert unordered == items[::-1]


def test_the_script_sums_a_files_tests_and_merges_into_the_table(tmp_path):
    (tmp_path / "run.xml").write_text(JUNIT)
    assert FS.file_seconds(tmp_path / "run.xml") == {"tests/test_a.py": 4.0, "tests/test_b.py": 0.25,
                                                        "tests/gpu/test_g.py": 1.0}
    (tmp_path / "tests").mkdir()
    for name in ("test_a.py", "test_b.py", "test_kept.py"):
        (tmp_path / "tests" / name).write_text("")
    old = {"tests/test_a.py": 99.0, "tests/test_kept.py": 7.0, "tests/test_gone.py": 3.0}
    merged = FS.merge(old, FS.file_seconds(tmp_path / "run.xml"), root=tmp_path)
    assert merged == {"tests/test_kept.py": 7.0, "tests/test_a.py": 4.0, "tests/test_b.py": 0.2,
                      "tests/gpu/test_g.py": 1.0}
    assert list(merged) == ["tests/test_kept.py", "tests/test_a.py", "tests/gpu/test_g.py", "tests/test_b.py"]


def test_the_script_refuses_a_missing_run_file_with_exit_2(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "file_seconds.py"), "--from",
                          str(tmp_path / "nope.xml"), "--table", str(tmp_path / "t.json")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "nope.xml is not a file" in out.stderr and not (tmp_path / "t.json").exists()


def test_the_stored_table_is_seconds_per_existing_test_file():
    table = json.loads((ROOT / "tests" / "file_seconds.json").read_text())
    assert table and all(isinstance(s, (int, float)) and s >= 0 for s in table.values())
    assert all(f.startswith("tests/") and Path(f).name.startswith("test_") and f.endswith(".py") for f in table)
    assert all((ROOT / f).is_file() for f in table), [f for f in table if not (ROOT / f).is_file()]
