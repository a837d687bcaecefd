"""The monitoring files for the lab node: the compose file, Prometheus' config, the Grafana dashboard.

No Docker engine here: the compose file is checked against the Compose Specification, its config for
what an operator relies on (nothing published beyond 127.0.0.1, pinned images from docker/.env), the
dashboard by Grafana's Foundation SDK, which must read back exactly what it generated.
The real Prometheus loading the node's config: tests/integration/test_prometheus_config.py.
"""

import json
import re

import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel

from dockerspec import DOCKER, MONITORING_COMPOSE, load_compose, run_tool, variables, venv_tool
from servelab.core.catalogue import FAMILIES
from servelab.measure.monitoring import dashboard
from servelab.tools.docker_versions import read_env_file


def test_monitoring_compose_matches_the_compose_specification():
    assert venv_tool("check-jsonschema").exists(), "check-jsonschema comes with the test extra"
    result = run_tool("check-jsonschema", "--builtin-schema", "vendor.compose-spec", str(MONITORING_COMPOSE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_monitoring_compose_publishes_on_127_0_0_1_only_with_pinned_images():
    document = load_compose(MONITORING_COMPOSE)
    services = document["services"]
    assert set(services) == {"prometheus", "grafana", "node_exporter", "dcgm_exporter"}
    published = {name: [str(p) for p in s.get("ports", [])] for name, s in services.items()}
    assert published == {"prometheus": ["127.0.0.1:9090:9090"], "grafana": ["127.0.0.1:3000:3000"],
                         "node_exporter": [], "dcgm_exporter": []}
    versions = read_env_file()
    for name, service in services.items():
        assert "healthcheck" in service, name
        image = service["image"]
        assert image in versions.values() and re.search(r":v?\d+\.\d+", image) and ":latest" not in image, image
    # Every image variable it uses is set in docker/.env (and so explained in docker/VERSIONS.md).
    assert variables(MONITORING_COMPOSE.read_text()) <= set(versions)
    # No project name: with -f it joins the stage's project, so Prometheus resolves the stage's services.
    assert "name" not in yaml.safe_load(MONITORING_COMPOSE.read_text())


def test_mounted_files_exist_and_prometheus_scrapes_every_family():
    document = load_compose(MONITORING_COMPOSE)
    for service in document["services"].values():
        for mount in service.get("volumes", []):
            if mount["type"] == "bind" and mount["source"] != "/":
                assert (DOCKER / mount["source"]).exists(), mount["source"]
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert set(FAMILIES) <= set(jobs) and "machine" in jobs
    assert jobs["fastapi"] == ["fastapi_server:8000"] and jobs["triton"] == ["triton_server:8002"]
    assert jobs["ray"] == ["host.docker.internal:8080"] and "--metrics-export-port=8080" in (
        DOCKER / "docker-compose-ray-head.yaml").read_text()


def test_committed_grafana_files_are_the_generated_ones():
    for path, text in dashboard.files().items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run `make dashboard`"


def test_dashboard_reads_back_through_the_sdk_with_a_row_per_family():
    committed = json.loads((DOCKER / "grafana" / "dashboards" / "servelab.json").read_text())
    model = Dashboard.from_json(committed)
    assert json.loads(json.dumps(model, cls=JSONEncoder)) == committed  # nothing the SDK does not know
    rows = [p for p in model.panels if isinstance(p, RowPanel)]
    panels = [p for p in model.panels if isinstance(p, Panel)]
    assert [r.title.split()[0] for r in rows] == ["FastAPI", "Triton", "Ray", "Machine"]
    ids = [p.id_val for p in model.panels]
    assert len(set(ids)) == len(ids) and all(ids)  # unique panel ids
    assert all(p.datasource.uid == "prometheus" and p.targets for p in panels)
    exprs = [t["expr"] for p in committed["panels"] for t in p.get("targets", [])]
    for metric in ("servelab_http_requests_total", "servelab_queue_seconds_sum", "servelab_batch_size_sum",
                   "nv_inference_queue_duration_us", "nv_inference_exec_count", "node_cpu_seconds_total",
                   "DCGM_FI_DEV_GPU_UTIL"):
        assert any(metric in e for e in exprs), metric
    # The data source the dashboard names is the one provisioned.
    provisioned = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert provisioned["datasources"][0]["uid"] == "prometheus"
    assert provisioned["datasources"][0]["url"] == "http://prometheus:9090"
