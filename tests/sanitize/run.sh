#!/usr/bin/env bash
# The test run of `make sanitize` (docs/reliability.md, "Compiler warnings and sanitizers"),
# from the repository root:
#   tests/sanitize/run.sh <python> <instrumented _native .so> <reports dir> <pytest args...>
# Python itself is not instrumented, so libasan is preloaded (with libstdc++, whose
# __cxa_throw ASan must find when it starts; Python does not link it). Every Python process
# of the run inherits the environment: sitecustomize.py (this directory, on PYTHONPATH) loads
# the instrumented workbench._native in each. A finding ends its process (halt_on_error,
# abort_on_error; csrc is built with -fno-sanitize-recover=all) and writes a report under
# <reports dir>, so one in a child whose exit a test tolerates or whose stderr goes nowhere
# still fails the run. Leak detection is off: the interpreter's own allocations at exit
# would drown out everything else.
set -u
py=$1 native=$2 reports=$3
shift 3
here=tests/sanitize

rm -rf "$reports" && mkdir -p "$reports"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1:check_initialization_order=1:log_path=$PWD/$reports/asan"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:log_path=$PWD/$reports/ubsan"
export PYTHONPATH="$PWD/$here${PYTHONPATH:+:$PYTHONPATH}"
export WORKBENCH_SANITIZE_NATIVE="$PWD/$native"

# The canary: each sanitizer must stop a process and leave its report.
canary="$(dirname "$native")/canary.so"
gcc -shared -fPIC -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -static-libubsan \
  -Wl,--exclude-libs,libubsan.a -o "$canary" "$here/canary.c" || exit 1  # linked as _native (CMakeLists.txt)
for call in "canary_use_after_free(1):asan:heap-use-after-free" "canary_signed_overflow(2**31 - 1):ubsan:signed integer overflow"; do
  IFS=: read -r expr tool expect <<< "$call"
  if { "$py" -c "import ctypes; print(ctypes.CDLL('$canary').$expr)"; } >/dev/null 2>&1; then
    echo "sanitize: the canary $expr was not stopped: the run would find nothing" >&2; exit 1
  fi
  if ! grep -qs "$expect" "$reports/$tool".*; then
    echo "sanitize: no $tool report for the canary $expr (looked for '$expect' in $reports)" >&2; exit 1
  fi
  rm -f "$reports/$tool".*
done
"$py" -c "import workbench._native as n; assert n.__file__ == '$PWD/$native', n.__file__" || exit 1
echo "sanitize: canaries caught; workbench._native is $native"

"$py" -m pytest "$@"
rc=$?
if compgen -G "$reports/*" >/dev/null; then
  for f in "$reports"/*; do echo "=== $f"; cat "$f"; done
  echo "sanitize: $(ls "$reports" | wc -l) sanitizer report(s) above (kept in $reports)" >&2
  exit 1
fi
exit $rc
