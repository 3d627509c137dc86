"""Bad input to the command line: exit 2 with a message naming the field, never a traceback."""

import pytest
import torch

from fa3verify.cli import main


@pytest.mark.parametrize("argv,field", [
    (["gate", "--guard", "no.such.module:fn"], "--guard"),
    (["gate", "--guard", "examples/guards/prefix_guard.py"], "--guard"),
    (["prove", "--timeout-s", "0"], "--timeout-s"),
    (["prove", "--drop-assumption", "NOT_AN_ASSUMPTION"], "--drop-assumption"),
    (["fuzz", "--cases", "0"], "--cases"),
    (["replay", "no/such/case.json"], "CASE"),
])
def test_bad_input_exits_2_naming_the_field(argv, field, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available: the real kernel may load here")
def test_an_unavailable_real_kernel_is_a_usage_error_not_a_traceback(capsys):
    assert main(["fuzz", "--kernel", "fa3", "--cases", "1"]) == 2
    err = capsys.readouterr().err
    assert "--kernel" in err and "Traceback" not in err


def test_an_old_short_assumption_name_is_exit_2_naming_its_current_name_and_the_allowed_ones(capsys):
    """spec.model.config and spec.model.domain spell the assumptions one way (ASSUMPTION_*); the old short spelling is refused."""
    from spec.model.domain import ASSUMPTIONS

    assert all(name.startswith("ASSUMPTION_") for name in ASSUMPTIONS)
    assert main(["prove", "--drop-assumption", "TP_DIVISIBLE"]) == 2
    err = capsys.readouterr().err
    assert "--drop-assumption" in err and "TP_DIVISIBLE is now ASSUMPTION_TP_DIVISIBLE" in err
    assert all(name in err for name in ASSUMPTIONS) and "Traceback" not in err


def test_the_prover_and_the_config_share_the_names_of_their_common_assumptions():
    """A prover assumption that is also a spec.model.config validation rule has the same name (one source: spec.model.config)."""
    import spec.model.config as config
    from spec.model.domain import ASSUMPTIONS

    constants = {v for k, v in vars(config).items() if k.startswith("ASSUMPTION_")}
    assert set(ASSUMPTIONS) <= constants
    assert {"ASSUMPTION_TP_DIVISIBLE", "ASSUMPTION_PREFILL_CP_NEEDS_STRATEGY",
            "ASSUMPTION_ATTN_CP_NEEDS_PREFILL_CP"} <= set(ASSUMPTIONS) & config.ASSUMPTION_NAMES
