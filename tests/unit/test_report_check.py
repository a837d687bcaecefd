"""The grader's check (``servelab report --check``) on records this project made: the H200 run of 2026-11-28
(docs/records/gpu-h200-2026-11-28: its records, and the report this servelab writes from them), copies of it
edited by hand, the same run made the shape of a student's on a P100 node (``p100_records``), the CPU records of
a quick lab (tests/data) edited to claim one, and input that is no record at all."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from servelab.cli import main
from servelab.core.catalogue import CORE_PATH, STAGES
from servelab.core.hardware import instance_id
from servelab.core.paths import MODELS_STAGING, REPO_ROOT
from servelab.measure.records import read_records
from servelab.report.check import check, check_all, leases_of
from servelab.report.lessons import RUBRIC
from servelab.report.render import render_report
from servelab.servers.triton.configs import meant

H200 = REPO_ROOT / "docs/records/gpu-h200-2026-11-28"
QUICK_LAB = REPO_ROOT / "tests/data/quick_lab_records.jsonl"
NOW = 1795900000.0  # 2026-11-28 21:06 UTC: after the H200 run


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A student's results/ folder: the H200 run's records and the report written from them by this servelab (the
    committed report is an older servelab's: its table has fewer columns than one a student's run writes now)."""
    folder = tmp_path / "results"
    folder.mkdir()
    shutil.copy(H200 / "records.jsonl", folder / "records.jsonl")
    render_report(read_records(folder / "records.jsonl"), folder, [folder / "records.jsonl"])
    return folder


P100 = ["Tesla P100-PCIE-16GB"] * 2
SERVER = "3f1c2a9e-5b7d-4c1e-9a2f-6d8e0b4c7a15"  # the student's server, as Nova names it (a UUID)
# The Triton Python-backend stages of 6_triton_python, which the H200 run did not measure: (stage, load) per run.
PYTHON_BACKEND = (("pt-1", "sequential"), ("pt-1", "closed"), ("pt-dyn", "closed"), ("pt-2x2", "closed"))


def p100_records() -> list[dict]:
    """The H200 run as a student's core path on a gpu_p100 node: the lab's model, the node's 2 GPUs and 48 CPUs,
    and the Python-backend runs it lacks, each a copy of onnx-1's run at the same load, moved on by a minute each
    (its own window) and said to run PyTorch on the GPU; every record names the node's instance (``SERVER``) and
    perf_analyzer's runs the window they now record (the 3 s before each was written). Every figure is still one a
    run wrote."""
    records = lines_of(H200 / "records.jsonl")
    onnx1 = {r["load"]["mode"]: r for r in records if r["stage"] == "onnx-1"}
    for n, (stage, mode) in enumerate(PYTHON_BACKEND, 1):
        run = json.loads(json.dumps(onnx1[mode]))
        run["stage"], run["window_unix"] = stage, [w + 60 * n for w in run["window_unix"]]
        run["started_at"] = (dt.datetime.fromisoformat(run["started_at"]) + dt.timedelta(minutes=n)).isoformat()
        run["config"]["runs_on"] = "triton python: 1x KIND_GPU on GPU 0; instances say: 1x PyTorch on cuda:0"
        records.append(run)
    for r in records:
        r["stand_in"] = None
        r["machine"].update(gpus=P100, cpu_logical=48, cpu_physical=24, instance_id=SERVER)
        if r["tool"] == "perf_analyzer":
            written = dt.datetime.fromisoformat(r["started_at"]).timestamp()
            r["window_unix"] = [written - 3.0, written - 0.5]
    return [read_back(r) for r in records]


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_h200_run_as_written_is_flagged_for_its_stand_ins_its_machine_and_the_stages_it_lacks(results: Path) -> None:
    verdict = check(results, NOW)
    assert verdict.lines()[0].startswith(f"{results}: 32 records of 6 stages on 1x NVIDIA H200, driver 580.159.04")
    stand_ins = [f for f in verdict.findings if "a stand-in, not the lab's model: zero-shot stand-in" in f]
    # The zero-shot model in FastAPI's stages, and with Triton's stand-in too: one line for the 20 Triton records.
    assert len(stand_ins) == 2 and "and 17 more" in stand_ins[1]
    # That run (at 2c4a03a) predates the config read back from Triton after each load, which a run now records.
    (unread,) = [f for f in verdict.findings if "no config read back from Triton" in f]
    assert "and 17 more: no config read back from Triton (config.triton_config)" in unread
    assert ("1x NVIDIA H200, driver 580.159.04, 16 CPUs: NVIDIA H200 is not the GPU of a node type the lab "
            "runs on (gpu_p100, gpu_v100, gpu_rtx_6000, gpu_a100_pcie)") in verdict.findings
    assert verdict.findings[-1] == ("the core path (notebooks 4, 6 and 7) is missing runs of 2 of its 6 stages: "
                                    "pt-1, pt-2x2")
    # It also predates the window perf_analyzer's runs now record.
    assert any(f.endswith("and 3 more: perf_analyzer's run has no measured window (window_unix): run it with this "
                          "commit's servelab") for f in verdict.findings)
    assert len(verdict.findings) == 6


