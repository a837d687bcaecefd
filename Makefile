# The two commands: `make lab` (the local lab) and `make test` (every test). Both set up .venv first.
# `make check`: the unit tier alone (tests/unit, under 2 minutes), for a quick answer while changing code.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-install only when the declared dependencies change, so a second run is quick.
STAMP := $(VENV)/.installed
# The GPU path's environment (docs/gpu/README.md) and how a GPU is recognised.
GPU_PYTHON ?= python3
GPU_VENV := .venv-gpu
GPU_STAMP := $(GPU_VENV)/.installed
HAS_GPU = nvidia-smi -L 2>/dev/null | grep -q '^GPU '

.PHONY: lab lab-full test check rehearse models notebooks benchmark perf-analyzer prometheus redis dashboard containers-up containers-down images images-push images-save clean gpu-check gpu-wheelhouse gpu-carry gpu-wheelhouse-join gpu-constraints-check

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and alone: with its version pinned, pip takes the local CPU build where one is provided.
	$(BIN)/pip install --quiet -c constraints.txt torch
	$(BIN)/pip install --quiet -c constraints.txt -e '.[all]'
	touch $@

# perf_analyzer (pinned, extracted into .venv/opt) is soft for both: without it the lab records its
# runs as failed with the reason, and its tests skip, except in CI, where they must run. Prometheus
# (Debian's 2.42, unpacked into .venv/opt) is soft the same way: without it the lab goes on unscraped
# and says so in its log and report. redis-server (Debian's 7.0, unpacked into .venv/opt the same way) serves the
# response cache: without it the cache stage is skipped, and so are its tests but in CI. $(1): the environment's bin folder.
SOFT_TOOLS = { $(1)/servelab perf-analyzer install --if-missing || echo "perf_analyzer: not installed (see above); going on without it"; }; \
	{ $(1)/servelab prometheus install --if-missing || echo "prometheus: not installed (see above); going on without it"; }; \
	{ $(1)/servelab redis install --if-missing || echo "redis: not installed; cache stage skipped"; }

# `make lab` runs from .venv-gpu (below) on a machine whose nvidia-smi lists a GPU and whose GPU_PYTHON has a
# CUDA PyTorch, everywhere else from .venv. Decided when make reads this file (no recursive make in the recipe,
# so `make -n lab` only prints).
GPU_READY = $(HAS_GPU) && $(GPU_PYTHON) -c 'import sys, torch; sys.exit(not torch.version.cuda)' 2>/dev/null
LAB_VENV := $(shell $(GPU_READY) && echo $(GPU_VENV) || echo $(VENV))

# `make lab` is the tour (each lesson once, minutes); `make lab-full` every stage with every load and both clients.
lab: $(LAB_VENV)/.installed
	@$(OFFLINE); $(call SOFT_TOOLS,$(LAB_VENV)/bin)
	$(LAB_VENV)/bin/servelab lab

lab-full: $(LAB_VENV)/.installed
	@$(OFFLINE); $(call SOFT_TOOLS,$(LAB_VENV)/bin)
	$(LAB_VENV)/bin/servelab lab --full

# pytest-xdist workers, each taking a whole file at a time, longest first (tests/conftest.py, docs/testing.md);
# 0 runs the suite in one process. On 2 CPUs one process is the default: with 2 or 4 workers the suite is
# CPU-bound: the quick lab beside them ran past its time limit (docs/records/make-test-xdist-2cpu.log).
TEST_WORKERS ?= 0
test: $(STAMP)
	@$(call SOFT_TOOLS,$(BIN))
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The dress rehearsal alone (`make test` runs it too, in tests/e2e): the node path played in order on a fresh clone,
# on a private Docker engine (root, docker.io, debootstrap); its step times go to docs/records/rehearsal-2cpu.*.
rehearse: $(STAMP)
	REHEARSAL_RECORD=1 $(BIN)/python -m pytest tests/e2e/test_rehearsal.py

# The unit tier alone (tests/unit), under 2 minutes on 2 CPUs; `make test` runs every tier (docs/testing.md).
check: $(STAMP)
	$(BIN)/python -m pytest tests/unit

perf-analyzer: $(STAMP)
	$(BIN)/servelab perf-analyzer install --if-missing

prometheus: $(STAMP)
	$(BIN)/servelab prometheus install --if-missing

redis: $(STAMP)
	$(BIN)/servelab redis install --if-missing

# The Grafana dashboard and provisioning files under docker/grafana, generated from servelab.measure.monitoring.dashboard.
dashboard: $(STAMP)
	$(BIN)/python -m servelab.measure.monitoring.dashboard

models: $(STAMP)
	$(BIN)/servelab models build

