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
