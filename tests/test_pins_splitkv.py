"""Pins of splitkv (issue 20): values derived by hand from FA3's source, each killing a mutant."""
