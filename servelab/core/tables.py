"""Plain tables for the printout and the report: one number format, fixed-width text and Markdown."""

from collections.abc import Sequence


def num(value: float | None, digits: int = 1) -> str:
    """A figure with ``digits`` decimals; ``-`` where there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def text(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Fixed-width columns, two spaces apart (what the commands print)."""
    table = [tuple(columns), *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in table)


def markdown(columns: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A Markdown table; ``align`` has one letter per column (``l`` or ``r``; default all left)."""
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(columns), "l"))
    lines = ["| " + " | ".join(columns) + " |", rule]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)
