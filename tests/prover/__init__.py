"""Tests of the spec: invariants, the configuration domain and its assumptions, guards, case files, and the z3 theorems and their prover."""
