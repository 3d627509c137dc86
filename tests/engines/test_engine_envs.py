"""The one engine-environment builder (gpu_impl/engines/envs.py, installers.py) and the one worker loop
(gpu_impl/engines/protocol.py ``serve``), without building anything: recipe -> install commands, pip
configuration -> uv options, stamp compatibility, the torch-still-CPU check, and the loop's answers.

Paths in the sample pip configurations are made up (nothing of this machine's registry set-up is written here).
"""

import io
import json

import pytest

from gpu_impl.engines import envs, installers, protocol, torch_build
from gpu_impl.engines.sglang import recipes
from gpu_impl.engines.vllm import recipes as vllm_recipes
from gpu_impl.engines.errors import EnvSetupError, UnknownRelease
from fake_workers import installed_package

SAMPLE_CONFIG = """\
:env:.default-timeout='60'
:env:.find-links='/example/wheels'
global.cert='/example/ca.pem'
global.constraint='/example/global-constraints.txt'
global.extra-index-url='file:///example/a/simple file:///example/b/simple'
global.find-links='/example/other-wheels'
install.no-index='false'
global.disable-pip-version-check='1'
download.dest='/example/ignored'
"""


# ---------------------------------------------------------------- pip configuration -> uv


def test_pip_config_precedence_is_environment_then_install_then_global():
    cfg = installers.parse_pip_config(SAMPLE_CONFIG)
    assert cfg["find-links"] == "/example/wheels"  # the PIP_FIND_LINKS variable wins over the global file
    assert cfg["extra-index-url"] == "file:///example/a/simple file:///example/b/simple"
    assert cfg["no-index"] == "false" and "dest" not in cfg  # the download section does not apply to install
    text = "global.index-url='file:///example/g'\ninstall.index-url='file:///example/i'\n"
    assert installers.parse_pip_config(text)["index-url"] == "file:///example/i"


def test_pip_config_translates_to_uv_options_and_environment():
    tr = installers.translate_pip_config(installers.parse_pip_config(SAMPLE_CONFIG))
    args = tr.args
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]  # pip's rule: best version over all indexes
    pairs = list(zip(args[2::2], args[3::2]))
    assert ("--find-links", "/example/wheels") in pairs and ("--find-links", "/example/other-wheels") not in pairs
    assert ("--extra-index-url", "file:///example/a/simple") in pairs
    assert ("--extra-index-url", "file:///example/b/simple") in pairs
    assert ("--constraint", "/example/global-constraints.txt") in pairs
    assert "--no-index" not in args  # a switch that is off adds nothing
    assert tr.environ == {"SSL_CERT_FILE": "/example/ca.pem", "UV_HTTP_TIMEOUT": "60"}
    assert tr.untranslated == []


def test_an_option_without_a_uv_equivalent_keeps_pip(monkeypatch):
    """Negative control: pip's configuration asks for something uv would not honour -> pip installs."""
    monkeypatch.delenv(installers.CHOICE_VARIABLE, raising=False)
    monkeypatch.setattr(installers, "find_uv", lambda: "/example/bin/uv")
    monkeypatch.setattr(installers, "pip_config", lambda python: SAMPLE_CONFIG + "global.client-cert='/x.pem'\n")
    inst = installers.choose("/example/env/bin/python")
    assert inst.name == "pip" and "client-cert" in inst.note
    assert inst.command(["x"])[:4] == ["/example/env/bin/python", "-m", "pip", "install"]
    assert inst.venv_command("/base/python3.11", "/e") == ["/base/python3.11", "-m", "venv", "/e"]


def test_uv_is_chosen_when_installed_and_bound_to_the_environment(monkeypatch):
    monkeypatch.delenv(installers.CHOICE_VARIABLE, raising=False)
    monkeypatch.setattr(installers, "find_uv", lambda: "/example/bin/uv")
    monkeypatch.setattr(installers, "pip_config", lambda python: SAMPLE_CONFIG)
    inst = installers.choose("/example/env/bin/python")
    cmd = inst.command(["--no-deps", "pkg"])
    assert inst.name == "uv" and cmd[:5] == ["/example/bin/uv", "pip", "install", "--python", "/example/env/bin/python"]
    assert "--no-config" in cmd and cmd[cmd.index("--link-mode") + 1] == "hardlink"
    assert cmd[-2:] == ["--no-deps", "pkg"] and inst.environ["SSL_CERT_FILE"] == "/example/ca.pem"


