# The commands of the README: `make help` lists every target with what it does. Each
# sets up .venv/ first (once per change of pyproject.toml), so it works on a fresh clone.
#
# Python 3.12: `python3.12` where it runs as is, else through pyenv (3.12.1),
# else say how to choose one (make PYTHON=/path/to/python3.12).
PYTHON ?= $(shell for p in python3.12 python3; do \
    PYENV_VERSION=3.12.1 $$p -c 'import sys; assert sys.version_info[:2] == (3, 12); print(sys.executable)' \
    2>/dev/null && break; done)
VENV := .venv
STAMP := $(VENV)/.installed
# The oldest jax supported (the GPU image's), checked in its own venv: the plugin
# must start, and never hang, an unmodified program there too.
COMPAT_JAX := 0.11.2
COMPAT_VENV := .venv-jax$(COMPAT_JAX)
COMPAT_STAMP := $(COMPAT_VENV)/.installed
COMPAT_TESTS := unmodified_script or ffi_mode_from or bad_values_stop or strict_mode_from

.PHONY: help demo check test typecheck compat gpu-check-bare cuda-emulated chromium bazel-test ray-test python
.DEFAULT_GOAL := help

help:  ## list the targets and what each does
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## /  make \1\t/' | expand -t 22

demo: $(STAMP)  ## compile the demo step for 8 H100s without a GPU: its streams, what they buy, what tune would change
	$(VENV)/bin/xla-streams demo

# The fast tier: everything but the tests marked slow (pyproject.toml says what slow is).
check: $(STAMP)  ## ruff, mypy and the fast tests, the FileCheck goldens among them (about a minute)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(MAKE) --no-print-directory typecheck
	$(VENV)/bin/python -m pytest -q -m 'not slow' --ignore=$(EMULATED) --ignore=$(RAY_TEST)

test: $(STAMP) chromium compat bazel-test  ## everything: check's steps, the slow tests, jax 0.11.2, Bazel, the GPU check from a bare tree, the emulated CUDA runtime, Ray
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(MAKE) --no-print-directory typecheck
	$(VENV)/bin/python tools/gpu_check.py --dry-run $(VENV)/gpu_check_dry_run
	$(MAKE) --no-print-directory gpu-check-bare
	$(MAKE) --no-print-directory cuda-emulated
	$(MAKE) --no-print-directory ray-test
	$(VENV)/bin/python -m pytest -q --ignore=$(RAY_TEST) --ignore=$(EMULATED)  # last: its closing line counts the suite

# The CUDA backend, unchanged, on the emulated CUDA runtime and NCCL
# (xla_streams/runtime/emulator/): builds the stand-ins and the backend, replays every
# fixture through it (the 32-device one as 4 processes), runs real JAX programs on it
# through XLA:CPU (a 2-process job too), the conformance program, the deadlock
# experiments and the mutation suite.
EMULATED := tests/runtime/emulated
cuda-emulated: $(STAMP)  ## the CUDA backend on the emulated CUDA runtime and NCCL (about 3 minutes)
	$(VENV)/bin/python -m pytest -q $(EMULATED)

typecheck: $(STAMP)  ## mypy --strict over the package
	$(VENV)/bin/mypy

# jax 0.11.2 (CPU wheels, about 100 MB): the plugin's start-up and its native and
# ffi modes on an unmodified 8-device program (tests/plugin/test_plugin.py, subprocesses).
compat: $(COMPAT_STAMP)  ## the plugin on jax 0.11.2, in its own venv
	$(COMPAT_VENV)/bin/python -m pytest -q tests/plugin/test_plugin.py -k '$(COMPAT_TESTS)'

