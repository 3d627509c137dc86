"""Tests of what keeps the suite and the tool sound: deadlines, interrupts, budgets, determinism, layering, packaging, CI recipes, mutation testing."""
