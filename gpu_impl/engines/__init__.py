"""Real serving engines as systems under test (see gpu_impl/sut.py); filled in by sglang.py."""
