"""sglang as a system under test: its release's own FlashAttentionBackend on CPU, in the release's engine environment (host side, driver, glue, domain, recipes)."""
