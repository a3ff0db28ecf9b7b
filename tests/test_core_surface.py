"""plugmq.core is the plugin-author surface: small, one contracts module per hook family, old names kept."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import plugmq.core
from plugmq.core import contracts
from plugmq.core.contracts import ConsumerHandover, LaneProgress
from plugmq.core.errors import ValidationError

FAMILY_MODULES = ("declaration", "storage", "journal", "delay", "filter", "allocation", "transaction", "cluster",
                  "replication", "leadership", "events")


def test_the_author_surface_is_sixty_names_or_fewer_and_imports_cleanly() -> None:
    assert len(plugmq.core.__all__) <= 60
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in plugmq.core.__all__:
            assert getattr(plugmq.core, name) is not None


@pytest.mark.parametrize("name", sorted(plugmq.core._MOVED_NAMES))
def test_a_name_dropped_from_the_surface_still_imports_with_a_warning(name: str) -> None:
    module = plugmq.core._MOVED_NAMES[name]
    with pytest.warns(DeprecationWarning, match=f"import it from {re.escape(module)}"):
        value = getattr(plugmq.core, name)
    assert value is getattr(importlib.import_module(module), name)
    assert name not in plugmq.core.__all__


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        plugmq.core.NoSuchThing  # noqa: B018


def test_contracts_has_a_module_per_hookspec_family_and_exports_them_all() -> None:
    hookspecs = Path(plugmq.core.hookspecs.__file__).read_text(encoding="utf-8")
    banners = re.findall(r"^# (\w+)", hookspecs, re.MULTILINE)
    assert set(banners) <= set(FAMILY_MODULES), f"hookspec banners without a contracts module: {set(banners)}"
    exported = set()
    for family in FAMILY_MODULES:
        module = importlib.import_module(f"plugmq.core.contracts.{family}")
        for name in module.__all__:
            assert getattr(contracts, name) is getattr(module, name), name
        exported |= set(module.__all__)
    assert exported == set(contracts.__all__)


def test_a_consumer_handover_is_a_value_with_a_checked_wire_form() -> None:
    handover = ConsumerHandover([("cg", "Orders", 1, 40), LaneProgress("cg", "Orders", 2, 7)])
    assert handover.as_rows() == [["cg", "Orders", 1, 40], ["cg", "Orders", 2, 7]]
    assert ConsumerHandover.from_rows(handover.as_rows()) == handover
    assert [lane.key for lane in handover] == [("cg", "Orders", 1), ("cg", "Orders", 2)]
    assert not ConsumerHandover() and len(handover) == 2
    for bad in ([["cg", "Orders", 1]], [["cg", "Orders", -1, 4]], [["", "Orders", 1, 4]], ["cg|Orders|1|4"]):
        with pytest.raises(ValidationError):
            ConsumerHandover.from_rows(bad)
