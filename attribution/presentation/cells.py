"""Table cells a spreadsheet cannot run, and CSV of plain rows: NumPy and pandas free, so a
command that writes one small table (`layers`) needs neither (`report.csv_text` writes a
DataFrame the same way)."""
from __future__ import annotations

import csv
import io
from typing import Sequence

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""A text cell starting so is a formula to a spreadsheet (OWASP "CSV injection")."""


def inert_text(value: object) -> object:
    """`value` with a leading ' when it is text a spreadsheet would run as a formula."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def rows_csv(rows: Sequence[dict]) -> str:
    """CSV of `rows` (dicts with the same keys, in order) as `report.csv_text` writes a
    frame: text cells and column names inert, lines ending in CRLF, None as an empty cell."""
    if not rows:
        return ""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\r\n")
    writer.writerow([inert_text(name) for name in rows[0]])
    writer.writerows([inert_text(value) for value in row.values()] for row in rows)
    return text.getvalue()


def rows_text(rows: Sequence[dict]) -> str:
    """`rows` as an aligned text table: a header, then one line per row, numbers right-
    aligned and text left-aligned in columns two spaces apart."""
    if not rows:
        return ""
    names = list(rows[0])
    cells = [names] + [["" if row[name] is None else str(row[name]) for name in names]
                       for row in rows]
    widths = [max(len(line[column]) for line in cells) for column in range(len(names))]
    numeric = [all(isinstance(row[name], (int, float)) for row in rows) for name in names]
    return "\n".join(
        "  ".join(cell.rjust(width) if right else cell.ljust(width)
                  for cell, width, right in zip(line, widths, numeric)).rstrip()
        for line in cells)
