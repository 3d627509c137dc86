"""An unregistered ``--engine vllm==V`` is told, before any work, the nearest driver generation, how to run the
release's own code with it (``vllm-src=``) and what registering it takes: exit 2, never a traceback or a verdict;
a release older than the first with the precompute has nothing to gate (gpu_impl/engines/envs.py ``_check_vllm``,
gpu_impl/engines/vllm/recipes.py ``unregistered_message``)."""

from __future__ import annotations

import pytest

from fa3verify import cli
from gpu_impl.engines import envs
from gpu_impl.engines.errors import NoPrecompute
from gpu_impl.engines.vllm import recipes as vllm_recipes


@pytest.mark.parametrize("command", [["gate", "--cases", "2"], ["fuzz", "--cases", "2"], ["engine", "setup"]])
def test_a_newer_unregistered_release_is_exit_2_naming_the_nearest_generation(command, capsys):
    argv = command[:1] + (["setup", "vllm==0.35.0"] if command[0] == "engine" else ["--engine", "vllm==0.35.0",
                                                                                    *command[1:]])
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "vllm==0.35.0" in err
    assert "nearest driver generation is v2 (vllm==0.34.0's)" in err
    assert "--engine vllm-src=<the vllm 0.35.0 wheel>" in err and "DRIVER_GENERATIONS" in err


def test_a_release_before_the_precompute_has_nothing_to_gate(capsys):
    with pytest.raises(NoPrecompute, match=r"first in 0\.8\.5"):
        envs.check_release("0.8.4", engine="vllm")
    assert cli.main(["gate", "--engine", "vllm==0.8.4", "--cases", "2"]) == 2
    err = capsys.readouterr().err
    assert "no FA3 metadata precompute" in err and "Traceback" not in err
    assert vllm_recipes.FIRST_PRECOMPUTE == min(vllm_recipes.RELEASES, key=vllm_recipes.version_key)
    assert vllm_recipes.WITHOUT_PRECOMPUTE == ("0.8.0", "0.8.1", "0.8.2", "0.8.3", "0.8.4")


def test_the_runner_bound_releases_are_rows_of_driver_generation_v0():
    for release in ("0.8.5", "0.8.5.post1", "0.9.0", "0.9.1", "0.9.2", "0.10.0"):
        assert envs.check_release(release, engine="vllm") == release
        assert vllm_recipes.DRIVER_GENERATIONS[release] == "v0"
    assert envs.check_release("0.9.0.1", engine="vllm") == "0.9.0"  # driven files byte-identical
