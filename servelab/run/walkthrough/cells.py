"""What a check cell takes from the cell a student writes before it: a skipped cell (or one stopped at its
``raise``) gets one line naming the cell to run, not a NameError, and no earlier cell's value passes for its."""

import sys
from typing import Any


class CellNotRun(NameError):
    def _render_traceback_(self) -> list[str]:  # IPython shows these lines in place of a traceback
        return [f"{type(self).__name__}: {self}"]


_HANDED: dict[tuple[int, str], tuple[Any, str]] = {}  # (namespace, name): the value last handed out, and to whom


def given(*names: str, by: str) -> Any:
    """The calling cell's ``names``, set by the cell starting ``# YOUR CODE: {by}`` (one name: its value; several:
    a tuple); CellNotRun where one is missing or still the value another cell's check took (pt-1's ``pa``)."""
    space = sys._getframe(1).f_globals
    for name in names:
        handed = _HANDED.get((id(space), name))
        if name not in space or (handed and handed[0] is space[name] and handed[1] != by):
            why = "is not set" if name not in space else f"is still the one `{handed[1]}` set"  # type: ignore[index]
            raise CellNotRun(f"`{name}` {why}: run the cell that starts `# YOUR CODE: {by}` (above this one), then this one")
        _HANDED[(id(space), name)] = space[name], by
    return space[names[0]] if len(names) == 1 else tuple(space[name] for name in names)