def read_back(record: dict) -> dict:
    """``record`` as a run now writes it: with the config Triton reported running, which ``check_running`` found to
    be the stage's (tests/integration/test_triton_server.py holds that on a real server)."""
    if (stage := STAGES.get(record["stage"])) and stage.family == "triton":
        record["config"]["triton_config"] = meant(stage, kind="gpu", onnxruntime=True, repository=MODELS_STAGING,
                                                  gpus=len(record["machine"]["gpus"]))
    return record


def test_a_triton_stage_run_under_another_config_is_found(tmp_path: Path) -> None:
    """onnx-1 as Triton's auto-complete would have run it on the node (a default batcher): not onnx-1."""
    records = p100_records()
    onnx1 = next(i for i, r in enumerate(records) if r["stage"] == "onnx-1")
    records[onnx1]["config"]["triton_config"]["food_classifier_onnx"]["scheduler"] = (
        "dynamic_batching { preferred_batch_size: [16] }")
    write(tmp_path / "records.jsonl", records)
    found = check(tmp_path / "records.jsonl", NOW).findings
    assert found == [f"line {onnx1 + 1} (onnx-1, sequential): Triton did not run onnx-1's config: food_classifier_onnx: "
                     "scheduler: the stage's config has 'none', Triton runs 'dynamic_batching { preferred_batch_size: "
                     "[16] }'"]


def test_a_run_of_the_core_path_on_a_p100_node_passes(tmp_path: Path) -> None:
    records = p100_records()
    for r in records:
        r["config"].pop("device", None)  # as the notebooks' runs record it: their GPUs say where they ran
    write(tmp_path / "records.jsonl", records)
    verdict = check(tmp_path / "records.jsonl", NOW)
    assert verdict.findings == [] and verdict.lines()[0].endswith("(0 h 05 min): no finding")
    assert "36 records of 9 stages on 2x Tesla P100-PCIE-16GB, driver 580.159.04, 48 CPUs" in verdict.lines()[0]


def forged_quick_lab() -> list[dict]:
    """Issue #64's forgery: a CPU quick lab of fastapi-onnx with four fields edited to claim a P100 node."""
    records = [r for r in lines_of(QUICK_LAB) if r["stage"] == "fastapi-onnx"]
    for r in records:
        r["machine"]["gpus"], r["machine"]["stack"]["driver"] = P100, "550.54.15"
        r["config"]["device"], r["stand_in"] = "gpu", None
    return records


def test_a_cpu_run_edited_to_claim_a_p100_node_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "records.jsonl", forged_quick_lab())
    found = check(tmp_path / "records.jsonl", NOW).findings
    assert found == [
        "line 1 (fastapi-onnx, sequential); line 2 (fastapi-onnx, concurrency 8): its model ran on the CPU "
        "(onnxruntime CPUExecutionProvider), not on the GPU the record claims",
        "2x Tesla P100-PCIE-16GB, driver 550.54.15, 2 CPUs: 2 CPUs, but a gpu_p100 node has at least 24",
        "the core path (notebooks 4, 6 and 7) is missing runs of 5 of its 6 stages: fastapi-pt, pt-1, pt-2x2, "
        "onnx-1, onnx-dyn"]


def _runs_on(records: list[dict], stage: str, runs_on: str) -> None:
    for r in records:
        if r["stage"] == stage:
            r["config"]["runs_on"] = runs_on


