# The two commands: `make lab` (the local lab) and `make test` (every test). Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-install only when the declared dependencies change, so a second run is quick.
STAMP := $(VENV)/.installed

.PHONY: lab test models notebooks bench perf-analyzer prometheus dashboard clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and alone: with its version pinned, pip takes the local CPU build where one is provided.
	$(BIN)/pip install --quiet -c constraints.txt torch
	$(BIN)/pip install --quiet -c constraints.txt -e '.[all]'
	touch $@

# perf_analyzer (pinned, extracted into .venv/opt) is soft for both: without it the lab records its
# runs as failed with the reason, and its tests skip, except in CI, where they must run.
PERF_ANALYZER = $(BIN)/servelab perf-analyzer install --if-missing || echo "perf_analyzer: not installed (see above); going on without it"
# Prometheus (Debian's 2.42, unpacked into .venv/opt) is soft the same way: without it the lab goes on
# unscraped and says so in its log and report; its tests skip, except in CI.
PROMETHEUS = $(BIN)/servelab prometheus install --if-missing || echo "prometheus: not installed (see above); going on without it"

lab: $(STAMP)
	@$(PERF_ANALYZER)
	@$(PROMETHEUS)
	$(BIN)/servelab lab

test: $(STAMP)
	@$(PERF_ANALYZER)
	@$(PROMETHEUS)
	$(BIN)/python -m pytest

perf-analyzer: $(STAMP)
	$(BIN)/servelab perf-analyzer install --if-missing

prometheus: $(STAMP)
	$(BIN)/servelab prometheus install --if-missing

# The Grafana dashboard and provisioning files under docker/grafana, generated from servelab.monitoring.dashboard.
dashboard: $(STAMP)
	$(BIN)/python -m servelab.monitoring.dashboard

models: $(STAMP)
	$(BIN)/servelab models build

notebooks: $(STAMP)
	$(BIN)/python -m servelab.notebooks

bench: $(STAMP)
	$(BIN)/servelab benchmark

clean:
	rm -rf $(VENV) models results .servelab