notebooks: $(STAMP)
	$(BIN)/python -m servelab.tools.render_notebooks

benchmark: $(STAMP)
	$(BIN)/servelab benchmark

# A lab stage from its compose file on a private Docker engine (root, docker.io, debootstrap; no GPU):
# `make containers-up STAGE=fastapi-onnx`; `make containers-down STAGE=...` also stops the engine.
STAGE ?= fastapi-pt
containers-up: $(STAMP)
	$(BIN)/servelab containers up --stage $(STAGE)

containers-down: $(STAMP)
	$(BIN)/servelab containers down --stage $(STAGE)
	$(BIN)/servelab containers stop

# Every image of docker-bake.hcl, on a machine with Docker and buildx (no GPU needed), before the term
# (docs/instructors.md): `make images`, `make images-push REGISTRY=registry.example.edu/servelab`, or
# `make images-save` for a class without a registry (one archive; copied to a node's ~/servelab-images.tar, bin/node-setup loads it). The tag is
# this commit's (`servelab containers tag`, a hash of what the images are made of): students of any commit with
# the same image inputs pull exactly these images.
REGISTRY ?=
IMAGES_ARCHIVE ?= servelab-images.tar
# docker/.env's values where the shell exports none (as Compose and bin/node-setup read it): a shell's own, such as
# the stand-in bases `make rehearse` exports, are kept.
IMAGES_ENV = eval "$$(sed -nE 's/^([A-Z_]+)=(.*)$$/export \1="$${\1-\2}"/p' docker/.env)" \
	&& eval "$$($(BIN)/servelab containers tag)" \
	$(if $(REGISTRY),&& export SERVELAB_REGISTRY=$(REGISTRY))
images: $(STAMP)
	$(IMAGES_ENV) && docker buildx bake

images-push: $(STAMP)
	@[ -n "$(REGISTRY)" ] || { echo "images-push: name the registry, e.g. REGISTRY=registry.example.edu/servelab"; exit 1; }
	$(IMAGES_ENV) && docker buildx bake --push

images-save: images
	$(IMAGES_ENV) && docker buildx bake --print 2>/dev/null \
		| $(BIN)/python -c 'import json, sys; print(*(t for v in json.load(sys.stdin)["target"].values() for t in v["tags"]))' \
		| xargs docker save -o $(IMAGES_ARCHIVE)

clean:
	rm -rf $(VENV) $(GPU_VENV) models results .servelab

# --- The GPU path (docs/gpu/README.md) -------------------------------------------------------------------
# A machine with an NVIDIA GPU and a CUDA PyTorch preinstalled (GPU_PYTHON's: the system Python or a virtual
# environment), perhaps without network: .venv-gpu sees that torch and gets the rest from GPU_CONSTRAINTS, out of
# GPU_WHEELHOUSE where that folder exists (made by `make gpu-wheelhouse` on a networked machine).
GPU_CONSTRAINTS ?= constraints-gpu-cu13.txt
GPU_WHEELHOUSE ?= wheelhouse/gpu-cu13
GPU_EXTRA ?= gpu
GPU_TARGET := --only-binary=:all: --implementation cp --python-version 3.12 --abi cp312 \
	--platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64
# Debian packages the tools need on a machine without network: perf_analyzer's libb64, Prometheus.
GPU_DEBS := libb64-0d prometheus
# perf_analyzer's two pinned wheels, name==version (its installer extracts files from them; pip never installs them).
PA_WHEELS = $$($(BIN)/python -c 'from servelab.core.installers.perf_analyzer_install import PINS; print(*(f"{p.package}=={p.version}" for p in PINS))')
# Taking the wheelhouse to a GPU machine in calls of limited size (servelab/tools/gpu_carry.py): folders of at most
# CARRY_SIZE under GPU_CARRY; CARRY_IN is where the GPU machine's calls copied them.
CARRY_SIZE ?= 50M
GPU_CARRY ?= carry/gpu-cu13
CARRY_IN ?= /tmp/carry
HAVE ?=
GPU_CARRY_PY = servelab/tools/gpu_carry.py
# Where the installers look first (servelab.core.installers.opt_tools.wheelhouse); pip too, and only there.
OFFLINE = if [ -d $(GPU_WHEELHOUSE) ]; then export SERVELAB_WHEELHOUSE=$(abspath $(GPU_WHEELHOUSE)) \
	PIP_NO_INDEX=1 PIP_FIND_LINKS=$(abspath $(GPU_WHEELHOUSE)); fi