def test_installer_choice_pip_forced_uv_missing_and_bad_values(monkeypatch):
    monkeypatch.setattr(installers, "find_uv", lambda: "/example/bin/uv")
    monkeypatch.setenv(installers.CHOICE_VARIABLE, "pip")
    assert installers.choose("/p").name == "pip"
    monkeypatch.setenv(installers.CHOICE_VARIABLE, "conda")
    with pytest.raises(ValueError, match="FA3VERIFY_INSTALLER: must be 'pip' or 'uv'"):
        installers.choose("/p")
    monkeypatch.setattr(installers, "find_uv", lambda: None)
    monkeypatch.setenv(installers.CHOICE_VARIABLE, "uv")
    with pytest.raises(ValueError, match="uv is not installed"):
        installers.choose("/p")
    monkeypatch.delenv(installers.CHOICE_VARIABLE)
    assert installers.choose("/p").name == "pip"


# ---------------------------------------------------------------- recipes -> commands


def test_vllm_recipe_commands_install_the_binding_and_keep_the_no_deps_pins():
    first = envs.package_steps("0.33.0", engine="vllm")
    assert first == [("install torch (CPU)", ["torch==2.13.0"]),
                     ("install vllm==0.33.0 (no deps)", ["--no-deps", "vllm==0.33.0"])]
    assert envs.package_steps("0.33.0", engine="vllm", wheel="/w/vllm.whl")[1][1] == ["--no-deps", "/w/vllm.whl"]
    (light_name, light), (nd_name, nd) = envs.install_steps("0.33.0", engine="vllm")
    assert "apache-tvm-ffi==0.1.11" in light and "transformers>=5.16.1,<5.21.0" in light
    assert nd_name == "install xgrammar, triton (no deps)" and nd == ["--no-deps", "xgrammar==0.2.8", "triton==3.9.0"]
    cons = vllm_recipes.RECIPES["0.33.0"]["constraints"]
    assert {"torchvision==0.0.0", "torchaudio==0.0.0", "torchcodec==0.0.0", "torch==2.13.0"} <= set(cons)


def test_vllm_rows_install_what_the_v1_runner_module_imports_at_the_wheel_pins():
    """0.10.1 .. 0.19.1 install the packages their V1 runner module (the cascade rule's home) imports, at the
    wheel's own specifiers; a marker is evaluated for CPython 3.11 on Linux x86_64 (numba's ``python_version >
    "3.9"`` pin holds, its ``== "3.9"`` pin, an extra's and another machine's do not)."""
    requires = ['numba==0.60.0; python_version == "3.9"', 'numba==0.61.2; python_version > "3.9"',
                "diskcache==5.6.3", "mistral_common[image]>=1.8.8", 'mistral_common[audio]; extra == "audio"',
                'xgrammar==0.1.21; platform_machine == "x86_64" or platform_machine == "aarch64"',
                'protobuf==7.36.1; platform_machine == "s390x"', 'six>=1.16.0; python_version > "3.11"']
    pins = vllm_recipes.wheel_requirements("0.15.1", requires)
    assert pins == {"numba": "==0.61.2", "diskcache": "==5.6.3", "mistral-common": ">=1.8.8", "xgrammar": "==0.1.21"}
    assert set(vllm_recipes.wheel_requirements("0.10.1", requires)) == {"numba", "diskcache", "xgrammar"}
    assert set(vllm_recipes.wheel_requirements("0.19.1", requires)) == {"diskcache", "xgrammar"}
    assert set(vllm_recipes.wheel_requirements("0.20.0", requires)) == {"xgrammar"}
    assert "numba==0.61.2" in envs.install_steps("0.13.0", "vllm", pins)[0][1]
    for name, first, last in (("numba", "0.10.1", "0.15.1"), ("mistral-common", "0.14.1", "0.16.0"),
                              ("diskcache", "0.10.1", "0.19.1")):
        rows = [r for r in vllm_recipes.RELEASES if name in vllm_recipes.RECIPES[r]["light"]]
        assert (rows[0], rows[-1]) == (first, last), name
        key = vllm_recipes.version_key
        assert rows == [r for r in vllm_recipes.RELEASES if key(first) <= key(r) <= key(last)], name


