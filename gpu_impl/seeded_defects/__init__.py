"""Seeded defects as transformations of a system under test, applied from outside.

A seeded defect (named in the registry :data:`gpu_impl.defects.DEFECTS`) is a mixin class that overrides the one
step of the sglang-like backend (:mod:`.backend`) or of the emulated FA3 kernel (:mod:`.kernel`) it changes; the
backend and the kernel themselves consult no defect registry. :func:`seeded_class` composes the mixins of a set of
names over the base class (cached, so the same names give the same class), and a seeded object pickles and copies
as its base class plus the names. Policy-layer defects change the scenario's policy instead
(``gpu_impl.defects.apply_policy_defects``); caller-layer ones are played by the catalogue's directed cases.

Invariant: an object of a seeded class behaves as its base except in the steps its defects' mixins override,
and with no names it is the base class itself.
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["Seeded", "seeded_class", "seeded_copy"]

_CLASSES: dict = {}


class Seeded:
    """Base of every seeded class: remembers the unseeded class and pickles as (base, defect names, state)."""

    _seed_base: type = object
    _seed_table: str = ""
    defects: frozenset = frozenset()

    def __reduce_ex__(self, protocol):
        return (_rebuild, (self._seed_base, tuple(sorted(self.defects)), self._seed_table, self.__dict__.copy()))


def _table(name: str) -> dict:
    if name == "backend":
        from .backend import BACKEND_SEEDS

        return BACKEND_SEEDS
    from .kernel import KERNEL_SEEDS

    return KERNEL_SEEDS


def seeded_class(base: type, names: Iterable[str], table: str) -> type:
    """``base`` with the mixins of ``names`` found in the ``table`` ("backend" or "kernel") composed over it.

    Names without a transformation in that table are carried in ``defects`` but change nothing (the kernel-layer
    defects a backend is told about, for instance). The mixins are ordered by name, so the class is deterministic.
    """
    base = getattr(base, "_seed_base", base) if issubclass(base, Seeded) else base
    names = frozenset(names)
    key = (base, names, table)
    if key not in _CLASSES:
        seeds = _table(table)
        mixins = tuple(seeds[n] for n in sorted(names) if n in seeds)
        _CLASSES[key] = type(f"Seeded{base.__name__}", (Seeded, *mixins, base),
                             {"_seed_base": base, "defects": names, "_seed_table": table,
                              "__module__": base.__module__, "__doc__": base.__doc__})
    return _CLASSES[key]


def seeded_copy(obj, names: Iterable[str], table: str):
    """A shallow copy of ``obj`` whose class carries ``names`` on top of the defects ``obj`` already has."""
    cls = seeded_class(type(obj), frozenset(getattr(obj, "defects", frozenset())) | frozenset(names), table)
    twin = object.__new__(cls)
    twin.__dict__.update(obj.__dict__)
    return twin


def _rebuild(base: type, names: tuple, table: str, state: dict):
    obj = object.__new__(seeded_class(base, names, table) if names else base)
    obj.__dict__.update(state)
    return obj
