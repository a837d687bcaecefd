# The two commands: `make lab` (the local lab) and `make test` (every test). Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-install only when the declared dependencies change, so a second run is quick.
STAMP := $(VENV)/.installed

.PHONY: lab test models notebooks bench perf-analyzer containers-up containers-down clean

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

lab: $(STAMP)
	@$(PERF_ANALYZER)
	$(BIN)/servelab lab

test: $(STAMP)
	@$(PERF_ANALYZER)
	$(BIN)/python -m pytest

perf-analyzer: $(STAMP)
	$(BIN)/servelab perf-analyzer install --if-missing

models: $(STAMP)
	$(BIN)/servelab models build

notebooks: $(STAMP)
	$(BIN)/python -m servelab.notebooks

bench: $(STAMP)
	$(BIN)/servelab benchmark

# A lab stage from its compose file on a private Docker engine (root, docker.io, debootstrap; no GPU):
# `make containers-up STAGE=fastapi-onnx`; `make containers-down STAGE=...` also stops the engine.
STAGE ?= fastapi-pt
containers-up: $(STAMP)
	$(BIN)/servelab containers up --stage $(STAGE)

containers-down: $(STAMP)
	$(BIN)/servelab containers down --stage $(STAGE)
	$(BIN)/servelab containers stop

clean:
	rm -rf $(VENV) models results .servelab
