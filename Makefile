# The two commands of the README. Both set up .venv/ first (once per change of
# pyproject.toml), so they work on a fresh clone.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test
demo: $(STAMP)
	$(VENV)/bin/xla-streams demo

test: $(STAMP) chromium
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m pytest -q

# Headless Chromium renders the HTML report in a test (Debian's package; CI runs as root).
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test,gpu-aot]'
	touch $@
