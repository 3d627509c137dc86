"""Test-suite settings: torch on one thread (the suite's tensors are small; threads only add contention), and the
memo of theorem parts (spec.theorem_memo): a theorem part run again with the same arguments, while nothing in
refmodel, spec or z3 has been replaced (a monkeypatch, a counterfactual), is answered from the first run
(FA3VERIFY_THEOREM_MEMO=0 turns it off)."""

import os

import torch

from spec import theorem_memo

torch.set_num_threads(1)
if os.environ.get("FA3VERIFY_THEOREM_MEMO", "1") != "0":
    theorem_memo.enable()