@pytest.mark.parametrize(("forge", "finding"), [
    (lambda rs: _runs_on(rs, "fastapi-pt", "torch cpu float32"), "its model ran on the CPU (torch cpu float32)"),
    (lambda rs: _runs_on(rs, "pt-dyn", "triton python: 1x KIND_CPU; instances say: 1x PyTorch on cpu"),
     "its model ran on the CPU (triton python: 1x KIND_CPU"),
    (lambda rs: _runs_on(rs, "onnx-1", "triton python: 1x KIND_GPU on GPU 0; instances say: 1x CPUExecutionProvider "
                                       "on cpu"), "its model ran on the CPU (triton python: 1x KIND_GPU"),
    (lambda rs: [r["machine"].update(gpus=P100[:1]) for r in rs], "1 GPUs, but a gpu_p100 node has 2"),
    (lambda rs: [r["machine"].update(cpu_logical=8) for r in rs], "8 CPUs, but a gpu_p100 node has at least 24"),
    (lambda rs: [r["machine"].update(gpus=["NVIDIA GeForce RTX 4090"]) for r in rs],
     "NVIDIA GeForce RTX 4090 is not the GPU of a node type the lab runs on"),
    (lambda rs: rs.__setitem__(slice(None), [r for r in rs if (r["stage"], r["load"]["mode"]) != ("fastapi-pt", "sequential")]),
     "missing runs of 1 of its 6 stages: fastapi-pt (sequential)"),
    (lambda rs: rs.__setitem__(slice(None), [r for r in rs if r["stage"] != "onnx-dyn" or r["tool"] != "servelab"]),
     None),  # perf_analyzer's runs of onnx-dyn hold its open loads too
    (lambda rs: rs.__setitem__(slice(None), [r for r in rs if r["stage"] != "onnx-dyn"]), "stages: onnx-dyn"),
], ids=["torch-cpu", "triton-kind-cpu", "triton-instances-on-cpu", "one-gpu", "eight-cpus", "not-a-lab-gpu",
        "no-sequential-pt", "pa-only-onnx-dyn", "no-onnx-dyn"])
def test_each_forgery_of_a_p100_run_is_refused(tmp_path: Path, forge, finding: str | None) -> None:
    records = p100_records()
    forge(records)
    write(tmp_path / "records.jsonl", records)
    found = check(tmp_path / "records.jsonl", NOW).findings
    if finding is None:
        assert found == []
        return
    assert [f for f in found if finding in f], found
    # A GPU list edited to fewer GPUs also contradicts the GPUs Triton reported placing pt-2x2's instances on.
    placement = "Triton did not run pt-2x2's config: food_classifier: instances: the stage's config has"
    assert all(placement in f for f in found if finding not in f), found
    assert len(found) == 1 + finding.startswith(("1 GPUs", "NVIDIA GeForce")), found


def test_a_hand_edited_copy_leaves_traces(results: Path) -> None:
    records = lines_of(results / "records.jsonl")
    records[5]["stats"]["throughput_rps"] *= 1.2  # fastapi-onnx at 8 senders, made 20 % faster
    records[5]["stats"]["items_per_s"] *= 1.2
    records[13]["stats"]["latency"]["p99_ms"] = 15.0  # onnx-1 at 8 senders: a p99 below its p95
    records[20]["stats"]["latency"]["p50_ms"] *= 0.8  # a median that no longer matches its latencies
    records[1]["machine"]["gpus"] = []
    write(results / "records.jsonl", records)

    found = check(results, NOW).findings
    (throughput,) = [f for f in found if "throughput" in f and "successes" in f]
    assert throughput.startswith("line 6 (fastapi-onnx, concurrency 8): throughput 584.9 req/s is not its 200 successes")
    assert any(f.startswith("line 14 (onnx-1, concurrency 8): percentiles out of order") for f in found)
    assert any(f.startswith("line 14 (onnx-1, concurrency 8): percentiles do not match the latencies kept") and "p99_ms 15" in f
               for f in found)
    assert any(f.startswith("line 21 ") and "percentiles do not match the latencies kept" in f and "p50_ms" in f for f in found)
    assert any(f.startswith("line 2 (fastapi-pt, concurrency 8): no GPU in the record") for f in found)
    assert any(f.startswith("the records name more than one machine: ") for f in found)
    # The report was written from the records before the edit: its table no longer matches them.
    assert any(f.startswith("report-tables.md: a row of the runs' table matches no record (and 2 more)") for f in found)
    assert any(f.startswith("report-tables.md: a row of the runs' table is missing from it (and 2 more)") for f in found)


