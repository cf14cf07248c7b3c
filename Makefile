# drivebench: `make run` and `make test` do all set-up on a fresh machine (a venv in .venv).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
ARGS   ?=

.PHONY: setup run test notebooks openmmlab clean-cache

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed  ## create .venv and install drivebench with its test extras

run: setup                 ## the main job: a bounded QCNet benchmark on the embedded dataset
	$(PY) -m drivebench model=qcnet accel=max $(ARGS)

# -n auto: one pytest-xdist worker per usable core (tests/conftest.py); --dist loadfile: a file's tests stay on
# one worker, so each module fixture (a shared CLI run) runs once; the longest files go first (tests/xdist_order.py).
# ARGS="-n 0" runs in this process (pdb).
test: setup                ## the test suite (CPU only; what .ci/run calls)
	$(PY) -m pytest -q -n auto --dist loadfile $(ARGS)

$(VENV)/.notebooks: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[notebooks]"
	touch $@

notebooks: $(VENV)/.notebooks  ## JupyterLab on notebooks/ (installs it the first time); RUNS=<folders> sets DRIVEBENCH_RUNS
	PWD=$(CURDIR) $(if $(RUNS),DRIVEBENCH_RUNS=$(RUNS) )$(VENV)/bin/jupyter lab notebooks/ $(ARGS)

openmmlab: setup           ## model=mmdet3d / bench=mmengine: build mmcv once (cached), install the OpenMMLab stack
	$(PY) -m drivebench.openmmlab.install

clean-cache:               ## delete generated datasets and preprocessing caches
	rm -rf $${DRIVEBENCH_CACHE:-$$HOME/.cache/drivebench}
