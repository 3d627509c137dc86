"""An engine release the suite does not drive gets the next step: the nearest supported release and the source form
(``sglang-src=PATH`` / ``vllm-src=PATH``) that runs that version's own code beside it; exit 2, no traceback, the
option the user passed named (``gpu_impl.engines.envs.next_step``)."""

import pytest

from fa3verify.cli import main
from gpu_impl.engines.sglang import recipes
from gpu_impl.engines.vllm import recipes as vllm_recipes

#: Releases past (or before) every registered one: the nearest is the newest (or the oldest) registered release.
CASES = {
    "vllm==0.99.0": (f"vllm=={vllm_recipes.RELEASES[-1]}", "vllm-src=PATH"),
    "vllm==0.1.0": (f"vllm=={vllm_recipes.RELEASES[0]}", "vllm-src=PATH"),
    "sglang==9.9.9": (f"sglang=={recipes.RELEASES[-1]}", "sglang-src=PATH"),
}


@pytest.mark.parametrize("engine", sorted(CASES))
@pytest.mark.parametrize("command", [["gate", "--cases", "1"], ["fuzz", "--cases", "1"], ["conform", "--cases", "1"]])
def test_an_unknown_release_names_the_nearest_release_and_the_source_form(engine, command, capsys, tmp_path):
    nearest, form = CASES[engine]
    assert main(command + ["--engine", engine, "--json", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert f"the nearest supported release is {nearest}" in err and f"use {form} (" in err, err
    assert f"error: --engine: {engine}: not a" in err and "--engine-profile" not in err, err
    assert "Traceback" not in err and not (tmp_path / "s.json").exists()


def test_a_registered_release_is_accepted_by_the_same_check():
    """Negative control: the check that refuses an unknown release lets a registered one through."""
    from gpu_impl.engines import envs

    assert envs.check_release("0.5.23") == "0.5.23" and envs.check_release("0.33.0", engine="vllm") == "0.33.0"
    with pytest.raises(envs.UnknownRelease, match="nearest supported release"):
        envs.check_release("0.99.0", engine="vllm")


def test_engine_setup_of_an_unknown_release_gives_the_next_step(capsys):
    assert main(["engine", "setup", "sglang==9.9.9"]) == 2
    err = capsys.readouterr().err
    assert f"the nearest supported release is sglang=={recipes.RELEASES[-1]}" in err and "sglang-src=PATH" in err
    assert main(["engine", "setup", "vllm==0.99.0"]) == 2
    err = capsys.readouterr().err
    assert f"the nearest supported release is vllm=={vllm_recipes.RELEASES[-1]}" in err and "vllm-src=PATH" in err


def test_the_nearest_release_is_the_newest_at_or_before_the_version_else_the_oldest():
    from gpu_impl.engines.envs import next_step

    assert f"nearest supported release is sglang=={recipes.RELEASES[-1]};" in next_step("sglang", "0.6.0")
    assert f"nearest supported release is sglang=={recipes.RELEASES[0]};" in next_step("sglang", "0.5.1")
    assert "nearest supported release is sglang==0.5.14;" in next_step("sglang", "0.5.14.post3")
    assert f"nearest supported release is vllm=={vllm_recipes.RELEASES[-1]};" in next_step("vllm", "0.99.2")
