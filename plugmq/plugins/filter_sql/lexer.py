"""Tokens of RocketMQ's SQL92 selector grammar (its JavaCC ``SelectorParser.jj``), lazily.

Longest match wins, as in JavaCC: ``5e3`` is one decimal token, ``012`` is ``0`` then ``12``,
``INx`` is an identifier. Keywords are case-insensitive and win over identifiers of the same
length. Comments are white space: ``/* ... */``, and ``--`` up to and including a line break —
as in RocketMQ's ``LINE_COMMENT`` token, a ``--`` that no line break follows is two minus signs
(``a > --5`` is ``a > 5``; ``a = 'x' -- note`` without a line break is trailing input).

Tokens are produced on demand, so a lexical error is reported only when the parser reaches it —
the first problem in reading order is the one the user sees.
"""

from __future__ import annotations

import enum
import re

import attrs

from plugmq.core.errors import FilterSyntaxError

__all__ = ["KEYWORDS", "Kind", "Token", "TokenStream"]


class Kind(enum.Enum):
    ID = "identifier"
    INTEGER = "integer literal"
    DECIMAL = "decimal literal"
    STRING = "string literal"
    KEYWORD = "keyword"
    PUNCT = "symbol"
    EOF = "end of input"


KEYWORDS = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE", "CONTAINS", "STARTSWITH", "ENDSWITH"}
)


@attrs.frozen
class Token:
    """``text`` is the source text; for keywords ``value`` is the upper-case keyword."""

    kind: Kind
    text: str
    pos: int
    value: str = ""

    def is_keyword(self, *names: str) -> bool:
        return self.kind is Kind.KEYWORD and self.value in names

    def is_punct(self, *symbols: str) -> bool:
        return self.kind is Kind.PUNCT and self.text in symbols

    def describe(self) -> str:
        if self.kind is Kind.EOF:
            return "end of input"
        if self.kind is Kind.KEYWORD:
            return f"keyword {self.value}"
        return f"{self.kind.value} {self.text!r}"


_WHITESPACE = " \t\n\r\f"
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_INTEGER = re.compile(r"0|[1-9][0-9]*[lL]?")
_DECIMAL = re.compile(
    r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+"
)
_STRING = re.compile(r"'(?:''|[^'])*'")
_PUNCT = ("<>", "<=", ">=", "=", "<", ">", "(", ")", ",", "+", "-")


def _line_break_after(text: str, start: int) -> int:
    """Position of the first line break (LF or CR) at or after ``start``, -1 if none."""
    newline, carriage = text.find("\n", start), text.find("\r", start)
    if newline < 0 or carriage < 0:
        return max(newline, carriage)
    return min(newline, carriage)


class TokenStream:
    """A cursor over the tokens of ``text`` with the two-token lookahead the grammar needs."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._pos = 0
        self._buffer: list[Token] = []

    def peek(self, ahead: int = 0) -> Token:
        while len(self._buffer) <= ahead:
            self._buffer.append(self._scan())
        return self._buffer[ahead]

    def next(self) -> Token:
        token = self.peek()
        self._buffer.pop(0)
        return token

    def _error(self, message: str, pos: int, expected: str | None = None) -> FilterSyntaxError:
        return FilterSyntaxError(message, expression=self.text, position=pos, expected=expected)

    def _skip_blank(self) -> None:
        text, n = self.text, len(self.text)
        pos = self._pos
        while pos < n:
            ch = text[pos]
            if ch in _WHITESPACE:
                pos += 1
            elif text.startswith("--", pos) and (end := _line_break_after(text, pos + 2)) >= 0:
                pos = end + 1
            elif text.startswith("/*", pos):
                end = text.find("*/", pos + 2)
                if end < 0:
                    raise self._error("unterminated comment: '/*' has no closing '*/'", pos, "'*/'")
                pos = end + 2
            else:
                break
        self._pos = pos

    def _scan(self) -> Token:
        self._skip_blank()
        text, pos = self.text, self._pos
        if pos >= len(text):
            return Token(Kind.EOF, "", pos)
        ch = text[pos]
        if ch.isascii() and (ch.isalpha() or ch in "_$"):
            match = _IDENT.match(text, pos)
            assert match is not None
            word = match.group()
            self._pos = match.end()
            upper = word.upper()
            if upper in KEYWORDS:
                return Token(Kind.KEYWORD, word, pos, upper)
            return Token(Kind.ID, word, pos)
        if ch.isascii() and (ch.isdigit() or ch == "."):
            integer = _INTEGER.match(text, pos)
            decimal = _DECIMAL.match(text, pos)
            int_len = integer.end() - pos if integer else 0
            dec_len = decimal.end() - pos if decimal else 0
            if dec_len > int_len:
                self._pos += dec_len
                return Token(Kind.DECIMAL, text[pos : pos + dec_len], pos)
            if int_len:
                self._pos += int_len
                return Token(Kind.INTEGER, text[pos : pos + int_len], pos)
            raise self._error("a '.' must be followed by digits to form a number", pos, "a number")
        if ch == "'":
            match = _STRING.match(text, pos)
            if match is None:
                raise self._error("unterminated string literal: add the closing quote (write '' for a quote inside)",
                                  pos, "a closing quote")
            self._pos = match.end()
            return Token(Kind.STRING, match.group(), pos)
        for symbol in _PUNCT:
            if text.startswith(symbol, pos):
                self._pos = pos + len(symbol)
                return Token(Kind.PUNCT, symbol, pos)
        hint = {"!": " (not-equal is written <>)", '"': " (string literals use single quotes)"}.get(ch, "")
        raise self._error(f"unexpected character {ch!r}{hint}", pos)


def string_value(token: Token) -> str:
    """The value of a STRING token: quotes removed, ``''`` turned into ``'``."""
    return token.text[1:-1].replace("''", "'")
