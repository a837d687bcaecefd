# The two commands: `make lab` (the local lab) and `make test` (every test). Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-install only when the declared dependencies change, so a second run is quick.
STAMP := $(VENV)/.installed

.PHONY: lab test models notebooks bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and alone: with its version pinned, pip takes the local CPU build where one is provided.
	$(BIN)/pip install --quiet -c constraints.txt torch
	$(BIN)/pip install --quiet -c constraints.txt -e '.[all]'
	touch $@

lab: $(STAMP)
	$(BIN)/servelab lab

test: $(STAMP)
	$(BIN)/python -m pytest

models: $(STAMP)
	$(BIN)/servelab models build

notebooks: $(STAMP)
	$(BIN)/python -m servelab.notebooks

bench: $(STAMP)
	$(BIN)/servelab benchmark

clean:
	rm -rf $(VENV) models results .servelab
