"""Pins of refmodel/__init__.py: the package's public names are loaded on first use from the one submodule that
defines each (PEP 562), `refmodel.attention` stays the oracle function, and an unknown name is an AttributeError."""

import importlib

import pytest

import refmodel


def test_every_public_name_is_the_object_of_its_defining_submodule():
    for name in refmodel.__all__:
        module = importlib.import_module(f"refmodel.{refmodel._NAMES[name]}")
        assert getattr(refmodel, name) is getattr(module, name), name
    assert set(refmodel._NAMES) == set(refmodel.__all__)


def test_a_name_is_cached_in_the_package_after_first_use():
    refmodel.__dict__.pop("split_block_range", None)
    value = refmodel.split_block_range
    assert refmodel.__dict__["split_block_range"] is value


def test_refmodel_attention_is_the_function_even_after_its_submodule_is_imported():
    importlib.import_module("refmodel.attention")
    assert callable(refmodel.attention) and not isinstance(refmodel.attention, type(refmodel))
    assert refmodel.attention is importlib.import_module("refmodel.attention").attention
    refmodel.other_name = 5          # any other attribute is set as usual
    assert refmodel.other_name == 5
    del refmodel.other_name


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError) as info:
        refmodel.not_a_name  # noqa: B018
    assert str(info.value) == "module 'refmodel' has no attribute 'not_a_name'"


def test_dir_lists_the_public_names_and_the_loaded_ones():
    names = dir(refmodel)
    assert set(refmodel.__all__) <= set(names) and names == sorted(names) and "_NAMES" in names
