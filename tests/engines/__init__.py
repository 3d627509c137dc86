"""Tests of systems under test: the backend model's runner, real sglang and vLLM releases and checkouts, their environments and workers, the sanitizer, multi-rank runs, gpu-check."""
