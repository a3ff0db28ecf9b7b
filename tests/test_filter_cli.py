"""``plugmq filter check`` through click's CliRunner (and the filter benchmark at toy sizes)."""

from __future__ import annotations

from click.testing import CliRunner

from plugmq.bench.filter import command as bench_command
from plugmq.cli.filter import command, render_syntax_error
from plugmq.core import FilterSyntaxError


def invoke(*args: str):
    return CliRunner().invoke(command, ["check", *args], catch_exceptions=False)


def field(output: str, name: str) -> str:
    for line in output.splitlines():
        if line.strip().startswith(name):
            return line.strip()[len(name):].strip()
    raise AssertionError(f"no {name!r} line in:\n{output}")


def test_check_prints_the_parsed_form_and_true() -> None:
    result = invoke("--type", "SQL92", "a > 5 AND b IN ('x')", "--props", "a=7", "b=x")
    assert result.exit_code == 0, result.output
    assert field(result.output, "parsed") == "a > 5 AND b IN ('x')"
    assert field(result.output, "result") == "TRUE"


def test_check_shows_precedence_and_the_evaluation_error() -> None:
    result = invoke("NOT a = 'x'", "--props", "a=x")
    assert result.exit_code == 0
    assert field(result.output, "parsed") == "(NOT a) = 'x'"
    assert field(result.output, "result").startswith("EVALUATION ERROR")


def test_check_false_and_unknown() -> None:
    assert field(invoke("a > 5", "--props", "a=3").output, "result") == "FALSE  (not delivered)"
    assert field(invoke("a > 5").output, "result") == "UNKNOWN  (not delivered)"
    assert field(invoke("a > 5", "-p", "a=6").output, "result") == "TRUE"


def test_check_tag_expression_with_colliding_tag() -> None:
    result = invoke("--type", "TAG", "Aa", "--tags", "BB")
    assert result.exit_code == 0
    assert field(result.output, "broker pre-check").startswith("pass")
    assert field(result.output, "result").startswith("FALSE")
    result = invoke("--type", "tag", "TagA", "--tags", "order")
    assert field(result.output, "broker pre-check").startswith("reject")


def test_syntax_error_shows_a_caret_and_exits_2() -> None:
    result = invoke("a = 'x' garbage")
    assert result.exit_code == 2
    lines = result.output.splitlines()
    source = next(i for i, line in enumerate(lines) if line.strip() == "a = 'x' garbage")
    assert lines[source + 1].index("^") == lines[source].index("garbage")


def test_caret_lands_on_the_right_line_of_a_multiline_expression() -> None:
    error = FilterSyntaxError("bad", expression="a > 5 AND\n  b ! 3", position=14, expected="an operator")
    text = render_syntax_error(error).splitlines()
    assert text[1] == "    b ! 3"
    assert text[2].index("^") == text[1].index("!")
    assert text[3] == "expected: an operator"


def test_unknown_type_and_bad_property_are_usage_errors() -> None:
    result = CliRunner().invoke(command, ["check", "--type", "XPATH", "a"])
    assert result.exit_code == 2 and "XPATH" in result.output
    result = CliRunner().invoke(command, ["check", "a IS NULL", "--props", "novalue"])
    assert result.exit_code == 2 and "NAME=VALUE" in result.output


def test_benchmark_runs_at_toy_sizes() -> None:
    result = CliRunner().invoke(
        bench_command, ["--evaluations", "2000", "--entries", "5000", "--fp-messages", "100", "--repeat", "1"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    for title in ("SQL92", "Tag pre-check", "false positives"):
        assert title in result.output