# The GPU image as this project first meets it: Python 3.12 with jax and jaxlib only
# (CPU wheels here), nothing of ours installed, no network. From an archive of the
# working tree (tracked files and untracked ones git does not ignore, as they are
# now), tools/gpu_check.py's dry run must pass and every tool must start (--help), on
# the image's jax and on the users'. One venv per version, about 100 MB each, made once.
BARE_JAX := 0.11.2 0.12.0.1
gpu-check-bare: $(foreach v,$(BARE_JAX),.venv-bare-jax$(v)/.installed)  ## the GPU check's dry run and every tool from a bare tree, jax 0.11.2 and 0.12
	@tree=$$(mktemp -d) && trap 'rm -rf "$$tree"' EXIT && \
	git ls-files -z --cached --others --exclude-standard \
	    | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$$tree" && \
	cd "$$tree" && for v in $(BARE_JAX); do \
	    python="$(CURDIR)/.venv-bare-jax$$v/bin/python"; \
	    JAX_PLATFORMS=cpu "$$python" tools/gpu_check.py --dry-run "$$tree/out-$$v" >"$$tree/log" 2>&1 \
	        || { cat "$$tree/log"; echo "gpu_check --dry-run failed on a bare tree, jax $$v" >&2; exit 1; }; \
	    for tool in tools/*.py; do \
	        JAX_PLATFORMS=cpu "$$python" "$$tool" --help >"$$tree/log" 2>&1 \
	            || { cat "$$tree/log"; echo "$$tool --help failed on a bare tree, jax $$v" >&2; exit 1; }; \
	    done; \
	    echo "bare tree, jax $$v: gpu_check --dry-run passed, every tool starts"; \
	done

.venv-bare-jax%/.installed: | python
	$(PYTHON) -m venv --clear .venv-bare-jax$*
	.venv-bare-jax$*/bin/pip install --quiet 'jax==$*' 'jaxlib==$*'
	touch $@

# Headless Chromium renders the HTML report in a test (Debian's package; CI runs as root).
chromium:  ## install Debian's headless Chromium where missing (one browser test)
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# BUILD under Bazel 4.2.3 (Debian's bazel-bootstrap, offline): builds //... and runs its
# tests. Bazel's output and caches stay in build/bazel.
BAZEL := bazel --output_user_root=$(CURDIR)/build/bazel
bazel-test: $(STAMP)  ## build //... and run its tests under Bazel 4.2.3
	@command -v bazel >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap >/dev/null; }
	$(BAZEL) test //...

# The Ray test starts a Ray cluster, which binds to the machine's address: here it runs
# only inside a private network namespace whose one interface is loopback (as root:
# `unshare -n`, then iproute2's `ip`, Debian's package), where Ray reaches nothing but
# 127.0.0.1, with usage statistics off. The ray extra goes into the main venv (ray 2.60:
# about 100 MB with what it pulls in, nothing of the venv upgraded); about a minute in all.
RAY_TEST := tests/tuning/test_ray.py
RAY_STAMP := $(VENV)/.ray-installed
ray-test: $(RAY_STAMP)  ## the Ray test, in a loopback-only network namespace (root)
	@if why=$$(unshare -n true 2>&1); then \
	    command -v ip >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; }; \
	    unshare -n sh -c 'ip link set lo up && RAY_USAGE_STATS_ENABLED=0 exec $(VENV)/bin/python -m pytest -q $(RAY_TEST)'; \
	else \
	    echo "$(RAY_TEST) skipped: no private network namespace can be made here (unshare -n: $$why); it needs root"; \
	fi

$(RAY_STAMP): $(STAMP)
	$(VENV)/bin/pip install --quiet -e '.[ray]'
	touch $@

python:
	@test -n "$(PYTHON)" || { echo "Python 3.12 not found: install it, or run make PYTHON=/path/to/python3.12" >&2; exit 1; }

$(STAMP): pyproject.toml | python
	@$(VENV)/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null \
	    || $(PYTHON) -m venv --clear $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test,gpu-aot]'
	touch $@

$(COMPAT_STAMP): pyproject.toml | python
	$(PYTHON) -m venv --clear $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/pip install --quiet --upgrade pip
	$(COMPAT_VENV)/bin/pip install --quiet 'jax==$(COMPAT_JAX)' 'jaxlib==$(COMPAT_JAX)' pytest
	$(COMPAT_VENV)/bin/pip install --quiet -e .
	touch $@
