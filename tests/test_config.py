from __future__ import annotations

from pathlib import Path

import pytest

from plugmq import ConfigError
from plugmq.config.broker import DEFAULT_PLUGINS, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return path


def test_file_config(tmp_path: Path) -> None:
    path = write(tmp_path, """
[broker]
name = "broker-b"
data_dir = "store"
plugins = ["store_mmap", "filter_tag"]
default_queue_count = 8

[plugins.store_mmap]
flush = "sync"
""")
    config = load_config(path)
    assert config.name == "broker-b"
    assert config.data_dir == tmp_path / "store"  # relative to the file
    assert config.plugins == ("store_mmap", "filter_tag")
    assert config.plugin_options == {"store_mmap": {"flush": "sync"}}
    assert config.default_queue_count == 8
    assert config.source == str(path)


def test_defaults_when_no_plugin_list() -> None:
    assert load_config({}).plugins == DEFAULT_PLUGINS


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"broker": {"nmae": "x"}}, "broker.nmae: unknown key. Did you mean 'name'?"),
        ({"broker": {"plugins": "store_mmap"}}, "broker.plugins must be a list of plugin names"),
        ({"broker": {"plugins": ["store_mmap", 3]}}, r"broker.plugins\[1\] must be a plugin name"),
        ({"broker": {"default_queue_count": 0}}, "broker.default_queue_count must be >= 1"),
        ({"broker": {"default_queue_count": True}}, "broker.default_queue_count must be an integer"),
        ({"broker": {"auto_create_topic": "yes"}}, "broker.auto_create_topic must be true or false"),
        ({"broker": {"name": "a b"}}, "broker.name: .*contains ' '"),
        ({"broker": {"store_host": "localhost"}}, "broker.store_host"),
        ({"brokers": {}}, r"unknown top-level table \[brokers\]"),
        ({"broker": {"plugins": ["store_mmap"]}, "plugins": {"filter_sql": {}}},
         r"\[plugins.filter_sql\] configures a plugin that broker.plugins does not list"),
        ({"plugins": {"store_mmap": 5}}, "plugins.store_mmap must be a table of options"),
        ({"broker": {"failover": True, "failover_unclean_after_s": -1}}, "broker.failover_unclean_after_s must be >= 0"),
        ({"broker": {"failover_unclean_after_s": 30}}, "failover_unclean_after_s applies to elections: it needs"),
    ],
)
def test_config_errors_name_the_key(mapping: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(mapping)


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[broker\nname="))
