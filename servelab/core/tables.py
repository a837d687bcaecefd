"""Plain tables for the printout and the report: one number format, fixed-width text and Markdown."""

import re
from collections.abc import Sequence

# A word that would change what a Markdown line is if it began one (a list item, a quote, a heading, a table
# row, an HTML block, a setext underline): a wrapped line never starts with it.
_MARKER = re.compile(r"[-+*=]+|#{1,6}|[>|<].*|\d+[.)]")
_NUMBER = re.compile(r".*(?<![\w.])\d[\d.,]*")  # a line ending in a figure keeps its unit beside it


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


def prose(text: str, width: int = 110, indent: str = "") -> str:
    """Markdown prose on lines of at most ``width`` characters (a longer word keeps its own line), each
    line after the first indented by ``indent`` (a list item's): a generated sentence stays readable in
    its file's source, and Markdown renders it as one paragraph again."""
    words = text.lstrip(" ")
    lines = [text[:len(text) - len(words)]]  # the first line's own indent, kept
    for word in words.split(" "):
        if (lines[-1].strip() and len(lines[-1]) + 1 + len(word) > width and not _MARKER.fullmatch(word)
                and not _NUMBER.fullmatch(lines[-1])):
            lines.append(indent + word)
        else:
            lines[-1] += f" {word}" if lines[-1].strip() else word
    return "\n".join(lines)
