"""vLLM as a system under test: its release's FlashAttention metadata builder and impl on CPU, in the release's engine environment (host side, drivers, glue, numerics, recipes)."""
