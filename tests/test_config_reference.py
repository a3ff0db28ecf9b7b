"""The configuration reference is generated from the schemas, and docs/configuration.md is current."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from plugmq.cli import main
from plugmq.config.reference import CONFIG_TABLES
from plugmq.core.schema import table_keys

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_docs_page_is_the_generated_reference() -> None:
    pytest.importorskip("grpc", reason="the [server] section needs the serve extra")
    result = CliRunner().invoke(main, ["check-config", "--reference", "--builtin-only"])
    assert result.exit_code == 0, result.output
    assert result.output == DOC.read_text(encoding="utf-8"), (
        "docs/configuration.md is stale: plugmq check-config --reference --builtin-only > docs/configuration.md")


@pytest.mark.parametrize(("header", "schema"), CONFIG_TABLES)
def test_every_key_of_the_broker_config_is_documented(header: str, schema: type) -> None:
    undocumented = [key for key, field in table_keys(schema).items() if not field.metadata.get("doc")]
    assert not undocumented, f"[{header}] keys without a doc: {undocumented}"


def test_the_reference_lists_every_key_with_its_default() -> None:
    text = CliRunner().invoke(main, ["check-config", "--reference"]).output
    assert "### [broker]: BrokerConfig" in text and "### [[matrix]]: Matrix" in text
    assert "| `default_queue_count` | an integer | `4` | queues of an auto-created topic |" in text
    assert "### [plugins.audit]: AuditOptions" in text  # third-party plugins too (not in the docs page)
    for schema in (header_schema for _, header_schema in CONFIG_TABLES):
        for key in table_keys(schema):
            assert f"| `{key}` |" in text
