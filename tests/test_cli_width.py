"""Tables at 80 columns: no plugin name, topic, message id, key or experiment id split across lines.

Each command runs with ``COLUMNS=80`` (``FORCE_COLOR=1`` makes ``plugmq admin`` print for a terminal);
every identifier it shows must be found whole on one line, and no line may be wider than 80
columns unless it holds an identifier that is wider on its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.table import Table

from plugmq.broker.broker import Broker
from plugmq.cli import main
from plugmq.cli.layout import fit_widths, print_table
from plugmq.core.message import Message
from plugmq.core.pluginmanager import installed_plugins

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "compare"
TOPIC = "Payments_eu-west-1_settlement-events"
KEYS = ("settlement-2024-11-25-000017", "merchant-ACME-GmbH-4711")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(args: list[str], *, terminal: bool = False) -> str:
    env = {"COLUMNS": "80", **({"FORCE_COLOR": "1"} if terminal else {})}
    result = CliRunner(env=env).invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return _ANSI.sub("", result.output)


def assert_whole(output: str, identifiers: Iterable[str], width: int = 80) -> None:
    lines = output.splitlines()
    wanted = sorted(set(identifiers))
    assert wanted
    for identifier in wanted:
        assert any(identifier in line for line in lines), f"{identifier!r} is not whole on any line:\n{output}"
    for line in lines:
        assert len(line) <= width or any(len(i) > width - 4 and i in line for i in wanted), \
            f"a line of {len(line)} columns:\n{line}"


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(f'[broker]\nname = "width"\ndata_dir = "{tmp_path / "data"}"\nplugins = ["store_mmap"]\n'
                    '[plugins.store_mmap]\nflush = "async"\n', encoding="utf-8")
    return path


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, list[str]]:
    config = write_config(tmp_path)
    with Broker.from_config(config) as broker:
        ids = [broker.put(Message(TOPIC, f'{{"settlement": {i}, "note": "a body with words"}}'.encode(),
                                  tags="settled", keys=" ".join(KEYS)), 0).msg_id for i in range(2)]
    return config, ids


def test_plugins_at_80_columns_keeps_names_distributions_and_capability_names_whole() -> None:
    output = run(["plugins"])
    plugins = installed_plugins()
    assert_whole(output, [p.name for p in plugins] + [p.distribution for p in plugins]
                 + ["may_leave_queues_unassigned=False", "MACHINE_ROOM_NEARBY:", "expression_type=SQL92"])


def test_query_at_80_columns_keeps_message_ids_topics_and_keys_whole(stored: tuple[Path, list[str]]) -> None:
    config, ids = stored
    assert_whole(run(["query", "key", "--config", str(config), TOPIC, KEYS[1]]), [*ids, TOPIC, *KEYS])
    assert_whole(run(["query", "id", "--config", str(config), ids[0]]), [ids[0], TOPIC, *KEYS])


def test_admin_at_80_columns_in_a_terminal_keeps_ids_whole(stored: tuple[Path, list[str]]) -> None:
    config, ids = stored
    assert_whole(run(["admin", "query-msg", "--config", str(config), "--key", KEYS[0], "--topic", TOPIC],
                     terminal=True), [*ids, TOPIC, *KEYS])
    assert_whole(run(["admin", "topic-list", "--config", str(config)], terminal=True), [TOPIC])


def test_compare_dry_run_at_80_columns_keeps_experiment_ids_whole() -> None:
    from plugmq.spark.experiments import expand_matrix, load_experiments

    experiments = expand_matrix(load_experiments(EXAMPLES / "quick.toml"))  # every kind, ids up to 45 characters
    output = run(["compare", str(EXAMPLES / "quick.toml"), "--out", "unused", "--dry-run"])
    assert_whole(output, [e.experiment_id for e in experiments]
                 + [e.plugin_set.store for e in experiments] + [e.plugin_set.delay or "no-delay" for e in experiments])


def test_allocate_at_80_columns_keeps_client_ids_and_queue_ranges_whole() -> None:
    clients = [f"10.0.0.{i}@payment-consumer-instance-000{i}" for i in range(1, 4)]
    output = run(["allocate", "-s", "AVG", "-q", f"{TOPIC}:broker-a-eu-west-1:0-15,broker-b-eu-west-2:0-15",
                  "-c", ",".join(clients)])
    assert_whole(output, [*clients, f"{TOPIC}:broker-a-eu-west-1:0-10", f"{TOPIC}:broker-b-eu-west-2:6-15"])


def _table(identifier_width: int) -> Table:
    table = Table(title="t")
    table.add_column("id", no_wrap=True)
    table.add_column("note")
    table.add_row("x" * identifier_width, "words that may wrap between them")
    return table


def test_a_table_that_fits_wraps_prose_only_and_one_that_cannot_becomes_records() -> None:
    console = Console(width=40, record=True, color_system=None)
    print_table(_table(20), console)
    text = console.export_text()
    assert "│ " + "x" * 20 + " │" in text and "wrap" in text and max(map(len, text.splitlines())) <= 40
    assert fit_widths(console, _table(20), 40) is not None and fit_widths(console, _table(36), 40) is None
    console = Console(width=40, record=True, color_system=None)
    print_table(_table(36), console)
    assert console.export_text().splitlines()[2:4] == ["id    " + "x" * 36, "note  words that may wrap between them"]


def test_plain_rich_folding_would_have_split_the_identifier() -> None:
    """The check above can fail: rich's own fold cuts a long name at 80 columns."""
    table = Table()
    for column in ("name", "capabilities"):
        table.add_column(column, overflow="fold")
    table.add_row("a_plugin_with_a_long_name_" * 2, "may_leave_queues_unassigned=False " * 4)
    console = Console(width=40, record=True, color_system=None)
    console.print(table)
    with pytest.raises(AssertionError, match="is not whole"):
        assert_whole(console.export_text(), ["a_plugin_with_a_long_name_" * 2])
