"""What the notebooks say, checked against the project: generated parts (code excerpts, stage configs,
what `make lab` runs, the original lab's figures), figures quoted from the original lab, and cells
that stay what a student runs."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from notebook_harness import parameter_names, parameters_cells
from servelab.core import original_lab
from servelab.core.paths import REPO_ROOT
from servelab.run.plan import LAB_STAGES
from servelab.servers.triton.configs import STAGES as TRITON_STAGES
from servelab.tools import notebook_blocks
from servelab.tools.notebook_blocks import definition_source, expand, specs, stage_config
from servelab.tools.render_notebooks import NOTEBOOK_DIR, sources, to_notebook

SOURCES = sources()
STEMS = [source.stem for source in SOURCES]
MEASURING = ["4_fastapi", "6_triton_python", "7_triton_onnx", "8_triton_more", "10_ray"]  # their steps are calls to servelab.run.walkthrough
FIGURE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|req/s|requests/s|infer/s|inferences/s)\b")
UNITS = {"requests/s": "req/s", "inferences/s": "infer/s"}


def _text(stem: str) -> str:
    return (NOTEBOOK_DIR / f"{stem}.md").read_text(encoding="utf-8")


def _specs(stem: str, kind: str) -> list[list[str]]:
    return [spec.split()[1:] for spec in specs(_text(stem)) if spec.split()[0] == kind]


# --- generated parts --------------------------------------------------------------------------


def test_expand_rewrites_a_stale_part_and_keeps_the_rest() -> None:
    text = "Before.\n\n<!-- generated: original-lab pt-2x2-concurrency-8 -->\nold figures\n<!-- end generated -->\nAfter.\n"
    expanded = expand(text)
    assert "old figures" not in expanded and "average latency 40.7 ms" in expanded
    assert expanded.startswith("Before.\n\n") and expanded.endswith("<!-- end generated -->\nAfter.\n")
    assert expand(expanded) == expanded


def test_an_inline_part_writes_one_figure_in_its_sentence() -> None:
    marker = "<!-- generated: original-figure pt-1-concurrency-8 of which queueing in Triton -->"
    text = f"Of it, {marker}9 ms<!-- end generated --> queued; `<!-- generated: KIND -->` and `<!-- end generated -->` are quoted.\n"
    expanded = expand(text)
    assert expanded == text.replace("9 ms", "132 ms") and expand(expanded) == expanded
    assert specs(text) == ["original-figure pt-1-concurrency-8 of which queueing in Triton"]
    with pytest.raises(ValueError, match="begins its line"):
        expand(f"Of it,\n{marker}9 ms<!-- end generated --> queued.")
    with pytest.raises(ValueError, match="spans lines"):
        expand("In <!-- generated: lab-plans -->x<!-- end generated --> it.")
    with pytest.raises(LookupError, match="pt-1-concurrency-8 has no figure 'median'"):
        expand("In <!-- generated: original-figure pt-1-concurrency-8 median -->x<!-- end generated --> it.")


def test_unknown_parts_and_names_fail_the_rendering() -> None:
    with pytest.raises(ValueError, match="unknown generated part 'nonsense'"):
        expand("<!-- generated: nonsense -->\n<!-- end generated -->")
    with pytest.raises(LookupError, match="defines no MicroBatcher._gone"):
        expand("<!-- generated: excerpt servelab/servers/fastapi/batcher.py MicroBatcher._gone -->\n<!-- end generated -->")
    with pytest.raises(KeyError, match="no step 'pt-9'"):
        expand("<!-- generated: original-lab pt-9 -->\n<!-- end generated -->")


def test_a_python_excerpt_outside_a_region_is_refused(tmp_path: Path) -> None:
    """Jupytext would turn its ```python block into a runnable cell."""
    source = tmp_path / "9_x.md"
    source.write_text("# X\n\n<!-- generated: excerpt models_staging/food_classifier/1/model.py "
                      "TritonPythonModel.execute -->\n<!-- end generated -->\n")
    with pytest.raises(ValueError, match="split over cells"):
        to_notebook(source)
    source.write_text(f"# X\n\n<!-- #region -->\n{source.read_text()[5:]}<!-- #endregion -->\n")
    (cell,) = [c for c in to_notebook(source).cells if "generated" in c.source]
    assert cell.cell_type == "markdown" and "def execute(self, requests):" in cell.source


def test_definition_source_finds_nested_functions_methods_and_decorators(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def outer():\n    @wrap(1)\n    async def inner(x):\n        return x\n\n"
                      "class K:\n    def m(self):\n        '''Doc.'''\n        return 2\n")
    assert definition_source(module, "outer.inner") == "@wrap(1)\nasync def inner(x):\n    return x"
    assert definition_source(module, "K.m") == "def m(self):\n    '''Doc.'''\n    return 2"
    with pytest.raises(LookupError):
        definition_source(module, "K.inner")


def test_the_notebooks_show_the_code_they_teach() -> None:
    shown = {tuple(args) for stem in STEMS for args in _specs(stem, "excerpt")}
    assert {("fastapi_pt/app.py", "build_app.predict"), ("fastapi_pt/app.py", "load_model"),
            ("servelab/servers/fastapi/batcher.py", "MicroBatcher._run"),
            ("models_staging/food_classifier/1/model.py", "TritonPythonModel.execute")} <= shown
    handler = definition_source(Path(notebook_blocks.REPO_ROOT) / "fastapi_pt/app.py", "build_app.predict")
    assert handler.startswith('@app.post("/predict"') and handler in _text("4_fastapi")
    assert "await pipeline.batcher.submit(" in handler


def test_every_triton_stage_shows_its_config_and_diffs_name_real_stages() -> None:
    shown = [args for stem in ("6_triton_python", "7_triton_onnx", "8_triton_more") for args in _specs(stem, "stage-config")]
    # pt-1's is the file 5_triton_setup shows (`cat`), and students read it back from Triton in 6_triton_python.
    assert "cat models_staging/food_classifier/config.pbtxt" in _text("5_triton_setup")
    assert 'running = client.get_model_config("food_classifier")' in (REPO_ROOT / "docs/instructors.md").read_text()
    assert [args[0] for args in shown] == [name for name in TRITON_STAGES if name != "pt-1"]  # in the order walked
    for args in shown:
        assert set(args) <= set(TRITON_STAGES)
        assert not TRITON_STAGES[args[0]].triton.changes or len(args) == 2, f"{args[0]}: show what it changes as a diff"


def test_a_stage_config_diff_shows_exactly_what_the_stage_changes() -> None:
    diff = stage_config("onnx-dyn", "onnx-1")
    changed = [line for line in diff.splitlines() if line[:1] in ("+", "-") and line[:3] not in ("+++", "---")]
    assert changed == ["+dynamic_batching {", "+  preferred_batch_size: [4, 6, 8]",
                       "+  max_queue_delay_microseconds: 100", "+}"]
    assert "servelab_stage" not in stage_config("pt-4x4", "pt-2x2")
    with pytest.raises(ValueError, match="pt-dyn changes its base config"):
        stage_config("pt-dyn")


def test_the_intro_lists_what_make_lab_really_runs() -> None:
    intro = _text("0_intro")
    assert ["lab-stages"] == [spec for spec in specs(intro) if spec.startswith("lab-stages")]
    for stage in LAB_STAGES:
        assert f"| `{stage.name}` |" in intro
    for name in set(TRITON_STAGES) - {s.name for s in LAB_STAGES}:
        assert re.search(rf"Only on the node:.*`{name}`", intro), name
    requires = re.search(r'requires-python = ">=(\d+\.\d+)"', (notebook_blocks.REPO_ROOT / "pyproject.toml").read_text())[1]
    assert re.search(rf"Python {re.escape(requires)}\b", intro) and "Linux" in intro


# --- the ONNX model: where it has no Python -------------------------------------------------------


@pytest.mark.parametrize("stem", STEMS)
def test_no_python_claims_say_where_they_hold(stem: str) -> None:
    """On the node Triton's ONNX Runtime backend runs the ONNX model; locally a Python-backend stand-in."""
    for paragraph in _text(stem).split("\n\n"):
        if re.search(r"no Python", paragraph) and "<!-- generated" not in paragraph:
            assert "on the node" in paragraph.lower(), paragraph


def test_the_triton_models_table_names_the_local_stand_in() -> None:
    table = notebook_blocks.triton_models()
    onnx = [row for row in table.splitlines() if row.startswith("| `food_classifier_onnx")]
    assert len(onnx) == 4  # the fp32 model and its variants: u8, int8, fp16
    assert all("`onnxruntime` backend" in row and "LOCAL STAND-IN" in row for row in onnx)
    assert "LOCAL STAND-IN" not in "\n".join(row for row in table.splitlines() if row not in onnx)
    assert "<!-- generated: triton-models -->" in _text("5_triton_setup")


