"""attrs validators the contract value types share (private to ``plugmq.core.contracts``)."""

from __future__ import annotations

from typing import Any

import attrs

from plugmq.core.errors import ValidationError


def non_negative_int(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An int (not a bool) >= 0; ValidationError names the field and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(f"{attribute.name} must be an integer >= 0, got {value!r}")
