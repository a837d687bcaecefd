"""Every `servelab` and `make` command that README.md, docs/, the services' READMEs and the notebooks show
parses, without being run: servelab's through its own argparse parser, make's through
`make --dry-run` on the Makefile. What counts as a command, and how each is read: shown_commands.py.

Left to the reader, on purpose: a placeholder where the parser wants one of a few choices (`NAME`, or a
Python format field such as `{name}` that the notebook fills in) stands for the first choice, so the
rest of its command is still checked; a mention in prose may stop before the command's required
arguments (`servelab load`); `servelab ...` means any command.
"""

import io
import re
import shlex
import subprocess
from contextlib import redirect_stderr, redirect_stdout

import pytest
from pydantic import ValidationError

from servelab.cli import build_parser
from servelab.core.paths import REPO_ROOT
from servelab.core.settings import Settings
from shown_commands import Shown, shown_commands

COMMANDS = shown_commands()
PLACEHOLDER = re.compile(r"^(\{\w*\}|[A-Z][A-Z0-9_]*)$")
INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from '([^']*)'")
INCOMPLETE = "the following arguments are required"


def of(program: str) -> list:
    return [pytest.param(c, id=f"{c.document}:{c.line}: {shlex.join(c.argv)}")
            for c in COMMANDS if c.argv[0].endswith(program)]


def parse_error(args: list[str]) -> str | None:
    """argparse's error for ``servelab ARGS``, None when they parse."""
    while True:
        stderr = io.StringIO()
        try:
            with redirect_stderr(stderr), redirect_stdout(io.StringIO()):
                build_parser().parse_args(args)
            return None
        except SystemExit as exc:
            if exc.code == 0:  # --help
                return None
        message = stderr.getvalue().strip().splitlines()[-1]
        choice = INVALID_CHOICE.search(message)
        if not (choice and PLACEHOLDER.match(choice[1])):
            return message
        args = [choice[2] if arg == choice[1] else arg for arg in args]


def test_commands_are_found_in_every_kind_of_place():
    found = {(c.document, c.text, c.mention) for c in COMMANDS}
    assert ("docs/local-lab.md", ".venv/bin/servelab report results/records.jsonl", False) in found  # ```bash
    assert ("README.md", "make gpu-check", True) in found  # a `code span` in the README
    assert ("models_staging/README.md", "servelab triton stage pt-2x2", False) in found  # indented block
    assert ("notebooks/6_triton_python.md", "servelab triton stage pt-1", False) in found  # ```shell
    assert ("notebooks/6_triton_python.md", "servelab triton stage {name} --url triton_server:8000", True) in found  # ```python
    inside = {tuple(c.argv) for c in COMMANDS if c.document == "notebooks/10_ray.md" and c.text.startswith("docker compose")}
    assert ("servelab", "ray", "deploy", "--stage", "ray-1") in inside  # `docker compose ... exec ray_head servelab ...`
    assert ("docker/README.md", "servelab serve fastapi-pt|fastapi-onnx|flask", True) in found  # prose
    assert len(of("make")) >= 5 and len(of("servelab")) >= 80


@pytest.mark.parametrize("command", of("servelab"))
def test_servelab_command_parses(command: Shown):
    if command.argv[1] == "ray" and "invalid choice: 'ray'" in (parse_error(["ray"]) or ""):
        pytest.skip("`servelab ray` comes with the local Ray Serve stages (branch ray-serve), not merged here yet")
    error = parse_error(command.argv[1:])
    if command.mention and error and f": error: {INCOMPLETE}" in error:
        error = None  # prose may name a command without its arguments
    assert error is None, f"{command}: {error}"
    for name, value in command.env.items():
        assert name.lower() in Settings.model_fields, f"{command}: {name} is not a servelab setting"
        try:
            Settings(**{name.lower(): value})
        except ValidationError as exc:
            pytest.fail(f"{command}: {name}={value} is not a valid setting: {exc}")


@pytest.mark.parametrize("command", of("make"))
def test_make_target_exists(command: Shown):
    done = subprocess.run(["make", "--dry-run", "--directory", str(REPO_ROOT), *command.argv[1:]],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{command}: {done.stderr}"


def test_the_parser_check_refuses_what_a_shell_would_refuse():
    assert parse_error(["report", "results/records.jsonl", "--bogus"]).endswith("unrecognized arguments: --bogus")
    assert INCOMPLETE in parse_error(["triton", "render"])
    assert "invalid choice: 'pt-9'" in parse_error(["triton", "stage", "pt-9"])
    assert parse_error(["triton", "stage", "NAME", "--url", "127.0.0.1:8000"]) is None
    done = subprocess.run(["make", "--dry-run", "--directory", str(REPO_ROOT), "no-such-target"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0