def test_times_outside_one_lease_copies_and_a_short_report_are_found(results: Path) -> None:
    records = lines_of(results / "records.jsonl")
    later = records[3]
    later["started_at"] = "2026-11-28T10:55:14+00:00"  # four hours after the others
    later["window_unix"] = [w + 4 * 3600 for w in later["window_unix"]]
    write(results / "records.jsonl", records + [records[0]])  # and the first run twice

    found = check(results, NOW).findings
    assert "the records span 4 h 00 min (2026-11-28 06:55 UTC to 2026-11-28 10:55 UTC): more than one lease of 3 h" in found
    assert "line 33 (fastapi-pt, sequential) is a copy of line 1 (fastapi-pt, sequential) (the same measured window)" in found
    assert "report.md was written from 32 records; there are 33" in found

    early = dict(records[2], started_at="2026-11-28T05:00:00+00:00")
    write(results / "records.jsonl", [early])
    assert any("is not just after its measured window" in f for f in check(results, NOW).findings)
    assert any("dated in the future" in f for f in check(results, NOW - 86400).findings)


def test_the_same_run_in_two_submissions_is_named(tmp_path: Path) -> None:
    for student in ("ab1", "cd2"):
        (tmp_path / student).mkdir()
        shutil.copy(H200 / "records.jsonl", tmp_path / student / "records.jsonl")
    first, second = check_all([tmp_path / "ab1", tmp_path / "cd2"], NOW)
    assert not any("two submissions" in f for f in first.findings)
    copied = [f for f in second.findings if "two submissions" in f]  # every servelab run (perf_analyzer keeps no window)
    assert len(copied) == 26 and copied[0] == (f"line 1 (fastapi-pt, sequential) is also in {tmp_path / 'ab1'} "
                                                "(line 1 (fastapi-pt, sequential)): the same run in two submissions")


def test_cpu_records_are_not_from_a_gpu_node() -> None:
    found = check(QUICK_LAB, NOW).findings
    assert any(f.endswith("no GPU in the record (machine.gpus is empty): not run on a GPU node") and "and 18 more" in f
               for f in found)
    assert any(f.endswith("servelab ran with device 'cpu', not 'gpu'") for f in found)


def test_bad_input_is_a_finding_never_a_crash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "mixed").mkdir()
    good = (H200 / "records.jsonl").read_text().splitlines()[0]
    (tmp_path / "mixed" / "records.jsonl").write_text(f'{good}\nnot json\n{{"stage": "x"}}\n')
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00")

    rc = main(["report", "--check", str(tmp_path / "absent"), str(tmp_path / "empty"), str(tmp_path / "mixed"),
               str(tmp_path / "binary.jsonl")])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert f"{tmp_path / 'absent'}: no such folder or file" in out
    assert f"{tmp_path / 'empty'}: no records.jsonl in it" in out
    mixed = [line for line in out if line.startswith(str(tmp_path / "mixed"))]
    assert any("records.jsonl line 2 is not a servelab record (JSONDecodeError" in line for line in mixed)
    assert any("records.jsonl line 3 is not a servelab record (ValidationError" in line for line in mixed)
    assert any("no readable report.md beside the records" in line for line in mixed)
    assert any(line.startswith(f"{tmp_path / 'binary.jsonl'}: cannot read binary.jsonl: UnicodeDecodeError") for line in out)


def test_the_command_passes_a_clean_submission(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "records.jsonl", p100_records())
    assert main(["report", "--check", str(tmp_path / "records.jsonl")]) == 0
    assert capsys.readouterr().out.strip().endswith("no finding")


def test_a_report_written_now_from_the_records_agrees_with_them(tmp_path: Path) -> None:
    """The report this checkout writes (servelab report), not only the one the H200 run wrote, is what the check reads."""
    write(tmp_path / "records.jsonl", p100_records())
    render_report(read_records(tmp_path / "records.jsonl"), tmp_path, [tmp_path / "records.jsonl"])
    assert check(tmp_path, NOW).findings == []
    (tmp_path / "report-tables.md").write_text((tmp_path / "report-tables.md").read_text().replace("| 487.4 |", "| 587.4 |"))
    edited, absent = check(tmp_path, NOW).findings
    assert edited.startswith("report-tables.md: a row of the runs' table matches no record: | fastapi-onnx |")
    assert "| 587.4 | 487.4 |" in edited  # req/s edited, img/s not
    assert absent.startswith("report-tables.md: a row of the runs' table is missing from it: | fastapi-onnx |")