def test_sglang_recipe_commands_apply_the_wheel_pins_then_the_table():
    pins = envs.KINDS["sglang"].pins("0.5.23", ["transformers==5.19.0", "xgrammar==0.2.5", "triton==3.1.0",
                                                "numpy>=1.2", "orjson==3.1; python_version<'3.0'"])
    assert pins["transformers"] == "5.19.0" and pins["triton"] == "3.9.0"  # the table overrides the wheel
    assert "numpy" not in pins and "orjson" not in pins  # only exact, unconditional pins
    (_, light), (name, nd) = envs.install_steps("0.5.23", pins=pins)
    assert "transformers==5.19.0" in light and "numpy" in light
    assert name == "install triton, xgrammar (no deps)" and nd == ["--no-deps", "triton==3.9.0", "xgrammar==0.2.5"]
    assert "torchvision==0.0.0" in recipes.CONSTRAINTS


def test_targets_and_releases_are_checked_per_engine():
    assert envs.parse_target("0.5.23") == ("sglang", "0.5.23")
    assert envs.parse_target("vllm==0.33.0") == ("vllm", "0.33.0")
    with pytest.raises(UnknownRelease, match="allowed: sglang==V, vllm==V"):
        envs.parse_target("trt==1.0")
    with pytest.raises(UnknownRelease, match="registered: .*0.33.0, 0.34.0"):
        envs.check_release("0.5.23", engine="vllm")
    assert envs.env_dir("0.33.0", root=envs.Path("/r"), engine="vllm") == envs.Path("/r/vllm-0.33.0")
    assert envs.env_dir("0.5.23", root=envs.Path("/r")) == envs.Path("/r/sglang-0.5.23")


# ---------------------------------------------------------------- stamps


def test_stamps_without_engine_or_installer_stay_valid_and_other_recipes_do_not(tmp_path):
    d = tmp_path / "sglang-0.5.23"
    (d / "bin").mkdir(parents=True)
    (d / "bin" / "python").write_text("")
    old = {"recipe": recipes.recipe_hash("0.5.23"), "release": "0.5.23", "pins": {}, "seconds": {"total": 1}}
    (d / envs.STAMP).write_text(json.dumps(old))
    assert envs.env_ready("0.5.23", root=tmp_path)  # written by the builder before installers were recorded
    (d / envs.STAMP).write_text(json.dumps({**old, "engine": "sglang", "installer": "uv"}))
    assert envs.env_ready("0.5.23", root=tmp_path)
    (d / envs.STAMP).write_text(json.dumps({**old, "recipe": "0" * 16}))
    assert not envs.env_ready("0.5.23", root=tmp_path)  # negative control: another package set is rebuilt
    (d / envs.STAMP).write_text(json.dumps({**old, "engine": "vllm"}))
    assert not envs.env_ready("0.5.23", root=tmp_path)


def test_the_installer_is_not_in_the_recipe_hash(monkeypatch):
    monkeypatch.setenv(installers.CHOICE_VARIABLE, "pip")
    a = (envs.recipe_hash("0.5.13"), envs.recipe_hash("0.33.0", engine="vllm"))
    monkeypatch.setenv(installers.CHOICE_VARIABLE, "uv")
    assert (envs.recipe_hash("0.5.13"), envs.recipe_hash("0.33.0", engine="vllm")) == a
    assert envs.recipe_hash("0.33.0", engine="vllm") == recipes.hash_recipe(
        {"layout": 1, "release": "0.33.0", **vllm_recipes.RECIPES["0.33.0"]})  # the former vllm_env stamp hash


# ---------------------------------------------------------------- the build, with the commands recorded


class _FakeRun:
    def __init__(self, torch_line="2.13.0+cpu None"):
        self.cmds, self.torch_line = [], torch_line

    def __call__(self, what, step, cmd, env=None, timeout=1800):
        self.cmds.append((step, cmd))
        if step == "create venv":
            (envs.Path(cmd[-1]) / "bin").mkdir(parents=True)
            (envs.Path(cmd[-1]) / "bin" / "python").write_text("")
        if step.startswith("install ") and ("vllm==" in step or "sglang==" in step):
            installed_package(envs.Path(cmd[cmd.index("-c") + 1]).parent, step.split()[1].split("==")[0])
        if step.startswith("read"):
            return json.dumps(["transformers==5.19.0"])
        return self.torch_line if step == "check torch" else ""


