"""The Grafana dashboard, as code (Grafana's Foundation SDK): a row per stage family, each panel one PromQL
expression. ``python -m servelab.measure.monitoring.dashboard`` (``make dashboard``) writes ``docker/grafana``'s
files; a test keeps them equal to what this writes.
"""

import json
from itertools import count
from pathlib import Path

from grafana_foundation_sdk.builders import common, dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as models
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos

from servelab.core.catalogue import RAY
from servelab.core.family import FASTAPI_PREDICT
from servelab.core.paths import REPO_ROOT

GRAFANA_DIR = REPO_ROOT / "docker" / "grafana"
DASHBOARD_UID = "servelab"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="prometheus")
W = "$__rate_interval"


def _per(job: str, by: str, num: str, den: str | None = None) -> str:
    """A counter's rate over another's (by default a ``_sum`` over its ``_count``: a mean per request), per ``by``."""
    num, den = (num, den) if den else (f"{num}_sum", f"{num}_count")
    return f'sum by ({by}) (rate({num}{{job="{job}"}}[{W}])) / sum by ({by}) (rate({den}{{job="{job}"}}[{W}]))'

# Row title -> panels: (title, unit, [(PromQL, legend)]). Panels that compare stages split by stage/model.
ROWS: dict[str, list[tuple[str, str, list[tuple[str, str]]]]] = {
    "FastAPI stages (fastapi-pt, fastapi-onnx, ...)": [
        ("Requests per second", "reqps", [
            (f'sum by (stage, status) (rate(servelab_http_requests_total{{job="fastapi",{FASTAPI_PREDICT}}}[{W}]))',
             "{{stage}} {{status}}")]),
        ("Latency p50 / p99 (server side)", "s", [
            (f'histogram_quantile(0.5, sum by (stage, le) (rate(servelab_http_request_duration_seconds_bucket'
             f'{{job="fastapi",{FASTAPI_PREDICT}}}[{W}])))', "{{stage}} p50"),
            (f'histogram_quantile(0.99, sum by (stage, le) (rate(servelab_http_request_duration_seconds_bucket'
             f'{{job="fastapi",{FASTAPI_PREDICT}}}[{W}])))', "{{stage}} p99")]),
        ("Queue vs compute per request", "s", [
            (_per("fastapi", "stage", "servelab_queue_seconds"), "{{stage}} queue"),
            (_per("fastapi", "stage", "servelab_preprocess_seconds"), "{{stage}} preprocess"),
            (_per("fastapi", "stage", "servelab_inference_seconds"), "{{stage}} inference call")]),
        ("Mean batch size / requests in progress", "short", [
            (_per("fastapi", "stage", "servelab_batch_size"), "{{stage}} mean batch"),
            ('sum by (stage) (servelab_http_requests_in_progress{job="fastapi"})', "{{stage}} in progress")]),
    ],
    "Triton stages (pt-*, onnx-*, ensemble)": [
        ("Inference requests per second", "reqps", [
            (f'sum by (model) (rate(nv_inference_request_success{{job="triton"}}[{W}]))', "{{model}} ok"),
            (f'sum by (model) (rate(nv_inference_request_failure{{job="triton"}}[{W}]))', "{{model}} failed")]),
        ("Mean request latency (Triton exports sums, not histograms)", "µs", [
            (_per("triton", "model", "nv_inference_request_duration_us", "nv_inference_request_success"),
             "{{model}}")]),
        ("Queue vs compute per request", "µs", [
            (_per("triton", "model", "nv_inference_queue_duration_us", "nv_inference_request_success"),
             "{{model}} queue"),
            (f'(sum by (model) (rate(nv_inference_compute_input_duration_us{{job="triton"}}[{W}])) + '
             f'sum by (model) (rate(nv_inference_compute_infer_duration_us{{job="triton"}}[{W}])) + '
             f'sum by (model) (rate(nv_inference_compute_output_duration_us{{job="triton"}}[{W}]))) / '
             f'sum by (model) (rate(nv_inference_request_success{{job="triton"}}[{W}]))', "{{model}} compute")]),
        ("Mean batch size (images per execution)", "short", [
            (_per("triton", "model", "nv_inference_count", "nv_inference_exec_count"), "{{model}}")]),
    ],
    "Ray Serve stages (ray-*; each node's metrics agent)": [
        ("HTTP requests per second (proxy)", "reqps", [
            (f'sum by (status_code) (rate(ray_serve_num_http_requests_total{{job="ray",{FASTAPI_PREDICT}}}[{W}]))',
             "{{status_code}}")]),
        ("Latency p50 / p99 (proxy)", "ms", [
            (f'histogram_quantile(0.5, sum by (le) (rate(ray_serve_http_request_latency_ms_bucket'
             f'{{job="ray",{FASTAPI_PREDICT}}}[{W}])))', "p50"),
            (f'histogram_quantile(0.99, sum by (le) (rate(ray_serve_http_request_latency_ms_bucket'
             f'{{job="ray",{FASTAPI_PREDICT}}}[{W}])))', "p99")]),
        ("Replica processing time per request", "ms", [
            (_per("ray", "replica", "ray_serve_deployment_processing_latency_ms"), "{{replica}}")]),
        ("Healthy replicas / mean @serve.batch size", "short", [
            (RAY.queries.series["running replicas"], "healthy replicas"),
            (f'sum(rate(ray_serve_actual_batch_size_sum{{job="ray"}}[{W}])) / '
             f'sum(rate(ray_serve_actual_batch_size_count{{job="ray"}}[{W}]))', "mean batch")]),
    ],
    "Machine (node exporter, dcgm-exporter; locally servelab's psutil exporter)": [
        ("CPU busy", "percent", [
            (f'100 * (1 - avg by (instance) (rate(node_cpu_seconds_total{{mode="idle"}}[{W}])))', "{{instance}}")]),
        ("Memory used", "bytes", [
            ("node_memory_MemTotal_bytes - node_memory_MemAvailable_bytes", "{{instance}}")]),
        ("GPU utilization", "percent", [("DCGM_FI_DEV_GPU_UTIL", "GPU {{gpu}} {{modelName}}")]),
        ("GPU memory used", "decmbytes", [("DCGM_FI_DEV_FB_USED", "GPU {{gpu}} {{modelName}}")]),
    ],
}


