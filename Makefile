# The two commands: `make lab` (the local lab) and `make test` (every test). Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-install only when the declared dependencies change, so a second run is quick.
STAMP := $(VENV)/.installed

.PHONY: lab test models notebooks bench perf-analyzer clean gpu-check gpu-wheelhouse gpu-wheelhouse-join

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

# On a machine whose nvidia-smi lists a GPU and whose GPU_PYTHON has a CUDA PyTorch, the lab runs on the GPU
# from .venv-gpu (below); everywhere else on the CPU from .venv.
GPU_READY = $(HAS_GPU) && $(GPU_PYTHON) -c 'import sys, torch; sys.exit(not torch.version.cuda)' 2>/dev/null

lab:
	@if $(GPU_READY); then $(MAKE) --no-print-directory $(GPU_STAMP) && \
		{ $(GPU_VENV)/bin/servelab perf-analyzer install --if-missing || echo "perf_analyzer: not installed; going on without it"; } && \
		$(GPU_VENV)/bin/servelab lab; \
	else $(MAKE) --no-print-directory $(STAMP) && { $(PERF_ANALYZER); } && $(BIN)/servelab lab; fi

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

clean:
	rm -rf $(VENV) $(GPU_VENV) models results .servelab

# --- The GPU path (docs/gpu/README.md) -------------------------------------------------------------------
# A machine with an NVIDIA GPU and a CUDA PyTorch preinstalled (GPU_PYTHON's), perhaps without network:
# .venv-gpu sees that torch (--system-site-packages) and gets the rest from GPU_CONSTRAINTS, out of
# GPU_WHEELHOUSE where that folder exists (made by `make gpu-wheelhouse` on a networked machine).
GPU_PYTHON ?= python3
GPU_VENV := .venv-gpu
GPU_STAMP := $(GPU_VENV)/.installed
GPU_CONSTRAINTS ?= constraints-gpu-cu13.txt
GPU_WHEELHOUSE ?= wheelhouse/gpu-cu13
GPU_TARGET := --only-binary=:all: --implementation cp --python-version 3.12 --abi cp312 \
	--platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64
PART_SIZE := 50M
# Without a GPU: say so and stop before building anything.
HAS_GPU = nvidia-smi -L 2>/dev/null | grep -q '^GPU '

gpu-check:
	@if ! $(HAS_GPU); then echo "gpu-check: no NVIDIA GPU (nvidia-smi lists none): nothing to check on this machine"; exit 0; fi; \
	$(MAKE) --no-print-directory $(GPU_STAMP) || exit 1; \
	if [ -d $(GPU_WHEELHOUSE) ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=$(CURDIR)/$(GPU_WHEELHOUSE); fi; \
	$(GPU_VENV)/bin/servelab perf-analyzer install --if-missing || echo "perf_analyzer: not installed (see above); going on without it"; \
	$(GPU_VENV)/bin/servelab gpu-check $(GPU_CHECK_ARGS)

$(GPU_STAMP): pyproject.toml $(GPU_CONSTRAINTS)
	@$(GPU_PYTHON) -c 'import torch; assert torch.version.cuda, "a CPU build"; print("using the preinstalled torch", torch.__version__, "CUDA", torch.version.cuda)' \
		|| { echo "$(GPU_PYTHON) has no CUDA PyTorch: install one, or set GPU_PYTHON to the Python that has it"; exit 1; }
	$(GPU_PYTHON) -m venv --system-site-packages $(GPU_VENV)
	if [ -d $(GPU_WHEELHOUSE) ]; then $(MAKE) --no-print-directory gpu-wheelhouse-join; fi
	$(GPU_VENV)/bin/pip install $$([ -d $(GPU_WHEELHOUSE) ] && echo --no-index --find-links $(GPU_WHEELHOUSE)) \
		-c $(GPU_CONSTRAINTS) -e '.[gpu]'
	touch $@

# On a networked machine: every wheel .venv-gpu needs (GPU_CONSTRAINTS, for CPython 3.12 on x86-64 Linux) and
# perf_analyzer's two pinned wheels; wheels over 60 MiB are split into $(PART_SIZE) parts, SHA256SUMS lists whole wheels.
gpu-wheelhouse: $(STAMP)
	rm -rf $(GPU_WHEELHOUSE) && mkdir -p $(GPU_WHEELHOUSE)
	PIP_CONSTRAINT= $(BIN)/pip download --quiet --no-deps $(GPU_TARGET) -d $(GPU_WHEELHOUSE) -r $(GPU_CONSTRAINTS)
	PIP_CONSTRAINT= $(BIN)/pip download --quiet --no-deps --only-binary=:all: -d $(GPU_WHEELHOUSE) \
		$$($(BIN)/python -c 'from servelab.bench.perf_analyzer_binary import PINS; print(*(f"{p.package}=={p.version}" for p in PINS))')
	cd $(GPU_WHEELHOUSE) && sha256sum *.whl > SHA256SUMS && \
	for w in *.whl; do if [ $$(stat -c %s "$$w") -gt 62914560 ]; then split -b $(PART_SIZE) -d "$$w" "$$w.part-" && rm "$$w"; fi; done
	@du -sh $(GPU_WHEELHOUSE); ls $(GPU_WHEELHOUSE) | wc -l

# On the GPU machine, after copying the folder (or its parts) over: whole wheels again, checked.
gpu-wheelhouse-join:
	cd $(GPU_WHEELHOUSE) && for p in *.part-00; do [ -e "$$p" ] || continue; w="$${p%.part-00}"; \
		[ -e "$$w" ] || cat "$$w".part-* > "$$w"; done && sha256sum --check --quiet SHA256SUMS
