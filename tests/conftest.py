"""Test-suite settings: torch on one thread (the suite's tensors are small; threads only add contention)."""

import torch

torch.set_num_threads(1)