def test_malformed_records_and_a_folder_get_one_line_never_a_traceback(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    objects = lines_of(H200 / "records.jsonl")[:1]
    objects[0]["machine"]["gpus"] = [{"name": "Tesla P100-PCIE-16GB"}]  # objects, not names
    write(tmp_path / "objects.jsonl", objects)
    assert main(["report", "--check", str(tmp_path / "objects.jsonl")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert ("objects.jsonl line 1 is not a servelab record (ValidationError: machine: Value error, machine.gpus must "
            "be a list of GPU names") in out[1]

    assert main(["report", str(tmp_path / "objects.jsonl"), "--out-dir", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"error: {tmp_path / 'objects.jsonl'}:1: not a servelab record (ValidationError: machine")

    assert main(["report", str(tmp_path)]) == 2  # a folder without records
    assert capsys.readouterr().out.splitlines() == [f"error: no records at {tmp_path / 'records.jsonl'}; run "
                                                    "`servelab load ... --out FILE` first"]

    (tmp_path / "results").mkdir()  # what the check tells a student to run: `servelab report results`
    shutil.copy(H200 / "records.jsonl", tmp_path / "results" / "records.jsonl")
    assert main(["report", str(tmp_path / "results")]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"wrote {tmp_path / 'results' / 'report.md'}")
    assert "report-tables.md: " not in " ".join(check(tmp_path / "results", NOW).findings)


LEASE = {"start": "2026-11-28T06:00:00+00:00", "end": "2026-11-28T08:55:00+00:00", "servers": [SERVER]}
CLASSMATE = "9b0e7d42-1c3a-4f6b-8e5d-2a7c9f1b3e60"


def _moved(records: list[dict], days: int) -> None:
    """The run made on another day (another lease), every time in it moved as one."""
    for r in records:
        r["started_at"] = (dt.datetime.fromisoformat(r["started_at"]) + dt.timedelta(days=days)).isoformat()
        r["window_unix"] = [w + days * 86400 for w in r["window_unix"]]


@pytest.mark.parametrize(("forge", "finding"), [
    (lambda rs: None, None),
    (lambda rs: _moved(rs, -1), "ran outside the student's leases (2026-11-28 06:00 UTC to 2026-11-28 08:55 UTC)"),
    (lambda rs: _moved(rs[:1], -1), "line 1 (fastapi-pt, sequential): ran outside the student's leases"),
    (lambda rs: [r["machine"].update(instance_id=CLASSMATE) for r in rs],
     f"ran on instance {CLASSMATE}, not on the student's server in that lease ({SERVER})"),
    (lambda rs: [r["machine"].update(instance_id="unknown") for r in rs],
     f"no instance recorded (machine.instance_id), so not the student's server ({SERVER})"),
    (lambda rs: [r["machine"].pop("instance_id") for r in rs], "no instance recorded (machine.instance_id)"),
    (lambda rs: rs[-1].pop("window_unix"), "perf_analyzer's run has no measured window (window_unix)"),
], ids=["real-shaped", "another-day", "one-record-from-another-day", "classmate-node", "laptop", "older-servelab",
        "pa-without-window"])
def test_records_are_held_to_the_student_s_lease_and_server(tmp_path: Path, forge, finding: str | None) -> None:
    records = [r for r in p100_records() if r["stage"] in ("fastapi-pt", "onnx-dyn")]
    assert records[-1]["tool"] == "perf_analyzer"
    forge(records)
    write(tmp_path / "records.jsonl", records)
    found = check(tmp_path / "records.jsonl", NOW, leases_of(LEASE)).findings
    found = [f for f in found if "the core path" not in f]  # two stages of it only
    if finding is None:
        assert found == []
        return
    # A record from another lease also stretches the records beyond one lease's length.
    assert finding in found[0] and all("more than one lease" in f for f in found[1:]), found


def test_the_command_reads_the_lease_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "records.jsonl", p100_records())
    (tmp_path / "lease.json").write_text(json.dumps([LEASE]))
    assert main(["report", "--check", str(tmp_path / "records.jsonl"), "--lease", str(tmp_path / "lease.json")]) == 0
    assert capsys.readouterr().out.strip().endswith("no finding")
    (tmp_path / "later.json").write_text(json.dumps({**LEASE, "start": 1795849200, "end": "2026-11-28T09:55"}))
    assert main(["report", "--check", str(tmp_path / "records.jsonl"), "--lease", str(tmp_path / "later.json")]) == 1
    assert "and 32 more: ran outside the student's leases (2026-11-28 07:00 UTC" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text('{"start": "yesterday", "end": 1}')
    for bad, said in (("bad.json", 'a lease is {"start": ISO 8601'), ("none.json", "No such file")):
        assert main(["report", "--check", str(tmp_path / "records.jsonl"), "--lease", str(tmp_path / bad)]) == 2
        (line,) = capsys.readouterr().out.splitlines()
        assert line.startswith("error: ") and said in line


def test_a_perf_analyzer_run_copied_into_another_submission_is_named(tmp_path: Path) -> None:
    records = p100_records()
    copied = next(r for r in records if r["tool"] == "perf_analyzer")
    for name, held in (("a", records), ("b", [copied])):
        (tmp_path / name).mkdir()
        write(tmp_path / name / "records.jsonl", held)
    _, b = check_all([tmp_path / "a" / "records.jsonl", tmp_path / "b" / "records.jsonl"], NOW)
    assert any("the same run in two submissions" in f for f in b.findings), b.findings


def test_the_instance_comes_from_cloud_init_else_the_metadata_service_else_unknown(tmp_path: Path) -> None:
    (tmp_path / "instance-id").write_text(SERVER + "\n")
    assert instance_id(tmp_path / "instance-id", "http://127.0.0.1:9/") == SERVER

    class Metadata(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # OpenStack's meta_data.json, in the fields read
            body = json.dumps({"uuid": CLASSMATE, "name": "node-serve-system-ab1234"}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    service = http.server.HTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    try:
        (tmp_path / "no-cloud").write_text("iid-datasource-none\n")
        url = f"http://127.0.0.1:{service.server_port}/openstack/latest/meta_data.json"
        assert instance_id(tmp_path / "no-cloud", url) == CLASSMATE
    finally:
        service.shutdown()
    began = time.monotonic()
    assert instance_id(tmp_path / "absent", url) == "unknown"  # no cloud-init, no service: a record all the same
    assert time.monotonic() - began < 2.0


def test_the_rubric_grades_only_ratios_of_the_core_path() -> None:
    """A student who skips every optional section loses no points: each graded ratio's two stages are on the core
    path (pt-dyn, once graded, is optional in 6_triton_python since #66)."""
    for graded in RUBRIC:
        stages = [stage.strip() for stage in graded.pair.split(",")[0].split("÷")]
        assert all(stage in CORE_PATH for stage in stages), (graded.pair, stages)


def test_a_class_is_graded_in_one_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ab1 handed in a real-shaped P100 run and its report; cd2 the CPU quick lab edited to claim a P100 node."""
    (tmp_path / "ab1" / "results").mkdir(parents=True)
    write(tmp_path / "ab1" / "results" / "records.jsonl", p100_records())
    render_report(read_records(tmp_path / "ab1/results/records.jsonl"), tmp_path / "ab1/results",
                  [tmp_path / "ab1/results/records.jsonl"])
    (tmp_path / "cd2").mkdir()
    write(tmp_path / "cd2" / "records.jsonl", forged_quick_lab())
    (tmp_path / "leases.json").write_text(json.dumps({"ab1": [LEASE], "cd2": LEASE}))
    assert main(["class", "grade", str(tmp_path), "--leases", str(tmp_path / "leases.json")]) == 1
    head, ab1, cd2, *findings = capsys.readouterr().out.splitlines()
    assert head.split()[:5] == ["student", "findings", "core", "stages", "fastapi-onnx"]
    # pt-1's and pt-2x2's runs are copies of onnx-1's (p100_records): onnx-1 ÷ pt-1 and pt-2x2 ÷ pt-1 read 1.00,
    # below their P100 range but not below 1.
    assert ab1.split() == ["ab1", "0", "6/6", "3.04", "in", "1.00", "out", "1.00", "out", "1.63", "in", "56/62"]
    assert cd2.split()[:3] == ["cd2", "6", "1/6"] and cd2.endswith("review: 2 + ?")
    cd2_said = [f for f in findings if f.startswith(f"{tmp_path / 'cd2'}: ")]
    assert len(cd2_said) == 6 and len(findings) == 6
    assert [f for f in cd2_said if "ran outside the student's leases" in f] and [f for f in cd2_said if "CPUExec" in f]
    assert main(["class", "grade", str(tmp_path / "nobody")]) == 2
    assert capsys.readouterr().out.startswith("error: ")