gpu-check:
	@if ! $(HAS_GPU); then echo "gpu-check: no NVIDIA GPU (nvidia-smi lists none): nothing to check on this machine"; exit 0; fi; \
	$(MAKE) --no-print-directory $(GPU_STAMP) || exit 1; \
	$(OFFLINE); \
	$(call SOFT_TOOLS,$(GPU_VENV)/bin); \
	$(GPU_VENV)/bin/servelab gpu-check $(GPU_CHECK_ARGS)

# GPU_PYTHON may itself be a virtual environment: a venv made from it sees the *base* interpreter's packages,
# not its own, so GPU_PYTHON's site folders go into a .pth (after .venv-gpu's own, before the base's). pip then
# takes torch as installed and checks its requirements against GPU_CONSTRAINTS; pip installs nothing outside .venv-gpu.
$(GPU_STAMP): pyproject.toml $(GPU_CONSTRAINTS)
	@$(GPU_PYTHON) -c 'import torch; assert torch.version.cuda, "a CPU build"; print("using the preinstalled torch", torch.__version__, "CUDA", torch.version.cuda, "from", torch.__file__)' \
		|| { echo "$(GPU_PYTHON) has no CUDA PyTorch: install one, or set GPU_PYTHON to the Python that has it"; exit 1; }
	rm -rf $(GPU_VENV)
	$(GPU_PYTHON) -m venv --system-site-packages $(GPU_VENV)
	$(GPU_PYTHON) $(GPU_CARRY_PY) sites > "$$($(GPU_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/gpu-python.pth"
	if [ -d $(GPU_WHEELHOUSE) ]; then $(GPU_PYTHON) $(GPU_CARRY_PY) check $(GPU_WHEELHOUSE); fi
	$(GPU_VENV)/bin/python -m pip install $$([ -d $(GPU_WHEELHOUSE) ] && echo --no-index --find-links $(GPU_WHEELHOUSE)) \
		-c $(GPU_CONSTRAINTS) -e '.[$(GPU_EXTRA)]'
	$(GPU_VENV)/bin/python -c 'import torch; assert torch.version.cuda, torch.__file__; print("$(GPU_VENV): torch", torch.__version__, "CUDA", torch.version.cuda)'
	touch $@

# On a networked machine: every wheel .venv-gpu needs (GPU_CONSTRAINTS, for CPython 3.12 on x86-64 Linux),
# perf_analyzer's two pinned wheels and the GPU_DEBS, whole, with SHA256SUMS.
gpu-wheelhouse: $(STAMP)
	rm -rf $(GPU_WHEELHOUSE) && mkdir -p $(GPU_WHEELHOUSE)
	PIP_CONSTRAINT= $(BIN)/pip download --quiet --no-deps $(GPU_TARGET) -d $(GPU_WHEELHOUSE) -r $(GPU_CONSTRAINTS)
	PIP_CONSTRAINT= $(BIN)/pip download --quiet --no-deps --only-binary=:all: -d $(GPU_WHEELHOUSE) $(PA_WHEELS)
	cd $(GPU_WHEELHOUSE) && apt-get download $(GPU_DEBS)
	cd $(GPU_WHEELHOUSE) && sha256sum *.whl *.deb > SHA256SUMS
	@du -sh $(GPU_WHEELHOUSE); ls $(GPU_WHEELHOUSE) | wc -l

# On a networked machine: the wheelhouse as folders GPU_CARRY/00, 01, ... of at most CARRY_SIZE, one per call to the
# GPU machine. HAVE=<preflight list> leaves out the wheels GPU_PYTHON there has in exactly that version (pip takes
# them as installed), except setuptools (pip builds the editable install in an isolated environment, which
# installs it from the wheelhouse) and perf_analyzer's wheels (files its installer takes out).
gpu-carry: $(STAMP)
	@[ -f $(GPU_WHEELHOUSE)/SHA256SUMS ] || $(MAKE) --no-print-directory gpu-wheelhouse
	$(BIN)/python $(GPU_CARRY_PY) pack $(GPU_WHEELHOUSE) $(GPU_CARRY) --size $(CARRY_SIZE) \
		$(if $(HAVE),--have $(HAVE)) --keep setuptools $(PA_WHEELS)

# On the GPU machine, after each call copied its folder into CARRY_IN: every part checked, whole files again in
# GPU_WHEELHOUSE, checked, with a SHA256SUMS of those there.
gpu-wheelhouse-join:
	$(GPU_PYTHON) $(GPU_CARRY_PY) join $(CARRY_IN) $(GPU_WHEELHOUSE)

# On a networked machine: GPU_CONSTRAINTS against the real requirements of each torch its header names.
gpu-constraints-check: $(STAMP)
	$(BIN)/python -m servelab.tools.gpu_constraints $(GPU_CONSTRAINTS)