def _fake_build(monkeypatch, tmp_path, engine, release, run, offered=("2.13.0+cpu", "2.13.0")):
    """A build with the commands recorded; ``offered``: the torch versions the (fake) configured indexes list."""
    monkeypatch.setattr(envs, "_run", run)
    monkeypatch.setattr(torch_build, "offered_versions", lambda *a, **k: list(offered))
    monkeypatch.setattr(installers, "find_uv", lambda: "/example/bin/uv")
    monkeypatch.setattr(installers, "pip_config", lambda python: SAMPLE_CONFIG)
    monkeypatch.delenv(installers.CHOICE_VARIABLE, raising=False)
    return envs.ensure_env(release, progress=lambda line: None, root=tmp_path, engine=engine)


def test_a_build_runs_the_recipe_through_the_installer_and_stamps_it(monkeypatch, tmp_path):
    run = _FakeRun()
    d = _fake_build(monkeypatch, tmp_path, "vllm", "0.33.0", run)
    steps = [s for s, _ in run.cmds]
    assert steps == ["create venv", "install torch (CPU)", "install vllm==0.33.0 (no deps)",
                     "install light dependencies", "install xgrammar, triton (no deps)", "check torch", "import probe"]
    assert run.cmds[0][1][:2] == ["/example/bin/uv", "venv"] and run.cmds[0][1][-1] == str(d)
    for step, cmd in run.cmds[1:5]:
        assert cmd[:3] == ["/example/bin/uv", "pip", "install"]
        assert cmd[cmd.index("-c") + 1] == str(d / "constraints.txt")
    assert "torchcodec==0.0.0" in (d / "constraints.txt").read_text()
    stamp = json.loads((d / envs.STAMP).read_text())
    assert stamp["installer"] == "uv" and stamp["engine"] == "vllm" and envs.env_ready("0.33.0", tmp_path, "vllm")
    assert (d / envs.MARKER).exists()
    # the configured indexes offer the CPU build: it is asked for by its exact version, uv's backend is not used
    assert run.cmds[1][1][-1] == "torch==2.13.0+cpu" and stamp["torch_source"] == "configured"
    assert all("--torch-backend" not in cmd for _, cmd in run.cmds)


def test_without_a_configured_cpu_torch_every_uv_install_uses_uv_cpu_backend(monkeypatch, tmp_path):
    """The stock-index branch: the indexes list only the CUDA build, so uv's own CPU backend is asked for."""
    run = _FakeRun()
    d = _fake_build(monkeypatch, tmp_path, "sglang", "0.5.23", run, offered=("2.13.0", "2.14.0"))
    installs = [(s, cmd) for s, cmd in run.cmds if s.startswith("install")]
    assert installs[0] == ("install torch (CPU)", installs[0][1]) and installs[0][1][-1] == "torch==2.13.0"
    for _, cmd in installs:
        i = cmd.index("--torch-backend")
        assert cmd[i + 1] == "cpu" and cmd[:3] == ["/example/bin/uv", "pip", "install"]
    assert json.loads((d / envs.STAMP).read_text())["torch_source"] == "uv-cpu-backend"


def test_without_a_cpu_torch_and_without_uv_the_build_is_refused_before_anything_is_made(monkeypatch, tmp_path):
    """Negative control: pip alone cannot get the CPU build from indexes that lack it: a clear refusal, no venv."""
    run = _FakeRun()
    monkeypatch.setenv(installers.CHOICE_VARIABLE, "pip")
    monkeypatch.setattr(envs, "_run", run)
    monkeypatch.setattr(torch_build, "offered_versions", lambda *a, **k: ["2.13.0"])
    with pytest.raises(EnvSetupError, match=r"torch 2\.13\.0\+cpu: the configured package indexes offer no CPU build.*uv"):
        envs.ensure_env("0.5.23", progress=lambda line: None, root=tmp_path)
    assert run.cmds == [] and not (tmp_path / "sglang-0.5.23").exists()


