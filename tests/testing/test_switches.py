"""The in-process switches (``mock_server.testing.switches``) stay test support: named only in
``mock_server/testing``, refused when unknown, and absent from an app built without them."""

from __future__ import annotations

from pathlib import Path

import pytest

import mock_server
from mock_server import Backend, create_app
from mock_server.testing.switches import FAMILIES, create_app_with

PACKAGE = Path(mock_server.__file__).parent


def test_no_module_outside_testing_names_a_switch() -> None:
    names = {name for family in FAMILIES.values() for name in family.catalogue}
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "testing":
            continue
        source = path.read_text()
        named = sorted(name for name in names if name in source)
        assert named == [], f"{path.relative_to(PACKAGE)} names {named}"


def test_a_switch_name_belongs_to_one_family() -> None:
    seen: set[str] = set()
    for family in FAMILIES.values():
        assert not seen & set(family.catalogue)
        seen |= set(family.catalogue)


@pytest.mark.parametrize("keyword, noun", [("violations", "violation"),
                                           ("legal_variants", "legal variant")])
def test_unknown_switches_are_refused(keyword: str, noun: str) -> None:
    with pytest.raises(ValueError, match=f"unknown {noun}"):
        create_app_with(**{keyword: {"no_such_switch"}})


def test_without_switches_the_backend_is_the_faithful_one() -> None:
    assert type(create_app_with().state.backend) is Backend
    assert type(create_app().state.backend) is Backend
    switched = create_app(violations={"foreign_403"}).state.backend
    assert isinstance(switched, Backend) and type(switched) is not Backend
