"""The toolkit shapings' families and the export's order agree: every shaping a family module
defines is in its `SHAPINGS`, and TOOLKIT_SHAPINGS runs each exactly once, each family's in the
order that family lists them. A shaping written but left out of either runs nowhere, silently.
"""
from __future__ import annotations

import inspect

import pytest

import rkcompile.views.toolkit_shapings as toolkit_shapings
from rkcompile.views.toolkit_shapings import FAMILIES, TOOLKIT_SHAPINGS


def test_toolkit_shapings_runs_every_family_shaping_once():
    listed = [shaping for family in FAMILIES for shaping in family.SHAPINGS]
    assert len({shaping.__name__ for shaping in TOOLKIT_SHAPINGS}) == len(TOOLKIT_SHAPINGS) == len(listed)
    assert set(TOOLKIT_SHAPINGS) == set(listed)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.__name__.rpartition(".")[2])
def test_a_family_lists_its_shapings_in_the_export_order(family):
    defined = {name for name, value in vars(family).items()
               if inspect.isfunction(value) and value.__module__ == family.__name__ and not name.startswith("_")}
    assert {shaping.__name__ for shaping in family.SHAPINGS} == defined
    assert [shaping for shaping in TOOLKIT_SHAPINGS if shaping in family.SHAPINGS] == list(family.SHAPINGS)


def test_the_package_names_each_shaping():
    """`from rkcompile.views.toolkit_shapings import NAME` keeps working for every shaping."""
    assert all(getattr(toolkit_shapings, shaping.__name__) is shaping for shaping in TOOLKIT_SHAPINGS)
