"""What a check cell takes from the cell a student writes before it.

A student who skips a cell, or runs one that stops at its ``raise NotImplementedError``, should read which cell
to run, in one line, not a ``NameError``'s traceback; and a name an earlier cell set (pt-1's ``pa`` at pt-2x2's
check) must not pass for the skipped cell's.
"""

import sys
from typing import Any


class CellNotRun(NameError):
    """A name its cell has not set (yet). IPython shows ``_render_traceback_``'s lines in place of a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


# Per notebook namespace (id of its globals), per name: the object ``given`` last handed out, and to which cell.
_HANDED: dict[tuple[int, str], tuple[Any, str]] = {}


def given(*names: str, by: str) -> Any:
    """The values of ``names`` in the calling cell's namespace, all set by the cell that starts ``# YOUR CODE:
    {by}``; CellNotRun, naming that cell, where one is missing or is still the value handed to another cell's
    check (its cell was skipped, so the earlier one's value would be checked in its place). One name: its value;
    several: a tuple."""
    space = sys._getframe(1).f_globals
    values = []
    for name in names:
        handed = _HANDED.get((id(space), name))
        if name not in space or (handed and handed[0] is space[name] and handed[1] != by):
            why = "is not set" if name not in space else f"is still the one `{handed[1]}` set"  # type: ignore[index]
            raise CellNotRun(f"`{name}` {why}: run the cell that starts `# YOUR CODE: {by}` (above this one), "
                             "then this one")
        _HANDED[(id(space), name)] = space[name], by
        values.append(space[name])
    return values[0] if len(values) == 1 else tuple(values)
