"""``10_ray``: the Ray Serve stages, deployed from the head's shell, measured as ``4_fastapi`` measures FastAPI's
(the app answers the same HTTP API). Its ``/ready`` names the stage (``STAGE_KEY``), so that a measurement is
never recorded under the wrong stage while a deployment still rolls out."""

from dataclasses import dataclass, field
from pathlib import Path

import requests

from servelab.measure.records import Load, Record
from servelab.report.render import markdown_table, render_report
from servelab.run.walkthrough.common import wait_until
from servelab.run.walkthrough.walk_fastapi import FastAPIWalkthrough, ServingStage, queueing

# The field of the Ray Serve app's /ready answer that names the deployed stage.
STAGE_KEY = "stage"


def deployed_stage(url: str) -> str:
    """The stage the Ray Serve app at ``url`` says it runs, or why it does not say (yet)."""
    try:
        answer = requests.get(f"{url}/ready", timeout=5)
    except requests.RequestException as exc:
        return f"no answer ({type(exc).__name__})"
    if answer.status_code != 200:
        return f"not ready (HTTP {answer.status_code})"
    try:
        return str(answer.json()[STAGE_KEY])
    except (ValueError, KeyError, TypeError):
        return f"ready, but its /ready names no {STAGE_KEY!r}"


@dataclass
class RayWalkthrough(FastAPIWalkthrough):
    """``4_fastapi``'s steps for the Ray Serve stages in ``stages`` (the others skipped, saying so)."""

    stages: list[str] = field(default_factory=list)
    by_stage: dict[str, list[Record]] = field(default_factory=dict)

    def wait_for_stage(self, stage: str) -> ServingStage:
        """Wait until the app at the stage's URL runs ``stage`` and is ready, and show what it runs on."""
        url = self.stage_urls.get(stage, self.url)
        wait_until(f"Ray Serve stage {stage} at {url}", lambda: deployed_stage(url), stage, wait_s=self.wait_s)
        ready = requests.get(f"{url}/ready", timeout=5).json()
        print(f"{stage}: {url} runs {ready.get('service')}, model {ready.get('model')}")
        return ServingStage(stage, url, ready)

    async def stage(self, stage: str, alone: Load, busy: Load) -> list[Record]:
        """Measure ``stage`` one request at a time and under ``busy``, then put the two side by side."""
        if stage not in self.stages:
            print(f"skipped: {stage} is not in STAGES")
            return []
        service = self.wait_for_stage(stage)
        records = [await self.measure(service, alone), await self.measure(service, busy)]
        print(queueing(*records))
        self.by_stage[stage] = records
        return records

    def report(self, folder: Path) -> str:
        """Write ``folder/report.md`` over this notebook's runs; the comparison table as Markdown."""
        if not self.runs:
            return "no runs: every stage was skipped"
        render_report(self.runs, folder, sources=[self.records_file])
        return markdown_table(self.runs)
