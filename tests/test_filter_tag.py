"""filter_tag: subscriptions, the hash pre-check (scalar, numpy, raw bytes) and the exact check."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugmq.bench.filter import multi_tag_false_positive_rate, tag_vocabulary
from plugmq.core import ConsumeQueueEntry, Filter, FilterSyntaxError, tags_code
from plugmq.core.hashing import java_string_hash
from plugmq.plugins.filter_tag import (
    COMPILER,
    CQ_ENTRY_DTYPE,
    decode_block,
    encode_block,
    plugmq_declare,
    plugmq_filter_compilers,
    precheck_block,
)


def entry(tags: str | None) -> ConsumeQueueEntry:
    return ConsumeQueueEntry(queue_offset=0, commit_log_offset=0, size=10, tags_code=tags_code(tags))


def test_plugin_declares_and_offers_the_tag_compiler() -> None:
    assert plugmq_declare().name == "filter_tag"
    compiler = plugmq_filter_compilers()["TAG"]
    assert compiler.capabilities.broker_precheck is True
    flt = compiler.compile("TagA")
    assert isinstance(flt, Filter) and flt.expression_type == "TAG" and flt.expression == "TagA"


@pytest.mark.parametrize("expression", ["*", "", "  ", " * "])
def test_star_and_empty_subscribe_to_everything(expression: str) -> None:
    flt = COMPILER.compile(expression)
    assert flt.subscribes_all
    for tags in (None, "TagA", "x||y"):
        assert flt.precheck(entry(tags)) is True
        assert flt.matches({}, tags) is True
    assert flt.precheck_many(np.array([0, -1, 5], dtype=np.int64)).all()


@pytest.mark.parametrize(
    "expression, tags",
    [
        ("TagA", ("TagA",)),
        ("TagA || TagB", ("TagA", "TagB")),
        ("  TagA||TagB  ", ("TagA", "TagB")),
        ("TagA || || TagB ||", ("TagA", "TagB")),
        ("TagA || TagA", ("TagA",)),
        ("A * || B", ("A *", "B")),
    ],
)
def test_subscription_parsing_trims_and_drops_empty_tags(expression: str, tags: tuple[str, ...]) -> None:
    assert COMPILER.compile(expression).tags == tags


@pytest.mark.parametrize("expression", ["||", " || || "])
def test_a_subscription_naming_no_tag_is_an_error(expression: str) -> None:
    with pytest.raises(FilterSyntaxError, match="names no tag"):
        COMPILER.compile(expression)


def test_single_tag_precheck_and_exact_check() -> None:
    flt = COMPILER.compile("TagA || TagB")
    assert flt.precheck(entry("TagA")) and flt.precheck(entry("TagB"))
    assert not flt.precheck(entry("order"))
    assert not flt.precheck(entry(None))  # an untagged message stores code 0
    # hash("TagB") = ...1000 and hash("TagC") = ...1001: TagC's code contains TagB's bits, so the
    # bitwise test passes it (a false positive an equality test would not have); exact rejects it.
    assert java_string_hash("TagC") & java_string_hash("TagB") == java_string_hash("TagB")
    assert flt.precheck(entry("TagC")) and not flt.matches({}, "TagC")
    assert not COMPILER.compile("TagA").precheck(entry("TagC"))
    assert flt.matches({}, "TagA") and flt.matches({}, "TagB")
    assert not flt.matches({}, "TagC") and not flt.matches({}, None)
    assert flt.evaluate({}, "tagA") is False  # tags are case-sensitive


def test_exact_check_reads_the_tags_property_when_no_tags_are_given() -> None:
    flt = COMPILER.compile("TagA")
    assert flt.matches({"TAGS": "TagA"}) is True
    assert flt.matches({"TAGS": "TagB"}) is False
    assert flt.matches({"TAGS": "TagB"}, "TagA") is True  # the explicit tags win


def test_colliding_tags_pass_the_precheck_and_fail_the_exact_check() -> None:
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    flt = COMPILER.compile("Aa")
    assert flt.precheck(entry("BB")) is True  # same hash code: the broker cannot tell
    assert flt.matches({}, "BB") is False  # the client's exact check can
    assert flt.matches({}, "Aa") is True
    assert COMPILER.compile("AaAa").precheck(entry("BBBB")) and not COMPILER.compile("AaAa").matches({}, "BBBB")


def test_multi_tag_messages_store_the_or_of_their_hashes() -> None:
    message = "TagA||TagB||order"
    code = tags_code(message)
    assert code == java_string_hash("TagA") | java_string_hash("TagB") | java_string_hash("order")
    for sub in ("TagA", "TagB", "order", "TagB || nope"):
        flt = COMPILER.compile(sub)
        assert flt.precheck(entry(message)), sub
        assert flt.matches({}, message), sub
    flt = COMPILER.compile("TagC")
    assert not flt.matches({}, message)  # whatever the pre-check said
    assert flt.precheck(entry(message)) == (java_string_hash("TagC") & code == java_string_hash("TagC"))


def test_negative_hash_codes_widen_with_their_sign() -> None:
    negative = next(t for t in (f"tag{i}" * 3 for i in range(100)) if java_string_hash(t) < 0)
    flt = COMPILER.compile(negative)
    assert flt.precheck(entry(negative))
    assert flt.precheck_many(np.array([java_string_hash(negative)], dtype=np.int64))[0]
    assert not flt.precheck(entry("TagA"))  # a positive code lacks the sign bits


@given(
    subscription=st.lists(st.sampled_from(["TagA", "TagB", "Aa", "BB", "x", "order", "pay"]), min_size=1, max_size=3),
    codes=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50),
    messages=st.lists(st.lists(st.sampled_from(["TagA", "TagB", "Aa", "BB", "x", "q"]), min_size=1, max_size=3),
                      max_size=20),
)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_precheck_many_agrees_with_precheck(
    subscription: list[str], codes: list[int], messages: list[list[str]]
) -> None:
    flt = COMPILER.compile(" || ".join(subscription))
    all_codes = codes + [tags_code(m) for m in messages]
    mask = flt.precheck_many(np.array(all_codes, dtype=np.int64))
    assert mask.dtype == bool
    assert list(mask) == [flt.precheck(ConsumeQueueEntry(0, 0, 0, c)) for c in all_codes]


def test_raw_block_layout_is_big_endian_offset_size_hash() -> None:
    assert CQ_ENTRY_DTYPE.itemsize == 20
    rows = [(0, 100, java_string_hash("TagA")), (100, 50, java_string_hash("TagB")), (150, 7, tags_code("TagA||x")),
            (2**40, 2**31 - 1, -1)]
    raw = b"".join(struct.pack(">qiq", *row) for row in rows)  # RocketMQ's layout, written independently
    assert encode_block(rows) == raw
    decoded = decode_block(raw)
    assert decoded["commit_log_offset"].tolist() == [r[0] for r in rows]
    assert decoded["size"].tolist() == [r[1] for r in rows]
    assert decoded["tag_hash"].tolist() == [r[2] for r in rows]
    assert precheck_block(raw, "TagA").tolist() == [True, False, True, True]
    assert COMPILER.compile("order").precheck_block(raw).tolist() == [False, False, False, True]
    assert COMPILER.compile("TagB").precheck_block(raw).tolist() == [False, True, True, True]  # bit containment
    assert precheck_block(raw, "*").all()
    with pytest.raises(ValueError, match="20-byte"):
        decode_block(raw[:-1])


def test_empty_block() -> None:
    assert precheck_block(b"", "TagA").shape == (0,)


def test_multi_tag_false_positive_rate_is_computed_from_counts() -> None:
    rng = random.Random(3)
    vocabulary = tag_vocabulary(50, rng)
    one = multi_tag_false_positive_rate(300, 1, vocabulary, rng, subscriptions=5)
    four = multi_tag_false_positive_rate(300, 4, vocabulary, rng, subscriptions=5)
    for result in (one, four):
        assert result.messages == 1500
        # a pre-check never drops an exact match, so passed = exact + false positives
        assert result.precheck_passed == result.exact_matches + result.false_positives
        assert result.rate == result.false_positives / (result.messages - result.exact_matches)
        assert 0.0 <= result.rate <= 1.0
    # more tags OR-ed together set more bits, so more subscriptions look contained
    assert four.false_positives > one.false_positives