# --- the original lab's figures --------------------------------------------------------------------


def quoted_original_figures(markdown: str) -> list[tuple[float, str]]:
    """(value, unit) of every figure in a paragraph that speaks of the original lab."""
    found = []
    for paragraph in re.split(r"\n\s*\n", markdown):
        if "original" in paragraph.lower():
            found += [(float(value), UNITS.get(unit, unit)) for value, unit in FIGURE.findall(paragraph)]
    return found


def test_quoted_figures_are_found_with_their_units() -> None:
    text = "The original lab saw 151 ms and 52.4 inferences/s.\n\nOurs: 12 ms.\n\nIn the original, 80.7 requests/s."
    assert quoted_original_figures(text) == [(151, "ms"), (52.4, "infer/s"), (80.7, "req/s")]


@pytest.mark.parametrize("stem", STEMS)
def test_every_original_lab_figure_comes_from_the_table(stem: str) -> None:
    known = original_lab.figures()
    unknown = [figure for figure in quoted_original_figures(_text(stem)) if figure not in known]
    assert unknown == [], f"{stem} quotes figures of the original lab that servelab/data/original_lab.toml lacks"


def test_each_table_step_is_quoted_where_ours_measures_it() -> None:
    for key, step in original_lab.steps().items():
        text = _text(step.notebook)
        assert ["original-lab", key] in [spec.split() for spec in specs(text)], key
        heading = re.search(rf"^#+ {re.escape(step.section)}(?: \(optional\))?$", text, re.MULTILINE)
        assert heading and heading.start() < text.index(f"original-lab {key} "), key
        assert all(f.unit in ("ms", "req/s", "infer/s") and f.value > 0 for f in step.figures), key


