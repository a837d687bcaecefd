"""The `servelab` and `make` command lines the documentation (the READMEs, docs/, the notebooks) shows its readers.

Where a command is found decides how it is read:

* a line of a ```bash / ```shell code block (also the command of a ``docker compose ... exec SERVICE``), an indented code block, or an IPython ``!`` line in a
  ```python cell: a shell line, run as typed (``&&``, ``|``, ``;``, ``&`` separate commands, ``#``
  starts a comment, a trailing ``\\`` continues the line);
* a `code span` or a "double-quoted string" in prose or in a Python cell (its comments and strings): a
  mention, which may name a command without its arguments (`servelab load`) and may write
  alternatives as ``a|b`` (`servelab serve fastapi-pt|flask`).
"""

import re
import shlex
from dataclasses import dataclass

from servelab.core.paths import REPO_ROOT
from servelab.tools.render_notebooks import sources

DOCUMENTS = ("README.md", "fastapi_pt/README.md", "fastapi_onnx/README.md", "models_staging/README.md",
             "flask_app/README.md", "docker/README.md",
             # docs/records/ holds what runs wrote: the commands as they were then, not what a reader runs now.
             *sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").rglob("*.md")
                     if "records" not in p.relative_to(REPO_ROOT).parts),
             *(str(p.relative_to(REPO_ROOT)) for p in sources()), "notebooks/README.md")
PROGRAMS = ("servelab", ".venv/bin/servelab", "make")
SHELL_LANGUAGES = {"bash", "shell", "sh"}
FENCE = re.compile(r"^\s*(```+)\s*(\w*)")
INDENTED = re.compile(r"^ {4,}(\S.*)$")
# A code span: a run of backticks, its text, the same run again (CommonMark); may cross a line break.
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
QUOTED = re.compile(r'"([^"\n]+)"')
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
MENTION = re.compile(r"^([A-Za-z_]\w*=\S*\s+)*(\.venv/bin/)?(servelab|make)(\s|$)")
SEPARATORS = {"&&", "||", "|", ";", "&"}
# `docker compose exec` options that take a value (the others are flags).
EXEC_OPTIONS_WITH_VALUES = {"-e", "--env", "-u", "--user", "-w", "--workdir", "--index"}


@dataclass(frozen=True)
class Shown:
    document: str
    line: int
    text: str  # as the reader sees it
    env: dict[str, str]  # VAR=value words before the program
    argv: list[str]
    mention: bool  # from prose: may stop before the command's required arguments

    def __str__(self) -> str:
        return f"{self.document}:{self.line}: {self.text}"


def shown_commands() -> list[Shown]:
    return [command for document in DOCUMENTS for command in commands_in(document)]


def commands_in(document: str) -> list[Shown]:
    shell, prose = _split((REPO_ROOT / document).read_text())
    found = [c for number, line in shell for c in _shell_commands(document, number, line)]
    found += [c for number, text in prose for c in _mentions(document, number, text)]
    return sorted(found, key=lambda c: c.line)


def _split(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(shell lines, prose paragraphs and Python lines), each with the number of its first line."""
    shell: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []
    fence, language, continued, indented = "", "", "", False
    paragraph: list[tuple[int, str]] = []
    for number, line in [*enumerate(text.splitlines(), 1), (0, "")]:  # a last blank line ends the text
        opening = FENCE.match(line)
        if fence:
            if opening and opening[1] == fence and not opening[2]:
                fence = ""
            elif language in SHELL_LANGUAGES or (language == "python" and line.lstrip().startswith("!")):
                continued += line.lstrip().removeprefix("!")
                if continued.endswith("\\"):
                    continued = continued[:-1]
                else:
                    shell.append((number, continued))
                    continued = ""
            elif language == "python":
                prose.append((number, line))
            continue
        code = INDENTED.match(line)
        # An indented code block starts after a blank line (elsewhere indentation continues a list item).
        indented = bool(code) and not opening and (indented or not paragraph)
        if indented:
            if code[1].startswith(PROGRAMS):
                shell.append((number, code[1]))
        elif line.strip() and not opening:
            paragraph.append((number, line))
        else:
            if paragraph:
                prose.append((paragraph[0][0], "\n".join(text for _, text in paragraph)))
            paragraph = []
            if opening:
                fence, language = opening[1], opening[2]
    return shell, prose


def _words(text: str, *, shell: bool) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=shell)
    lexer.whitespace_split, lexer.commenters = True, ""
    return list(lexer)


def _shell_commands(document: str, number: int, line: str) -> list[Shown]:
    line = re.sub(r"(^|\s)#.*", "", line)  # a comment starts a word; '#' inside a word is text
    found, words = [], []
    for word in [*_words(line, shell=True), ";"]:
        if word not in SEPARATORS:
            words.append(word)
            continue
        found += _command(document, number, line.strip(), words, mention=False)
        words = []
    return found


def _mentions(document: str, number: int, text: str) -> list[Shown]:
    found = []
    for match in [*SPAN.finditer(text), *QUOTED.finditer(text)]:
        body = " ".join(match.groups()[-1].split())
        if not MENTION.match(body):
            continue
        line = number + text[: match.start()].count("\n")
        words = _words(body, shell=False)
        words = words[: words.index("...")] if "..." in words else words  # `servelab ...`: any command
        alternatives = [[]]  # `a|b` in a word: one command per alternative
        for word in words:
            options = word.split("|") if "|" in word.strip("|") else [word]
            alternatives = [[*start, option] for start in alternatives for option in options]
        # The program alone (`servelab`) names the package, not a command.
        found += [c for words in alternatives for c in _command(document, line, body, words, mention=True)
                  if len(c.argv) > 1]
    return found


def _inside_container(words: list[str]) -> list[str]:
    """The command a `docker compose ... exec [OPTIONS] SERVICE COMMAND...` runs in the container."""
    if words[:2] != ["docker", "compose"] or "exec" not in words:
        return words
    rest = words[words.index("exec") + 1:]
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] in EXEC_OPTIONS_WITH_VALUES else rest[1:]
    return rest[1:]  # after the service


def _command(document: str, number: int, text: str, words: list[str], *, mention: bool) -> list[Shown]:
    env = {}
    while words and (assignment := ASSIGNMENT.match(words[0])):
        env[assignment[1]] = assignment[2]
        words = words[1:]
    words = _inside_container(words)
    if not words or words[0] not in PROGRAMS:
        return []
    return [Shown(document, number, text, env, words, mention)]

