#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine and run them all.
#   bash scripts/test.sh            # the whole suite (what CI runs)
#   PYTHONS="3.11" bash scripts/test.sh   # fewer interpreters while developing
# Each interpreter gets its own venv under .venvs/ with ddprof_nb installed (native
# part compiled for that version).  3.11 runs everything; 3.12 and 3.13 run the parts
# that depend on the interpreter (native, integration without the browser); the
# pure-Python unit tests run on 3.11 and, in the chroot, on 3.14 and 3.15.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHONS=${PYTHONS:-"3.11 3.12 3.13"}
failed=()
step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }

python_for() {  # the interpreter binary for a version: pyenv's, else python3.X on PATH
    local v=$1 prefix
    if command -v pyenv >/dev/null 2>&1; then
        prefix=$(pyenv prefix "$(pyenv versions --bare | grep -E "^${v//./\\.}(\.[0-9]+)?$" | sort -V | tail -1)" 2>/dev/null) \
            && [ -x "$prefix/bin/python3" ] && { echo "$prefix/bin/python3"; return; }
    fi
    command -v "python$v"
}

step "system packages"
need=()
command -v go >/dev/null 2>&1 || need+=(golang-go)
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "${need[@]}"; }) \
        || echo "WARNING: could not install ${need[*]}"
fi

for v in $PYTHONS; do
    step "python $v: venv and install"
    py=$(python_for "$v") || { echo "python $v not found"; failed+=("python$v-missing"); continue; }
    venv="$ROOT/.venvs/$v"
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    extras="dev"
    [ "$v" = "3.11" ] && extras="dev,browser,bench,dask"
    if ! DDPROF_NB_REQUIRE_NATIVE=1 "$venv/bin/pip" install -q --disable-pip-version-check -e ".[$extras]" 2>&1 \
        | grep -v "^WARNING: Location"; then :; fi
    "$venv/bin/python" -c "import ddprof_nb._native" || { failed+=("build-$v"); continue; }
    # a regular (non-editable) `pip install .`, imported from outside the source tree
    target=$(mktemp -d)
    if DDPROF_NB_REQUIRE_NATIVE=1 "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --target "$target" . \
        >/dev/null 2>&1 && (cd / && PYTHONPATH="$target" "$venv/bin/python" -c \
        "import ddprof_nb, ddprof_nb._binding as b; assert ddprof_nb.__file__.startswith('$target'), ddprof_nb.__file__; assert b.unavailable_reason() is None, b.unavailable_reason(); print('pip install . on', '$v', 'ok')"); then :
    else failed+=("pip-install-$v"); fi
    rm -rf "$target"
    step "python $v: tests"
    if [ "$v" = "3.11" ]; then
        targets=(tests)
    else
        # (tests/unit is pure Python: 3.11 here and 3.14/3.15 in the chroot run it)
        targets=(tests/native tests/integration -m "not browser and not slow")
    fi
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "${targets[@]}"
    rc=$?
    [ $rc -eq 0 ] || failed+=("tests-$v(rc=$rc)")
done

if [ "${RUN_SANITIZERS:-1}" = 1 ] && [[ " $PYTHONS " == *" 3.11 "* ]]; then
    step "native tests under ASan + UBSan (3.11)"
    bash scripts/test_sanitize.sh || failed+=("sanitizers")
fi

if [ "${RUN_CHROOT:-1}" = 1 ] && [ "$(id -u)" = 0 ]; then
    step "python 3.14 / 3.15 in a Debian chroot"
    bash scripts/test_chroot.sh || failed+=("chroot-3.14/3.15")
fi

step "summary"
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
echo "all test runs passed"
