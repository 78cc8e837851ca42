# llama-workbench: two commands for a fresh machine.
#   make demo   set everything up and run a short scripted session on the default model
#   make test   set everything up and run the test suite
# Everything lands in .venv (Python) and build/ (CMake, persistent: edits rebuild in seconds).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
BUILD_DEPS := "scikit-build-core>=0.10" "pybind11>=2.12" ninja "cmake>=3.21"
NATIVE_SRC := $(wildcard csrc/*.cpp csrc/*.h) CMakeLists.txt pyproject.toml vendor/llama.cpp.pin
PYTEST_ARGS ?=

.PHONY: all setup build tools model demo lint test test-heavy fuzz crash-test bench vendor-check clean

all: build

# --- system packages: ccache keeps rebuilds of llama.cpp cheap (optional) --------------
.ccache-checked:
	@if ! command -v ccache >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq ccache) >/dev/null 2>&1 \
	      || echo "make: could not install ccache; builds will be slower"; \
	  else echo "make: ccache not found; builds will be slower"; fi; \
	fi
	@touch $@

# --- Python environment ------------------------------------------------------------------
$(VENV)/.deps: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(BUILD_DEPS)
	@touch $@

setup: $(VENV)/.deps .ccache-checked

# --- the native extension (editable install; build/ is kept between builds) ----------------
# The editable install maps each Python module to its file: a module added, moved or removed
# needs a reinstall (llama.cpp is not rebuilt), so the list of modules is a prerequisite too,
# rewritten only when it changes.
PY_MODULES := $(sort $(shell find workbench -name '*.py' 2>/dev/null))
build/.py-modules: FORCE
	@mkdir -p $(@D)
	@echo '$(PY_MODULES)' | cmp -s - $@ 2>/dev/null || echo '$(PY_MODULES)' > $@

.PHONY: FORCE
FORCE:

$(VENV)/.built: $(VENV)/.deps .ccache-checked $(NATIVE_SRC) build/.py-modules
	$(PY) vendor/fetch_llama.py
	$(PIP) install -q --no-build-isolation -e ".[test]"
	@touch $@

build: $(VENV)/.built

# llama.cpp's own programs from the same build tree (for bench/ and parity tests)
tools: build
	cmake --build "$$($(PY) bench/_paths.py build-dir)" --target llama-bench llama-batched-bench llama-simple llama-speculative-simple llama-lookup

model: build
	$(PY) -m workbench.models fetch

demo: model
	$(PY) -m workbench.demo

# linters (configured in pyproject.toml): ruff over the code and tests, mypy over workbench/
lint: build
	$(VENV)/bin/ruff check workbench tests bench
	$(VENV)/bin/mypy

# the browser test is required wherever Chromium is installed (build/.chromium-checked said
# so above if it could not be); a skip elsewhere is listed in pytest's summary
test: lint model tools build/.chromium-checked
	WORKBENCH_REQUIRE_TOOLS=1 WORKBENCH_REQUIRE_BROWSER=$$(command -v chromium >/dev/null 2>&1 && echo 1 || echo 0) \
	  $(PY) -m pytest $(PYTEST_ARGS)

test-heavy: model tools
	$(PY) -m pytest -m heavy $(PYTEST_ARGS)

# The long fuzz run (docs/reliability.md): 12,000 hypothesis cases through the crash-detecting
# worker (make test runs 1,200 of the same, derandomized). Prints the figures and writes them
# to build/fuzz-report.json. FUZZ_SEED=<n> draws other cases; FUZZ_KNOWN=all adds the input
# families of known, not yet fixed crashes.
FUZZ_EXAMPLES ?= 12000
fuzz: model
	WORKBENCH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) WORKBENCH_FUZZ_REPORT=build/fuzz-report.json \
	  $(if $(FUZZ_SEED),WORKBENCH_FUZZ_SEED=$(FUZZ_SEED)) $(if $(FUZZ_KNOWN),WORKBENCH_FUZZ_KNOWN=$(FUZZ_KNOWN)) \
	  $(PY) -m pytest -m fuzz tests/fuzz -p no:cacheprovider -o addopts="-ra" --timeout=0 $(PYTEST_ARGS)

# 500 SIGKILLs of a real engine saving rows to shm and disk, then restarts (make test: ~25);
# -s shows the figures line (kills, tmp files, the last restart's check) for docs/reliability.md
crash-test: model
	WORKBENCH_CRASH_KILLS=500 $(PY) -m pytest tests/integration/test_crash_engine.py -o addopts="-ra" -s \
	  --timeout=0 $(PYTEST_ARGS)

bench: model tools
	$(PY) bench/bench_throughput.py

vendor-check:
	$(PY) vendor/fetch_llama.py --check

# --- notebooks and the browser test ------------------------------------------------------------
# `make test` runs the tutorial notebooks (nbval compares their stored outputs) and the
# JupyterLab browser test, which drives Debian's Chromium with Playwright (no browser
# download); the test is skipped where no Chromium could be installed.
.PHONY: notebooks test-notebooks test-browser

build/.chromium-checked:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 \
	      || echo "make: could not install chromium (apt-get failed): the browser test will be SKIPPED"; \
	  else echo "make: chromium not found and not root with apt-get: the browser test will be SKIPPED"; fi; \
	fi
	@mkdir -p $(@D) && touch $@

# run the notebooks again and store their outputs (after changing a notebook or the library)
notebooks: model
	$(PY) tests/notebooks/run_notebooks.py

test-notebooks: model
	$(PY) -m pytest notebooks $(PYTEST_ARGS)

test-browser: model build/.chromium-checked
	WORKBENCH_REQUIRE_BROWSER=1 $(PY) -m pytest -m browser tests/notebooks/test_browser.py $(PYTEST_ARGS)

clean:
	rm -rf build $(VENV) .ccache-checked
