"""The configuration engine: TOML tables structured into attrs classes, every error collected.

A table's schema is an attrs class: one field per key, declared with :func:`setting` (its default,
its documentation, the validators its value must pass). One cattrs converter structures a table
into that class (:func:`structure`) and reports *every* problem at once, as a ConfigError whose
``problems`` are one line each, in one wording for every table::

    broker.toml: broker.default_queue_count must be >= 1, got 0
    broker.toml: broker.nmae: unknown key. Did you mean 'name'? Known keys: ...
    broker.toml: groups.g.backoff_s[1] must be a number of seconds > 0, got -2

How a value is judged:

1. its type, strictly, as a TOML file writes it: ``"5"`` is no integer and ``true`` is no number;
   a list is accepted wherever a tuple, set or sequence is declared (TOML has arrays only);
2. the field's validators, one key at a time (a refusal names its key). Each runs against the
   class's defaults for the other keys; a check that only fails with several keys together is
   raised when the whole table is built (a :class:`Refusal` with ``key`` names the key it blames);
3. unknown keys, named with the closest known key; missing required keys, with their doc.

``Annotated[T, Expect("a plugin name")]`` words (and may check) the items of a list or the keys
and values of a table. Validators raise :class:`Refusal` (``must be >= 1, got 0``: it reads on from
the key path) or any ValueError / PlugmqError whose text says what is wrong.
"""
from plugmq.core.schema.declare import (
    Expect,
    Mismatch,
    Refusal,
    above,
    at_least,
    at_most,
    calls,
    describe_type,
    internal,
    non_empty,
    one_of,
    reason,
    setting,
    shown,
    table_keys,
)
from plugmq.core.schema.engine import converter, defaults_of, field_hook
from plugmq.core.schema.report import Problems, dotted, leaves, problems, structure

__all__ = [
    "Expect",
    "Mismatch",
    "Problems",
    "Refusal",
    "above",
    "at_least",
    "at_most",
    "calls",
    "converter",
    "defaults_of",
    "describe_type",
    "dotted",
    "field_hook",
    "internal",
    "leaves",
    "non_empty",
    "one_of",
    "problems",
    "reason",
    "setting",
    "shown",
    "structure",
    "table_keys",
]
