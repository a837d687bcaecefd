"""A family is one record (issue 67): ``servelab.core.catalogue.FAMILIES``. The runners branch on no family's
name, and what titles a family or reads its servers' metrics reads the record, never a copy of it."""

import ast
from dataclasses import replace
from pathlib import Path

import pytest

import servelab
from servelab.core.catalogue import FAMILIES, TRITON
from servelab.core.family import Queries
from servelab.measure.monitoring.run_series import PromWatch
from servelab.measure.records import Record
from servelab.report import plots
from servelab.tools.notebook_blocks import family_stages

PACKAGE = Path(servelab.__file__).parent
NAMES = {f.name for f in FAMILIES.values()}


def branches_on_a_name(path: Path) -> list[str]:
    """Each family name the module compares with, or uses as a key (a subscript, a dict's key, a match case)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        used = ([node.left, *node.comparators] if isinstance(node, ast.Compare) else
                [node.slice] if isinstance(node, ast.Subscript) else
                [k for k in node.keys if k is not None] if isinstance(node, ast.Dict) else
                [node.pattern] if isinstance(node, ast.match_case) else [])
        found += [f"line {c.lineno}: {c.value!r}" for part in used for c in ast.walk(part)
                  if isinstance(c, ast.Constant) and c.value in NAMES]
    return found


@pytest.mark.parametrize("module", ["run/lab.py", "run/plan.py"])
def test_the_lab_and_its_plans_branch_on_no_family_name(module):
    """A family's differences are its adapter's (servelab.run.families), not an ``if`` in the runner."""
    assert branches_on_a_name(PACKAGE / module) == []


def test_the_check_sees_a_typed_name(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('if stage.family == "triton":\n    x = {"ray": 1}[name] + table["fastapi"]\n')
    assert sorted(branches_on_a_name(module)) == ["line 1: 'triton'", "line 2: 'fastapi'", "line 2: 'ray'"]


def test_each_familys_title_and_queries_are_read_from_its_record(monkeypatch):
    """The plots' rows, the notebooks' counts and the Prometheus read-back print what the record holds: change
    the record, and each of them changes."""
    probe = Queries(all_requests="probe_total{$sel}", successes="probe_ok{$sel}", series={})
    monkeypatch.setitem(FAMILIES, TRITON.name, replace(TRITON, title="Probe", queries=probe))
    record = Record.model_construct(stage="onnx-1")
    assert [(f, title) for f, title, _ in plots._rows([record])] == [("triton", "Probe")]
    assert " Probe stages: `pt-1`" in family_stages("triton")

    class Client:
        asked: list[str] = []

        def settle(self, after, instances):
            return after

        def query(self, expr, at):
            self.asked.append(expr)
            return [{"value": [at, "3"]}]

    watch = PromWatch(Client(), step_s=1.0)
    assert watch.before("triton", {"instance": "h:1"}).requests == 3.0
    assert Client.asked == ['probe_total{instance="h:1"}']


def test_no_other_module_types_a_familys_title_or_queries():
    """The titles and PromQL live in the records only (servelab/core/family.py, catalogue.py)."""
    typed = {f.title for f in FAMILIES.values()} | {q for f in FAMILIES.values()
                                                    for q in (f.queries.all_requests, f.queries.successes,
                                                              *f.queries.series.values())}
    homes = {PACKAGE / "core" / "family.py", PACKAGE / "core" / "catalogue.py"}
    found = [(path.relative_to(PACKAGE), node.value) for path in PACKAGE.rglob("*.py") if path not in homes
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and node.value in typed]
    assert found == []
