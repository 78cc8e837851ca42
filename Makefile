# llama-workbench: two commands for a fresh machine.
#   make demo   set everything up and run a short scripted session on the default model
#   make test   set everything up and run the test suite
# Everything lands in .venv (Python) and build/ (CMake, persistent: edits rebuild in seconds).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
BUILD_DEPS := "scikit-build-core>=0.10" "pybind11>=2.12" ninja "cmake>=3.21" wheel
NATIVE_SRC := $(wildcard csrc/*.cpp csrc/*.h) CMakeLists.txt pyproject.toml vendor/llama.cpp.pin
PYTEST_ARGS ?=
GUIDELLM_VENV := build/guidellm-venv

.PHONY: all setup build tools server-tool bench-serving model demo lint test test-heavy fuzz crash-test sanitize bench vendor-check clean

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
	cmake --build "$$($(PY) bench/_paths.py build-dir)" --target llama-bench llama-batched-bench llama-simple llama-speculative-simple llama-lookup llama-perplexity

# llama-server from the same tree and flags, for bench/bench_serving.py only: not part of
# `tools` (which `make test` builds), to keep the test run's build short
server-tool: build
	cmake --build "$$($(PY) bench/_paths.py build-dir)" --target llama-server

bench-serving: model server-tool
	$(PY) bench/bench_serving.py

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
test: lint model tools build/.chromium-checked $(GUIDELLM_VENV)/.installed
	WORKBENCH_REQUIRE_TOOLS=1 WORKBENCH_REQUIRE_BROWSER=$$(command -v chromium >/dev/null 2>&1 && echo 1 || echo 0) \
	  WORKBENCH_GUIDELLM=$(abspath $(GUIDELLM_VENV))/bin/guidellm \
	  $(PY) -m pytest $(PYTEST_ARGS)

# guidellm, a third-party load generator, drives the OpenAI endpoint in tests/server/test_guidellm.py;
# in a venv of its own (its pins would fight ours), without torch (about 55 s and 650 MB, once)
$(GUIDELLM_VENV)/.installed: tests/server/guidellm/requirements.txt
	rm -rf $(GUIDELLM_VENV)
	$(PYTHON) -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps -r $<
	@touch $@

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

# ASan + UBSan over csrc/ (opt-in, not part of `make test`; docs/reliability.md, "Compiler
# warnings and sanitizers"): an instrumented copy of the extension in build/sanitize
# (llama.cpp's objects come from ccache; .venv's extension is never replaced), then with it
# (tests/sanitize/run.sh) tests/native, a fuzz smoke set, the crash tests and the tests that
# drive csrc hardest (the lab's native replay, the eviction policies, KV chunks and hostile
# KV state, hostile and deeply nested input). Any sanitizer report fails the run.
SAN_DIR := build/sanitize
SAN_NATIVE = $(SAN_DIR)/_native$(shell $(PY) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
SAN_FUZZ_EXAMPLES ?= 600
SAN_CRASH_KILLS ?= 50
SAN_TESTS := tests/native tests/fuzz/test_fuzz.py tests/integration/test_crash_engine.py \
  tests/unit/test_lab_native.py tests/unit/test_cache_policies.py tests/integration/test_cache_chunks.py \
  tests/integration/test_cache_chunk_boundaries.py tests/integration/test_cache_bad_state.py \
  tests/integration/test_hostile_input.py tests/integration/test_deep_input.py
# This one makes llama.cpp's jinja engine overflow its stack in probe children on purpose and
# asserts SIGSEGV; ASan reports the overflow (a report, then SIGABRT) instead. Not csrc's, and
# contained by design (docs/reliability.md, "Compiler warnings and sanitizers").
SAN_DESELECT := tests/integration/test_deep_input.py::test_templates_that_kill_or_hang_their_renderer_are_refused

$(SAN_DIR)/build.ninja: | $(VENV)/.built
	@mkdir -p $(SAN_DIR)
	$(VENV)/bin/cmake -S . -B $(SAN_DIR) -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) \
	  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ -DWORKBENCH_SANITIZE=ON \
	  -DPython_EXECUTABLE=$(abspath $(PY)) -Dpybind11_DIR="$$($(PY) -m pybind11 --cmakedir)" \
	  -DSKBUILD_PROJECT_VERSION="$$($(PY) -c "from importlib.metadata import version; print(version('llama-workbench'))")" \
	  > $(SAN_DIR)/configure.log 2>&1 || { cat $(SAN_DIR)/configure.log; exit 1; }

sanitize: model $(SAN_DIR)/build.ninja
	$(VENV)/bin/cmake --build $(SAN_DIR) --target _native
	WORKBENCH_FUZZ_EXAMPLES=$(SAN_FUZZ_EXAMPLES) WORKBENCH_CRASH_KILLS=$(SAN_CRASH_KILLS) \
	  tests/sanitize/run.sh $(PY) $(SAN_NATIVE) $(SAN_DIR)/reports \
	  $(SAN_TESTS) --deselect $(SAN_DESELECT) -m "not heavy" -p no:cacheprovider -o addopts="-ra" -s $(PYTEST_ARGS)

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
