#!/usr/bin/env bash
# The GPU check (issue 30; docs/benchmarks.md, "GPU check"): one script for a machine with an
# NVIDIA GPU, aimed at 8 minutes on 16 cores:
#   1. build the extension with ggml's CUDA backend (sm of this GPU only) in build/cuda, and
#      llama.cpp's programs the benches compare with from the same tree;
#   2. the native and engine tests that run on the GPU (every model the tests load offloads
#      all layers on a CUDA build);
#   3. bench_throughput beside llama-bench, bench_batching beside llama-batched-bench, the
#      loop's own time per tick (bench_tick: where the decode leaves the CPU's caches alone)
#      and the n-gram speculative bench on code edits beside llama-lookup /
#      llama-speculative-simple.
# Every figure goes to one file, $OUT/gpu_check.json (OUT: test-artifacts by default), the
# whole log to $OUT/gpu_check.log.
#
#   bash bench/gpu_check.sh             on the GPU machine (nvcc on PATH)
#   bash bench/gpu_check.sh --dry-run   the same steps on this machine's CPU build (`make
#                                       build`, build/<wheel tag>), with shorter bench runs
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=gpu
[[ "${1:-}" == "--dry-run" ]] && MODE=cpu
OUT_DIR=${OUT:-test-artifacts}
mkdir -p "$OUT_DIR"
RESULT=$OUT_DIR/gpu_check.json
LOG=$OUT_DIR/gpu_check.log
PARTS=$(mktemp -d)
PY=.venv/bin/python
TOOLS="llama-bench llama-batched-bench llama-lookup llama-speculative-simple"
: > "$LOG"
started=$(date +%s)

step() { echo "== $1 (+$(( $(date +%s) - started )) s)" | tee -a "$LOG"; }
# a bench that fails is a finding too: its part of the figures says so, the others still run
bench() {
  local name=$1; shift
  "$@" --json "$PARTS/$name.json" >>"$LOG" 2>&1 || {
    echo "   $name failed: $(tail -1 "$LOG")" | tee -a "$LOG"
    $PY -c 'import json, sys; print(json.dumps({"error": sys.argv[1]}))' "$(tail -1 "$LOG")" > "$PARTS/$name.json"
  }
}
run() { "$@" >>"$LOG" 2>&1 || { echo "gpu_check: failed: $* (see $LOG)" >&2; tail -20 "$LOG" >&2; exit 1; }; }

if [[ $MODE == gpu ]]; then
  [[ -x /usr/local/cuda/bin/nvcc ]] && PATH=/usr/local/cuda/bin:$PATH
  command -v nvcc >/dev/null || { echo "gpu_check: no nvcc on PATH; --dry-run runs the steps on a CPU build" >&2; exit 2; }
  step "build with CUDA (build/cuda)"
  # --no-deps: the environment is `make build`'s already (the GPU machine may reach no index)
  run $PY -m pip --disable-pip-version-check install -q --no-deps --no-build-isolation -e . \
      -C build-dir=build/cuda -C cmake.define.WORKBENCH_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=native
  run cmake --build build/cuda --target $TOOLS
  ROUNDS=3 NTG=64 NPRED=128
else
  step "CPU build (dry run)"
  run make build
  run cmake --build "$($PY bench/_paths.py build-dir)" --target $TOOLS
  ROUNDS=1 NTG=16 NPRED=32
fi
run $PY -c "import workbench._native as n, sys; sys.exit(0 if n.cuda == ('$MODE' == 'gpu') else 1)"

step "tests on the $MODE build"
# a failing test is a finding, not the end of the check: counted in the figures file
$PY -m pytest tests/native tests/integration/test_generation.py tests/integration/test_sampling.py \
    tests/integration/test_batching.py tests/integration/test_speculative_native.py \
    tests/integration/test_warm_equals_cold.py tests/integration/test_machine_info.py \
    -q -p no:cacheprovider -o addopts="-m 'not heavy'" --junitxml="$PARTS/tests.xml" >>"$LOG" 2>&1 \
  || echo "   some tests failed (listed in $LOG)" | tee -a "$LOG"

step "bench_throughput beside llama-bench"
bench throughput $PY bench/bench_throughput.py --rounds "$ROUNDS"
step "bench_batching beside llama-batched-bench"
bench batching $PY bench/bench_batching.py --ntg "$NTG" --reps 1
step "the loop's own time per tick"
bench tick $PY bench/bench_tick.py --rounds "$ROUNDS" --tokens "$NPRED"
step "n-gram speculation on code edits"
bench speculative $PY bench/bench_speculative.py --classes code --rounds "$ROUNDS" --n-predict "$NPRED"
step "done"

$PY - "$PARTS" "$RESULT" "$MODE" "$(( $(date +%s) - started ))" <<'EOF'
import json, subprocess, sys, xml.etree.ElementTree as ET
from pathlib import Path
import workbench._native as native
parts, result, mode, seconds = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
suite = ET.parse(parts / "tests.xml").getroot().find("testsuite")
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip() if mode == "gpu" else None
out = {"mode": mode, "seconds": seconds, "gpu": gpu,
       "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
       "cuda": bool(native.cuda),
       "tests": {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")},
       **{name: json.loads((parts / f"{name}.json").read_text()) for name in ("throughput", "batching", "tick", "speculative")}}
result.write_text(json.dumps(out, indent=1, default=str))
print(f"gpu_check ({mode}): {out['tests']['tests']} tests, {out['tests']['failures']} failures; figures in {result}")
EOF