def test_a_cuda_torch_after_the_install_fails_the_build_and_leaves_no_stamp(monkeypatch, tmp_path):
    """Negative control: an installer that swapped in a CUDA torch is caught by the torch check."""
    for line in ("2.13.0 12.8", "2.13.0+cu128 12.8", "2.14.0+cpu None", "2.13.0+cpu 12.8"):
        run = _FakeRun(torch_line=line)
        root = tmp_path / line.replace(" ", "_")
        with pytest.raises(EnvSetupError, match="torch became"):
            _fake_build(monkeypatch, root, "sglang", "0.5.23", run)
        assert not (root / "sglang-0.5.23" / envs.STAMP).exists() and not envs.env_ready("0.5.23", root)
    envs.check_torch("x", "torch==2.13.0", "2.13.0+cpu None\n")


def test_an_environment_whose_engine_code_was_edited_is_rebuilt_naming_the_file(monkeypatch, tmp_path):
    """An environment is judged as its release: a module edited after the install (here as a patched copy that
    wrote through a folder link would) is found against the wheel's RECORD and the environment rebuilt; the same
    environment unedited is reused as it is (the control)."""
    d = _fake_build(monkeypatch, tmp_path, "vllm", "0.33.0", _FakeRun())
    reuse = _FakeRun()
    monkeypatch.setattr(envs, "_run", reuse)
    assert envs.ensure_env("0.33.0", progress=lambda line: None, root=tmp_path, engine="vllm") == d
    assert reuse.cmds == []
    (d / "lib" / "python3.11" / "site-packages" / "vllm" / "__init__.py").write_text("VERSION = 2\n")
    lines, rebuild = [], _FakeRun()
    monkeypatch.setattr(envs, "_run", rebuild)
    assert envs.ensure_env("0.33.0", progress=lines.append, root=tmp_path, engine="vllm") == d
    assert "differ from the release's RECORD (vllm/__init__.py); rebuilding" in lines[0]
    assert [s for s, _ in rebuild.cmds][0] == "create venv" and envs.env_ready("0.33.0", tmp_path, "vllm")
    assert (d / "lib" / "python3.11" / "site-packages" / "vllm" / "__init__.py").read_text() == "VERSION = 1\n"


def test_a_build_whose_package_does_not_match_its_record_is_refused_unstamped(monkeypatch, tmp_path):
    """Negative control of the build's own check: an install that leaves no RECORD is not stamped ready."""
    import shutil

    class NoRecord(_FakeRun):
        def __call__(self, what, step, cmd, env=None, timeout=1800):
            out = super().__call__(what, step, cmd, env, timeout)
            if step == "import probe":
                for info in envs.Path(cmd[0]).parents[1].glob("lib/python3.11/site-packages/*.dist-info"):
                    shutil.rmtree(info)
            return out

    with pytest.raises(EnvSetupError, match="does not match its own RECORD"):
        _fake_build(monkeypatch, tmp_path, "vllm", "0.33.0", NoRecord())
    assert not envs.env_ready("0.33.0", tmp_path, "vllm")


def test_a_directory_not_made_by_the_builder_is_never_removed(monkeypatch, tmp_path):
    (tmp_path / "vllm-0.33.0").mkdir()
    (tmp_path / "vllm-0.33.0" / "keep.txt").write_text("mine")
    with pytest.raises(EnvSetupError, match="was not made by fa3-verify"):
        _fake_build(monkeypatch, tmp_path, "vllm", "0.33.0", _FakeRun())
    assert (tmp_path / "vllm-0.33.0" / "keep.txt").read_text() == "mine"


# ---------------------------------------------------------------- the worker loop


class _Engine:
    OPS = ("run",)

    def hello(self):
        return {"release": "t"}

    def run(self, scenario, numerics=False):
        if scenario == "unsupported":
            raise protocol.Unsupported("not driven")
        if scenario == "crash":
            raise RuntimeError("boom")
        return {"echo": scenario, "numerics": numerics}

    def secret(self):  # not in OPS: never reachable from a request
        return {"leaked": True}


def _serve(lines, engine=_Engine):
    out = io.StringIO()
    code = protocol.serve(engine, io.StringIO("".join(line + "\n" for line in lines)), out)
    return code, [json.loads(x) for x in out.getvalue().splitlines()]


