# The two commands of the README: `make serve` and `make test`. Both set everything up.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve test test-long lint export bench install tools image image-gpu wheelhouse gpu-check

# Python writes the project's bytecode the first time it imports a module, even where the
# environment says not to (PYTHONDONTWRITEBYTECODE): otherwise every process (each test worker,
# every server a test starts) compiles the service again, and pytest rewrites every test module
# again.
unexport PYTHONDONTWRITEBYTECODE

# pip byte-compiles what it installs one file at a time (16,000 modules: a minute and a half of one
# core); compileall does the same on every core. Like pip, it passes over a file that does not
# compile (torch ships one written for Python 3.12), hence `|| true`. Compiled on first import
# instead, the test workers' collection, mypy and the first servers compile at once on two cores:
# no faster on a clean clone, and a server's first request may compile for seconds.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[export,dev,bench]'
	$(PY) -m compileall -qq -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') || true
	touch $@

install: $(STAMP)

## Tools of the deployment checks: promtool/prometheus, docker-compose (Debian), hadolint, kubectl.
tools: $(STAMP)
	VENV=$(VENV) bash .ci/install-tools.sh

## Serve the default models (exports the ONNX artefacts first if they are missing).
serve: $(STAMP)
	$(PY) -m service

## Lint, type-check and run the test suite (what CI runs) on TEST_WORKERS pytest-xdist workers,
## each test file on one worker (tests/conftest.py); the 20 slowest steps are listed at the end.
## mypy runs beside the tools' installation and the tests, its report after theirs: on its own it
## held one core for a minute and a half of a clean clone while the other idled, and the tools'
## installation mostly waits on downloads. Any step failing fails the target. schemathesis' pytest
## plugin goes unused (tests/reliability/test_fuzz.py drives schemathesis itself) and would be
## imported by every pytest process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/mypy >$(VENV)/mypy.log 2>&1 & mypy=$$!; \
	VENV=$(VENV) bash .ci/install-tools.sh \
	&& $(VENV)/bin/ruff check service export tests benchmarks \
	&& $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 -p no:schemathesis; \
	tests=$$?; wait $$mypy; typed=$$?; echo "$(VENV)/bin/mypy"; cat $(VENV)/mypy.log; \
	[ $$tests -eq 0 ] && [ $$typed -eq 0 ]

## Long reliability tests: full fuzzing, overload, soak.
test-long: $(STAMP)
	$(PY) -m pytest -m long -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check service export tests benchmarks
	$(VENV)/bin/ruff format --check service export tests benchmarks
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

## Container images (docker where an engine answers, else podman/buildah): docker/build.sh.
image:
	bash docker/build.sh cpu

image-gpu:
	bash docker/build.sh gpu

## Export the default models in every variant (fp32, int8, fp16) into .artefacts/.
export: $(STAMP)
	$(PY) -m export default --out .artefacts --variant all

## DATA: a folder with multi30k/ and stsb/sts-dev.csv (e.g. make bench DATA=path/to/data).
bench: $(STAMP)
	$(PY) -m benchmarks --quick --data-dir $(or $(DATA),$(error set DATA=DIR holding multi30k/ and stsb/))

## The GPU check (docs/gpu-check.md). `make wheelhouse PY=3.12` (where there is network): the wheels a
## GPU host of CPython 3.12 needs, in .wheelhouse/py3.12/, and the same cut into parts to carry there;
## LEAVE_OUT=FILE: without the wheels of the projects the host is known to have (scripts/gpu-host-packages.txt).
wheelhouse:
	$(if $(filter 3.%,$(PY)),,$(error set PY to the GPU host's Python version, e.g. make wheelhouse PY=3.12))
	bash scripts/wheelhouse.sh build $(PY) .wheelhouse/py$(PY)
	bash scripts/wheelhouse.sh split .wheelhouse/py$(PY) .wheelhouse/py$(PY)-parts 28 $(LEAVE_OUT)

## On the GPU host, with its own python3 (torch, CUDA 13 libraries): installs what it lacks from the
## wheelhouse (default: .wheelhouse/py<its version>, or its parts), exports, tests, serves and measures
## on CUDA; results in OUT. GPU_CHECK_ARGS: e.g. `--provider cpu --quick` (the same run on the CPU, small).
gpu-check:
	$(PYTHON) -m benchmarks.gpu.check --data-dir $(or $(DATA),$(error set DATA=DIR holding multi30k/ and stsb/)) \
		--out $(or $(OUT),.gpu-check/results) $(if $(WHEELHOUSE),--wheelhouse $(WHEELHOUSE)) $(GPU_CHECK_ARGS)