def _panel(ident: int, title: str, unit: str, queries: list[tuple[str, str]], x: int, y: int) -> timeseries.Panel:
    panel = (timeseries.Panel().id(ident).title(title).unit(unit).datasource(DATASOURCE)
             .grid_pos(GridPos(h=8, w=12, x=x, y=y)).line_width(1).fill_opacity(10).show_points(models.VisibilityMode.NEVER)
             .legend(common.VizLegendOptions().show_legend(True).display_mode(models.LegendDisplayMode.LIST)
                     .placement(models.LegendPlacement.BOTTOM))
             .tooltip(common.VizTooltipOptions().mode(models.TooltipDisplayMode.MULTI).sort(models.SortOrder.NONE)))
    for ref, (expr, legend) in zip("ABCDEFGH", queries):
        panel.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE))
    return panel


def build() -> dict:
    """The dashboard as Grafana's JSON model."""
    board = (dashboard.Dashboard("servelab: every stage, live").uid(DASHBOARD_UID)
             .tags(["servelab", "serving"]).refresh("5s").time("now-15m", "now").timezone("browser")
             .description("What to watch while measuring: request rate, latency, queue vs compute, batch size "
                          "and utilization, one row per stage family. Generated by servelab.measure.monitoring.dashboard."))
    y, ident = 0, count(1)  # rows and panels numbered together, in order
    for title, panels in ROWS.items():
        board.with_row(dashboard.Row(title).id(next(ident)).grid_pos(GridPos(h=1, w=24, x=0, y=y)))
        y += 1
        for i, (name, unit, queries) in enumerate(panels):
            board.with_panel(_panel(next(ident), name, unit, queries, 12 * (i % 2), y + 8 * (i // 2)))
        y += 8 * ((len(panels) + 1) // 2)
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


DATASOURCES_YAML = """\
# Generated by `python -m servelab.measure.monitoring.dashboard`: Grafana's Prometheus data source.
apiVersion: 1
datasources:
  - name: Prometheus
    uid: prometheus
    type: prometheus
    access: proxy
    url: http://prometheus:9090
    isDefault: true
    editable: false
"""

DASHBOARDS_YAML = """\
# Generated by `python -m servelab.measure.monitoring.dashboard`: load the dashboards in this folder.
apiVersion: 1
providers:
  - name: servelab
    type: file
    disableDeletion: true
    allowUiUpdates: false
    options:
      path: /var/lib/grafana/dashboards
"""


def files() -> dict[Path, str]:
    """Every generated file under docker/grafana, by path."""
    return {
        GRAFANA_DIR / "dashboards" / "servelab.json": json.dumps(build(), indent=2, sort_keys=True) + "\n",
        GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yaml": DATASOURCES_YAML,
        GRAFANA_DIR / "provisioning" / "dashboards" / "servelab.yaml": DASHBOARDS_YAML,
    }


if __name__ == "__main__":
    for path, text in files().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(REPO_ROOT)}")