def test_serve_answers_every_request_and_errors_as_answers():
    code, answers = _serve(['{"op": "run", "scenario": 5, "numerics": true}', "", '{"op": "run", "scenario": '
                            '"unsupported"}', '{"op": "run", "scenario": "crash"}', '{"op": "run"}',
                            '{"op": "secret"}', "not json", "[1]", '{"op": "hello"}'])
    assert code == 0 and answers[0] == {"ok": True, "hello": {"release": "t"}}
    assert answers[1] == {"ok": True, "echo": 5, "numerics": True}
    assert [a.get("kind") for a in answers[2:]] == ["unsupported", "crash", "bad_request", "bad_request",
                                                    "bad_request", "bad_request", None]
    assert "boom" in answers[3]["error"] and "unknown op 'secret'" in answers[5]["error"]
    assert answers[-1] == {"ok": True, "hello": {"release": "t"}}


def test_serve_ends_on_quit_and_on_end_of_input():
    code, answers = _serve(['{"op": "quit"}', '{"op": "run", "scenario": 1}'])
    assert code == 0 and answers[-1] == {"ok": True, "bye": True} and len(answers) == 2
    assert _serve([]) == (0, [{"ok": True, "hello": {"release": "t"}}])


def test_serve_reports_an_engine_that_does_not_import():
    def broken():
        raise ImportError("no module named sglang", name="sglang")

    code, answers = _serve(['{"op": "hello"}'], engine=broken)
    assert code == 3 and len(answers) == 1 and answers[0]["kind"] == "import" and "sglang" in answers[0]["error"]


