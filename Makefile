# The two commands of the README:
#   make lab    create .venv, install, run the lab on its embedded CPU default
#   make test   create/update .venv, install everything the tests need, run the whole suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP_MAIN := $(VENV)/.rlkit-main
STAMP_TEST := $(VENV)/.rlkit-test
LAB_ARGS ?=
PYTEST_ARGS ?=

NB_ARGS ?=

.PHONY: lab test setup setup-test notebooks clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip==26.3

setup: $(STAMP_MAIN)
$(STAMP_MAIN): $(BIN)/python requirements.txt constraints.txt pyproject.toml
	$(PIP) install -q -r requirements.txt -c constraints.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	touch $@

setup-test: $(STAMP_TEST)
$(STAMP_TEST): $(STAMP_MAIN) requirements-test.txt requirements-vllm.txt
	$(PIP) install -q -r requirements-test.txt -r requirements-vllm.txt -c constraints.txt
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	@command -v chromium >/dev/null 2>&1 || { echo "installing Debian chromium for the browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null; }
	touch $@

lab: setup
	$(BIN)/rlkit lab $(LAB_ARGS)

test: setup-test
	@$(BIN)/python -m rlkit.hardware  # where the suite runs: CPU model, ISA, torch's BLAS, numpy's OpenBLAS core
	$(BIN)/python -m pytest $(PYTEST_ARGS)

notebooks: setup
	$(BIN)/jupyter lab --notebook-dir=notebooks --ip=127.0.0.1 --no-browser $(if $(filter 0,$(shell id -u)),--allow-root) $(NB_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
