#!/usr/bin/env bash
# The native stress tests under AddressSanitizer + UndefinedBehaviorSanitizer (Python 3.11).
# The extension is built with DDPROF_NB_SANITIZE=1 into its own venv (not editable, so
# the source tree's regular build is untouched); Python itself is not instrumented, so
# the sanitizer runtimes are preloaded.  Leak checking is off: CPython keeps memory
# alive until exit by design.  Any sanitizer report aborts the process and fails a test.
#   bash scripts/test_sanitize.sh [PYTEST ARGS]   # build, then test
#   bash scripts/test_sanitize.sh --build-only    # (scripts/test.sh builds beside other work,
#   bash scripts/test_sanitize.sh --no-build      #  and tests later, alone)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
build=1 tests=1
case "${1:-}" in
    --build-only) tests=0; shift ;;
    --no-build) build=0; shift ;;
esac
v=${SANITIZE_PYTHON:-3.11}
py=$(pyenv prefix "$(pyenv versions --bare | grep -E "^${v//./\\.}(\.[0-9]+)?$" | sort -V | tail -1)")/bin/python3
venv="$ROOT/.venvs/asan-$v"
if [ $build = 1 ]; then
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    # the dependencies only (scripts/test.sh may have installed them already): the project itself
    # is built once, sanitized, below
    reqs=$(mktemp)
    "$venv/bin/python" "$ROOT/scripts/requirements_of.py" dev,coexist >"$reqs"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$reqs" 2>&1 | grep -v "^WARNING: Location" || true
    rm -f "$reqs"
    # build from a clean copy: setuptools would otherwise reuse ./build's unsanitized objects
    src=$(mktemp -d)
    tar -C "$ROOT" --exclude=./build --exclude=./.venvs --exclude=./.git --exclude='*.so' --exclude='*.egg-info' -cf - . \
        | tar -C "$src" -xf -
    DDPROF_NB_SANITIZE=1 DDPROF_NB_REQUIRE_NATIVE=1 "$venv/bin/pip" install -q --disable-pip-version-check \
        --force-reinstall --no-deps --no-cache-dir "$src" 2>&1 | grep -v "^WARNING: Location" || true
    rm -rf "$src"
fi
so=$(ls "$venv"/lib/python*/site-packages/ddprof_nb/_native*.so)
case "$(nm -D "$so")" in *__asan_init*) ;; *) echo "the native module is not sanitized: $so"; exit 1 ;; esac
[ $tests = 1 ] || { echo "sanitized build ready: $so"; exit 0; }
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
# quarantine 16 MiB (default 256): freed memory ASan holds back counts as RSS, and the
# RSS-flatness tests (many start/stop cycles) must see a quarantine already full after warm-up
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allow_user_segv_handler=1:quarantine_size_mb=16"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
work=$(mktemp -d)
cd "$work"  # import ddprof_nb from the venv, not from the source tree
"$venv/bin/python" -c "import ddprof_nb._native, ddprof_nb; print('sanitized build:', ddprof_nb.__file__)"
# Lock/park tests are left out here: libasan interposes the very libc waits (sem_wait,
# pthread_cond_wait, ...) whose GOT slots they hook, so their slots point at ASan's
# interceptors and the hooks are (correctly) refused.  They run in the normal suites.
# The coexistence suite runs too (its lock/park cells accept the refusal the profile notes),
# the matrix for the set of every event only: each hook beside each other tool, in every order.
# The tests marked alone (they keep time) one at a time, then the others two at a time.
sanitized_pytest() {
    "$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=15 --durations-min=1 --rootdir="$ROOT" "$ROOT/tests/native" \
        --ignore="$ROOT/tests/native/test_lockpark.py" "$ROOT/tests/coexist" -k "not test_beside or -all]" "$@"
}
rc=0
sanitized_pytest -m alone "$@" || { r=$?; [ $r = 5 ] || rc=$r; }
sanitized_pytest -n 2 -m "not alone" "$@" || rc=$?
exit $rc
