"""Pins of combine (issue 20): values derived by hand from FA3's source, each killing a mutant."""
