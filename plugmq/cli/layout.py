"""Print a rich table within the terminal's width without breaking an identifier across lines.

A column made with ``no_wrap=True`` holds identifiers (plugin names, topics, message ids, keys,
experiment ids): its cells stay on one line. The other columns wrap at spaces, never inside a word,
so an identifier in them stays whole too. Free text that may be cut anywhere (a message body) is a
column with ``overflow="fold"`` or a cell ``Text(..., overflow="fold")``. :func:`print_table`
picks the first layout that fits the console:

1. the table with every cell on one line;
2. the table with the prose columns wrapped (each at least as wide as its longest word), the
   identifier columns at full width;
3. one block per row, ``header  value`` a line, when even that is too wide (a narrow terminal).

rich alone cannot promise this: a table wider than the console has every column shrunk, and an
identifier column is then cut with an ellipsis (or, with ``overflow="fold"``, split mid-name).
"""

from __future__ import annotations

import re

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

__all__ = ["fit_widths", "print_table"]

_WIDE = 1 << 16
_FOLDED = 12  # the narrowest a folded column gets


def _cells(table: Table, column: Column) -> list[RenderableType]:
    return [column.header, *column.cells] if table.show_header else list(column.cells)


def _extra_width(table: Table) -> int:
    """Borders and padding around the cells' contents (what rich adds to the column widths)."""
    _, right, _, left = table.padding
    padding = (left + right) * len(table.columns) - (0 if table.pad_edge else left + right)
    borders = ((2 if table.show_edge else 0) + len(table.columns) - 1) if table.box else 0
    return borders + padding


def _folds(column: Column, cell: RenderableType) -> bool:
    """May this cell be cut anywhere (free text, not identifiers)?"""
    if isinstance(cell, Text) and cell.overflow is not None:
        return cell.overflow == "fold"
    return column.overflow == "fold" and not column.no_wrap


def _least(column: Column, cell: RenderableType, size: Measurement) -> int:
    """The narrowest this cell may be: whole when it stays on one line, its longest word when it
    wraps, a few characters when it folds."""
    if _folds(column, cell):
        return min(size.maximum, _FOLDED)
    return size.maximum if column.no_wrap else size.minimum


def fit_widths(console: Console, table: Table, width: int) -> list[int] | None:
    """Content widths of ``table``'s columns so that it is at most ``width`` wide, identifier
    (``no_wrap``) columns at full width and the others no narrower than their longest word
    (folded text excepted); None when no such widths exist."""
    options = console.options.update(max_width=_WIDE)
    natural: list[int] = []
    least: list[int] = []
    for column in table.columns:
        cells = _cells(table, column)
        sizes = [Measurement.get(console, options, cell) for cell in cells]
        natural.append(max((m.maximum for m in sizes), default=1))
        needed = max((_least(column, c, m) for c, m in zip(cells, sizes, strict=True)), default=1)
        least.append(min(natural[-1], max(needed, column.min_width or 0)))
    slack = width - _extra_width(table) - sum(least)
    if slack < 0:
        return None
    widths = list(least)
    # The room left goes to the prose columns in turn, a character at a time, up to their natural width.
    while slack > 0:
        growing = [i for i, w in enumerate(widths) if w < natural[i]]
        if not growing:
            break
        for index in growing[:slack]:
            widths[index] += 1
            slack -= 1
    return widths


def _text(cell: RenderableType) -> Text:
    if isinstance(cell, Text):
        return cell.copy()
    return Text.from_markup(cell) if isinstance(cell, str) else Text(str(cell))


def _wrap_words(text: Text, width: int) -> list[Text]:
    """``text`` broken at spaces (and its own line breaks) into lines of at most ``width``; a
    longer word stays whole on a line of its own (rich's wrap would fold or cut it)."""
    lines: list[Text] = []
    for line in text.split("\n", allow_blank=True):
        breaks: list[int] = []
        start = 0
        for word in re.finditer(r"\S+", line.plain):
            if word.end() - start > width and word.start() > start:
                breaks.append(word.start())
                start = word.start()
        lines.extend(line.divide(breaks))
    return lines


def _records(console: Console, table: Table, width: int) -> list[Text]:
    """One block per row, a ``header  value`` line per column: identifiers on one line whatever
    their length, other values wrapped under themselves."""
    headers = [str(column.header) for column in table.columns]
    indent = max((len(h) for h in headers), default=0) + 2
    lines: list[Text] = []
    if table.title:
        lines.append(_text(table.title))
    rows = zip(*(list(column.cells) for column in table.columns), strict=True)
    for number, row in enumerate(rows):
        if number or table.title:
            lines.append(Text(""))
        for column, header, cell in zip(table.columns, headers, row, strict=True):
            value = _text(cell)
            room = max(_FOLDED, width - indent)
            if column.no_wrap:
                parts = [value]
            elif _folds(column, cell):
                parts = list(value.wrap(console, room, overflow="fold"))
            else:
                parts = _wrap_words(value, room)
            for index, part in enumerate(parts or [Text("")]):
                line = Text((header if index == 0 else "").ljust(indent), style="bold" if index == 0 else "")
                part.rstrip()
                line.append_text(part)
                lines.append(line)
    return lines


def print_table(table: Table, console: Console | None = None, *, width: int | None = None) -> None:
    """Print ``table`` within ``width`` (default: the console's) without breaking an identifier."""
    console = console or Console()
    width = width or console.width
    widths = fit_widths(console, table, width)
    if widths is None:
        for line in _records(console, table, width):
            console.print(line, crop=False, soft_wrap=True)
        return
    for column, size in zip(table.columns, widths, strict=True):
        column.width = size
    console.print(table, width=width, crop=False)

