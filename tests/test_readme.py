"""The README's Python examples run as written, and every name they take from plugmq is exported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import plugmq
from plugmq.broker.broker import Broker

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _blocks() -> list[str]:
    return _BLOCK.findall(README.read_text(encoding="utf-8"))


def _is_client_block(code: str) -> bool:
    return "from rocketmq import" in code


def _plugmq_names(code: str) -> set[str]:
    """Names the code takes from ``plugmq``: ``from plugmq import X`` and ``plugmq.X``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.module.startswith("plugmq"):
            assert node.module == "plugmq", f"README imports from {node.module}; applications use plugmq only"
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "plugmq":
            names.add(node.attr)
    return names


def test_the_readme_has_the_examples_this_file_runs() -> None:
    blocks = _blocks()
    assert len(blocks) >= 4 and sum(map(_is_client_block, blocks)) == 1


def test_every_name_the_readme_uses_comes_from_plugmq_alone() -> None:
    used = set().union(*(_plugmq_names(code) for code in _blocks() if not _is_client_block(code)))
    assert {"Broker", "Message", "ConsumeFrom", "ConsumeStatus", "FilterExpression", "TransactionDecision"} <= used
    namespace: dict[str, object] = {}
    exec(f"from plugmq import {', '.join(sorted(used))}", namespace)
    assert used <= set(plugmq.__all__), f"used but not in plugmq.__all__: {used - set(plugmq.__all__)}"


@pytest.mark.parametrize("index", [i for i, code in enumerate(_blocks()) if not _is_client_block(code)])
def test_python_examples_run(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the examples use ./data
    exec(compile(_blocks()[index], f"README.md python block {index}", "exec"), {})
    assert (tmp_path / "data" / "broker").is_dir()


def test_the_official_client_example_runs_against_an_in_process_server(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")
    from plugmq.server import ServerOptions, ServerThread

    (code,) = [c for c in _blocks() if _is_client_block(c)]
    assert "127.0.0.1:8081" in code
    with Broker.open(tmp_path / "data") as broker:
        thread = ServerThread(broker, ServerOptions(long_polling_s=2.0))
        address = thread.start()
        try:
            exec(compile(code.replace("127.0.0.1:8081", address), "README.md client block", "exec"), {})
        finally:
            thread.stop()
    out = capsys.readouterr().out
    assert "sent" in out and "b'hello' 1" in out