def test_both_drivers_use_the_one_loop():
    import ast
    from pathlib import Path

    for name in ("sglang/driver.py", "vllm/driver.py"):
        tree = ast.parse((Path(envs.__file__).parent / name).read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert not {"serve", "_quiet", "Unsupported"} & defined, name


def test_driver_environment_per_engine():
    base = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHOME": "/x", "VLLM_LOGGING_LEVEL": "DEBUG", "PATH": "/bin"}
    sg = envs.driver_environ(base=base)
    assert sg["SGLANG_USE_SGL_FA3_KERNEL"] == "1" and "PYTHONDONTWRITEBYTECODE" not in sg and "PYTHONHOME" not in sg
    assert sg["PYTHONPATH"].split(":")[-2:] == [str(envs.FAKES_DIR), str(envs.PROJECT_ROOT)]
    assert envs.driver_environ(["/co"], base=base)["PYTHONDONTWRITEBYTECODE"] == "1"  # nothing written in a checkout
    for value in ("", None):  # a caller with bytecode writing on (`make test`) writes none in a checkout either
        caller = {k: v for k, v in {**base, "PYTHONDONTWRITEBYTECODE": value}.items() if v is not None}
        assert envs.driver_environ(["/co"], base=caller)["PYTHONDONTWRITEBYTECODE"] == "1"
    vl = envs.driver_environ(base={"PATH": "/bin"}, engine="vllm")
    assert vl["VLLM_LOGGING_LEVEL"] == "ERROR" and "SGLANG_USE_SGL_FA3_KERNEL" not in vl
    assert envs.driver_environ(base=base, engine="vllm")["VLLM_LOGGING_LEVEL"] == "DEBUG"  # the user's wins


def test_main_builds_the_targets_side_by_side_and_reports_in_their_order(monkeypatch, capsys):
    """``python -m gpu_impl.engines.envs A B C`` builds up to FA3VERIFY_ENV_JOBS at once; the result lines keep
    the targets' order; a failing build is exit 2 after the others have ended. Negative control: with one job at
    a time no two builds overlap."""
    import threading
    import time as _time

    from gpu_impl.engines.errors import EnvSetupError

    running, most, done = [0], [0], []
    lock = threading.Lock()

    def fake_ensure(release, engine="sglang", **_):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        _time.sleep(0.2 if release == "0.5.13" else 0.05)  # the first target ends last
        with lock:
            running[0] -= 1
            done.append(release)
        if release == "0.5.14":
            raise EnvSetupError(f"{engine}=={release}: environment set-up step 'import probe' failed (exit 1)")
        return f"/envs/{engine}-{release}"

    monkeypatch.setattr(envs, "ensure_env", fake_ensure)
    monkeypatch.setattr(envs, "setup_times", lambda release, engine="sglang": {"total": 1.0})
    monkeypatch.setenv("FA3VERIFY_ENV_JOBS", "3")
    assert envs.main(["0.5.13", "0.5.23", "vllm==0.33.0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["sglang==0.5.13", "sglang==0.5.23", "vllm==0.33.0"]
    assert most[0] == 3 and done[-1] == "0.5.13"
    most[0], done[:] = 0, []
    assert envs.main(["0.5.13", "0.5.14", "0.5.23"]) == 2
    captured = capsys.readouterr()
    assert "import probe" in captured.err and set(done) == {"0.5.13", "0.5.14", "0.5.23"}
    # negative control: one at a time
    most[0] = 0
    monkeypatch.setenv("FA3VERIFY_ENV_JOBS", "1")
    assert envs.main(["0.5.13", "0.5.23"]) == 0 and most[0] == 1
    capsys.readouterr()
    # bad values name the variable; an unknown target is refused before anything is built
    monkeypatch.setenv("FA3VERIFY_ENV_JOBS", "0")
    done[:] = []
    assert envs.main(["0.5.13"]) == 2 and "FA3VERIFY_ENV_JOBS" in capsys.readouterr().err and done == []
    monkeypatch.setenv("FA3VERIFY_ENV_JOBS", "2")
    assert envs.main(["0.5.13", "trt==1.0"]) == 2 and done == []


def project_imports(source: str) -> list:
    """(module, names) of every ``from gpu_impl... import ...`` / ``from spec...`` / ``from refmodel...`` statement in
    a Python source string (an import probe run in an engine environment)."""
    import ast

    return [(node.module, [a.name for a in node.names]) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.split(".")[0] in ("gpu_impl", "spec", "refmodel", "fa3verify")]


def test_every_import_probe_names_project_modules_that_exist():
    """The import probe a new environment runs (``envs.KINDS[...].probe``) imports the project's own glue by name; a
    moved module left under its old name there fails every environment built from nothing (only a fresh engine home
    shows it). Each project import of each probe resolves here, without the engine; negative control: the old name."""
    import importlib

    from gpu_impl.engines import envs

    def unresolved(source):
        bad = []
        for module, names in project_imports(source):
            mod = importlib.import_module(module)
            bad += [f"{module}.{n}" for n in names if not hasattr(mod, n)
                    and importlib.util.find_spec(f"{module}.{n}") is None]
        return bad

    probes = {name: kind.probe for name, kind in envs.KINDS.items()}
    assert any(project_imports(p) for p in probes.values())  # the check reaches a project import
    assert {name: unresolved(p) for name, p in probes.items()} == {name: [] for name in probes}
    assert unresolved("from gpu_impl.engines import vllm_glue; vllm_glue.install()") == ["gpu_impl.engines.vllm_glue"]


# ---------------------------------------------------------------- patched release copies never write the release


def test_a_patched_copy_never_writes_through_a_link_into_the_release(monkeypatch, tmp_path):
    """tests/release_copies.py: a module named when the copy is made is patched in the copy alone; patching one
    reached through a linked folder is refused (it would have replaced the release's own file in its cached
    environment), and the release's files are unchanged either way."""
    import sys

    sys.path.insert(0, str(envs.Path(__file__).resolve().parents[1]))
    from release_copies import linked_copy, patch_linked_module

    monkeypatch.setenv("FA3VERIFY_ENGINE_HOME", str(tmp_path / "home"))
    site = envs.env_dir("0.33.0", engine="vllm") / "lib" / "python3.11" / "site-packages" / "vllm"
    for module in ("named/one.py", "other/two.py"):
        (site / module).parent.mkdir(parents=True, exist_ok=True)
        (site / module).write_text("X = 1\n")
    root = linked_copy("vllm", "0.33.0", tmp_path / "copy", {envs.Path("named/one.py"): ((r"X = 1", "X = 2"),)})
    assert (root / "vllm" / "named" / "one.py").read_text() == "X = 2\n"
    with pytest.raises(AssertionError, match="not a link in a real folder of the copy"):
        patch_linked_module(root / "vllm" / "other" / "two.py", ((r"X = 1", "X = 3"),), "vllm 0.33.0 other")
    assert (site / "named" / "one.py").read_text() == (site / "other" / "two.py").read_text() == "X = 1\n"