# --- the H100 run's figures ------------------------------------------------------------------------

H100_FIGURE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|req/s|requests/s|×|x)(?![\w/])")
DOCS = sorted(p for p in (REPO_ROOT / "docs").rglob("*.md") if "records" not in p.parts)


def gpu_figures_quoted(markdown: str) -> list[tuple[float, str]]:
    """(value, unit) of every latency or rate in a paragraph (or table row) that speaks of the H100."""
    found = []
    for block in re.split(r"\n\s*\n", markdown):
        rows = any(line.startswith("|") for line in block.splitlines())
        for paragraph in block.splitlines() if rows else [block]:
            if "H100" not in paragraph:
                continue
            found += [(float(v), UNITS.get(u, u)) for v, u in H100_FIGURE.findall(paragraph) if u in ("ms", "req/s", "requests/s")]
            assert not [f for f in H100_FIGURE.findall(paragraph) if f[1] in ("×", "x")], \
                f"a ratio about the H100 that its record does not hold:\n{paragraph}"
    return found


def test_h100_figures_are_found_and_a_ratio_is_refused() -> None:
    assert gpu_figures_quoted("On an H100, 12.23 ms and 7.0 requests/s.\n\nHere 3 ms.") == [(12.23, "ms"), (7.0, "req/s")]
    with pytest.raises(AssertionError):
        gpu_figures_quoted("On an H100 fp16 was 1.76× fp32.")


@pytest.mark.parametrize("path", [*(NOTEBOOK_DIR / f"{s}.md" for s in STEMS), *DOCS], ids=lambda p: p.name)
def test_every_h100_figure_comes_from_its_record(path) -> None:
    """The project's one GPU run is docs/records/gpu-h100-2026-11-24.toml: a figure about the H100 in a
    notebook or doc is one of its figures (a `gpu-record` block writes them), never typed."""
    known = notebook_blocks.gpu_figures()
    unknown = [f for f in gpu_figures_quoted(path.read_text(encoding="utf-8")) if f not in known]
    assert unknown == [], f"{path.name} quotes H100 figures its record lacks"


# --- cells stay what a student runs ----------------------------------------------------------------


def _code_cells(stem: str) -> list[ast.Module]:
    cells = [cell.source for cell in to_notebook(NOTEBOOK_DIR / f"{stem}.md").cells if cell.cell_type == "code"]
    # IPython's top-level await is plain Python inside an async function.
    return [ast.parse("async def _():\n" + textwrap.indent(source, "    ")) for source in cells]


@pytest.mark.parametrize("stem", STEMS)
def test_cells_do_not_read_the_environment(stem: str) -> None:
    for tree in _code_cells(stem):
        names = {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(tree) if isinstance(n, (ast.Attribute, ast.Name))}
        assert not names & {"environ", "getenv", "putenv"}, ast.unparse(tree)


@pytest.mark.parametrize("stem", STEMS)
def test_branches_on_parameters_only_guard_them(stem: str) -> None:
    """A test's needs belong in tests/notebook_harness.py or in servelab.run.walkthrough, not in a cell:
    the measuring notebooks have no `if` at all, and elsewhere an `if` on a parameter only stops a
    student who forgot to set it."""
    params = {name for cell in parameters_cells(to_notebook(NOTEBOOK_DIR / f"{stem}.md")) for name in parameter_names(cell)}
    for tree in _code_cells(stem):
        for node in ast.walk(tree):
            if not isinstance(node, ast.If):
                continue
            assert stem not in MEASURING, f"{stem}: move this branch into servelab.run.walkthrough: {ast.unparse(node)}"
            tested = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
            if tested & params:
                assert all(isinstance(s, ast.Raise) for s in node.body) and not node.orelse, ast.unparse(node)
