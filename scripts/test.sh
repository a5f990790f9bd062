#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine and run them all.
#   bash scripts/test.sh            # the whole suite (what CI runs)
#   bash scripts/test.sh --quick    # the contributor's lane: 3.11 only, the tests marked quick
#       (tests/unit and tests/native unless slow, one integration test per feature; see
#       tests/conftest.py), no system packages, no sanitizer, no chroot: a few minutes
#   PYTHONS="3.11" bash scripts/test.sh   # fewer interpreters while developing
#   RUN_SANITIZERS=0 / RUN_CHROOT=0       # without the ASan + UBSan or the 3.14/3.15 phase
#   REPEAT=3 bash scripts/test.sh   # the pytest phases 3 times (after all installs; the
#       sanitizer and chroot phases once), then every test that failed in any run, with its run
# At its end it prints how long each phase took and the slowest tests of every pytest run.
#
# Each interpreter gets its own venv under .venvs/ with ddprof_nb installed (native
# part compiled for that version).  3.11 runs everything; 3.12 and 3.13 (and 3.14/3.15 in
# the chroot) run the tests marked internals: tests/native and the integration modules that
# read interpreter internals (tests/conftest.py names them; docs/testing.md has the rule).
#
# The order keeps the tests that keep time away from other work: first everything that keeps
# no time, at once (every venv's dependencies, by uv, the chroot and its venvs' dependencies in the
# background, each version's build one after another, the sanitized builds, the notebook and
# binder tests, the unit tests on both cores); then each version's sampling tests: those
# marked alone one at a time with nothing beside them, then the others two at a time
# (pytest-xdist), as the alone marker allows.  The tests that need the chroot run in its phase.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
quick=0
case "${1:-}" in
    --quick) quick=1 ;;
    "") ;;
    *) echo "usage: bash scripts/test.sh [--quick]"; exit 2 ;;
esac
if [ $quick = 1 ]; then
    PYTHONS=3.11 RUN_SANITIZERS=0 RUN_CHROOT=0
    [ -z "${REPEAT:-}" ] || { echo "REPEAT is for the whole suite"; exit 2; }
fi
PYTHONS=${PYTHONS:-"3.11 3.12 3.13"}
failed=()
# everything printed is kept, so that the summary can end with each failure's reason (CI
# shows the tail of long outputs) and the slowest tests
whole_log=$(mktemp)
exec > >(tee "$whole_log") 2>&1
# the tests' small C extensions, compiled once per interpreter for the whole run instead of
# once per pytest process (tests/c_extensions.py)
export DDPROF_NB_TEST_EXT_CACHE
DDPROF_NB_TEST_EXT_CACHE=$(mktemp -d)
trap 'rm -rf "$DDPROF_NB_TEST_EXT_CACHE"' EXIT
# Each step is a phase of the time table printed at the end; a step ends where the next begins.
phase_names=() phase_secs=() phase_name="" phase_t0=$SECONDS
end_phase() {
    [ -n "$phase_name" ] && { phase_names+=("$phase_name"); phase_secs+=($((SECONDS - phase_t0))); }
    phase_name=""
}
step() { end_phase; phase_name=$1; phase_t0=$SECONDS; printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }
# every pytest run lists its slowest tests; the summary gathers them from the log
durations=(--durations=15 --durations-min=1)

python_for() {  # the interpreter binary for a version: pyenv's, else python3.X on PATH
    local v=$1 prefix
    if command -v pyenv >/dev/null 2>&1; then
        prefix=$(pyenv prefix "$(pyenv versions --bare | grep -E "^${v//./\\.}(\.[0-9]+)?$" | sort -V | tail -1)" 2>/dev/null) \
            && [ -x "$prefix/bin/python3" ] && { echo "$prefix/bin/python3"; return; }
    fi
    command -v "python$v"
}

pytest_of() { "$ROOT/.venvs/$1/bin/python" -m pytest -q -p no:cacheprovider "${durations[@]}" "${@:2}"; }
# 3.11's notebook tests (a venv built from binder/ with pip, the quick start's own venv, every
# notebook run headless: downloads, then presence checks): they keep no time
lane=(tests/integration/test_binder.py tests/integration/test_notebooks.py)
start_lane() {  # in the background, beside the installs and the unit tests; wait_lane shows it
    lane_log=$(mktemp)
    pytest_of 3.11 "${lane[@]}" >"$lane_log" 2>&1 &
    lane_pid=$!
}
wait_lane() {
    local rc=0
    wait "$lane_pid" || rc=$?
    echo "--- the notebook and binder tests (run in the background):"
    cat "$lane_log"; rm -f "$lane_log"
    return $rc
}
run_unit() {  # tests/unit: pure Python, no time kept: both cores (pytest-xdist)
    if [ $quick = 1 ]; then pytest_of 3.11 -n 2 -m quick tests/unit; else pytest_of 3.11 -n 2 -m "not chroot" tests/unit; fi
}
# The tests that sample and keep time, of version $1 and marker expression $2 (args after: paths):
# those marked alone one at a time with nothing beside them, then the rest on both cores.
alone_then_two() {
    local v=$1 m=$2 rc=0 r
    pytest_of "$v" -m "($m) and alone" "${@:3}"; r=$?
    [ $r = 0 ] || [ $r = 5 ] || rc=$r  # (5: no test selected)
    pytest_of "$v" -n 2 -m "($m) and not alone" "${@:3}"; r=$?
    [ $r = 0 ] || [ $r = 5 ] || rc=$r
    return $rc
}
run_sampling() {  # the tests of version $1 that sample and keep time
    local v=$1
    if [ $quick = 1 ]; then
        alone_then_two "$v" quick tests --ignore=tests/unit
    elif [ "$v" = "3.11" ]; then
        alone_then_two "$v" "not chroot" tests --ignore=tests/unit "${lane[@]/#/--ignore=}"
    else
        # what depends on the interpreter's version (the rest is the same Python on every
        # version: 3.11 runs it, and tests/unit, pure Python, runs on 3.15 in the chroot too)
        alone_then_two "$v" "internals and not browser and not slow and not pure_python and not c_variant and not chroot" \
            tests --ignore=tests/unit
    fi
}
run_pytest() {  # every pytest phase of version $1, in order (REPEAT's unit of work)
    local v=$1 rc=0
    if [ "$v" = "3.11" ] && [ $quick = 0 ]; then
        start_lane
        run_unit || rc=$?
        wait_lane || rc=$?
    elif [ "$v" = "3.11" ]; then
        run_unit || rc=$?
    fi
    run_sampling "$v" || rc=$?
    return $rc
}
if [ -n "${REPEAT:-}" ] && ! [[ $REPEAT =~ ^[1-9][0-9]*$ ]]; then
    echo "REPEAT must be a positive integer (got '$REPEAT')"; exit 2
fi

need=()
[ $quick = 1 ] || step "system packages"
command -v go >/dev/null 2>&1 || need+=(golang-go)
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ $quick = 0 ] && [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "${need[@]}"; }) \
        || echo "WARNING: could not install ${need[*]}"
fi

extras_for() { if [ "$1" = "3.11" ] && [ $quick = 0 ]; then echo "dev,coexist,browser,bench,dask,pools"; else echo "dev,coexist"; fi; }
sanitize=0 sanitize_312=0
[ "${RUN_SANITIZERS:-1}" = 1 ] && [[ " $PYTHONS " == *" 3.11 "* ]] && sanitize=1
# and on 3.12, the subinterpreters' (their allocation hooks run beside the main interpreter's GIL,
# their threads' samples walk thread states the main interpreter does not list; 3.11 has no
# such interpreters): their tests only
[ $sanitize = 1 ] && [[ " $PYTHONS " == *" 3.12 "* ]] && sanitize_312=1

# The installs are mostly downloads and unpacking: every venv's dependencies at once, and in
# the background the chroot of the 3.14/3.15 phase with its venvs' dependencies, until that
# phase (test_chroot.sh then installs only the project); then the project itself built into
# each venv one after another (the builds share ./build).
setup_logs=$(mktemp -d)
chroot_pid=
if [ "${RUN_CHROOT:-1}" = 1 ] && [ "$(id -u)" = 0 ]; then
    (t0=$SECONDS; bash scripts/test_chroot.sh --prepare; rc=$?; echo $((SECONDS - t0)) >"$setup_logs/chroot.secs"; exit $rc) \
        >"$setup_logs/chroot.log" 2>&1 &
    chroot_pid=$!
fi
step "venvs and dependencies of $PYTHONS$([ $sanitize = 1 ] && echo " and the sanitizer venv"), at once"
# uv installs the dependencies (downloads in parallel, no per-package pip start-up: the four
# venvs' 116 s with pip took ~30 with uv); pip where uv cannot be had.  The project itself is
# built by pip below, as users install it.
uv="$ROOT/.venvs/uv/bin/uv"
if [ ! -x "$uv" ]; then
    { py=$(python_for 3.11) || py=python3; } && "$py" -m venv "$ROOT/.venvs/uv"         && "$ROOT/.venvs/uv/bin/pip" install -q --disable-pip-version-check uv >/dev/null 2>&1         || { echo "(uv unavailable: dependencies by pip)"; uv=""; }
fi
install_deps() {  # venv $1, requirements file $2
    if [ -n "$uv" ]; then "$uv" pip install -q --python "$1/bin/python" -r "$2"
    else "$1/bin/pip" install -q --disable-pip-version-check -r "$2"; fi
}
deps_pids=()
for v in $PYTHONS $([ $sanitize = 1 ] && echo asan-3.11) $([ $sanitize_312 = 1 ] && echo asan-3.12); do
    py=$(python_for "${v#asan-}") || continue  # reported below
    venv="$ROOT/.venvs/$v"
    extras=$(extras_for "$v")
    (
        t0=$SECONDS
        trap 'echo $((SECONDS - t0)) >"$setup_logs/$v.secs"' EXIT
        [ -x "$venv/bin/python" ] || "$py" -m venv "$venv" || exit 1
        "$venv/bin/python" scripts/requirements_of.py "$extras" >"$setup_logs/$v.txt" || exit 1
        install_deps "$venv" "$setup_logs/$v.txt"
    ) >"$setup_logs/$v.log" 2>&1 &
    deps_pids+=("$!:$v")
done
for pv in ${deps_pids[@]+"${deps_pids[@]}"}; do
    # a failure here shows again, and counts, in that venv's install of the project below
    wait "${pv%%:*}" || { echo "dependencies of ${pv#*:} failed:"; grep -v "^WARNING: Location" "$setup_logs/${pv#*:}.log" | tail -n 20; }
done
echo "dependencies installed ($(date +%T))"
# the time table's rows for work done beside other phases
beside=()
for pv in ${deps_pids[@]+"${deps_pids[@]}"}; do
    beside+=("  dependencies of ${pv#*:} (at once):$(cat "$setup_logs/${pv#*:}.secs" 2>/dev/null || echo "?")")
done

chroot_rows() {  # the background chroot work's rows of the time table
    beside+=("  the chroot and its venvs' dependencies, in the background:$(cat "$setup_logs/chroot.secs" 2>/dev/null || echo "?")")
    while IFS= read -r row; do beside+=("$row"); done < <(sed -nE \
        -e 's/^PHASE chroot: ([0-9.]+) s.*/    of which the chroot (tools\/pychroot.sh ensure):\1/p' \
        -e "s/^PHASE dependencies of ([0-9.]+): ([0-9.]+) s.*/    of which python \\1's dependencies:\\2/p" "$setup_logs/chroot.log")
}
ready=()  # versions whose venv is ready
lane_pid=
for v in $PYTHONS; do
    step "python $v: venv and install$([ -n "$lane_pid" ] && echo " (beside the notebook tests)")"
    py=$(python_for "$v") || { echo "python $v not found"; failed+=("python$v-missing"); continue; }
    venv="$ROOT/.venvs/$v"
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    extras=$(extras_for "$v")
    if ! DDPROF_NB_REQUIRE_NATIVE=1 "$venv/bin/pip" install -q --disable-pip-version-check -e ".[$extras]" 2>&1 \
        | grep -v "^WARNING: Location"; then :; fi
    "$venv/bin/python" -c "import ddprof_nb._native" || { failed+=("build-$v"); continue; }
    # a regular (non-editable) `pip install .`, imported from outside the source tree: on the
    # first version only (what it checks, the package's files and data, is the same on every
    # version; each version's native build is checked just above)
    target=$(mktemp -d)
    if [ $quick = 1 ] || [ "$v" != "${PYTHONS%% *}" ]; then :  # (packaging: the whole suite's)
    elif DDPROF_NB_REQUIRE_NATIVE=1 "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --target "$target" . \
        >/dev/null 2>&1 && (cd / && PYTHONPATH="$target" "$venv/bin/python" -c \
        "import ddprof_nb, ddprof_nb.engines.native.binding as b; assert ddprof_nb.__file__.startswith('$target'), ddprof_nb.__file__; assert b.unavailable_reason() is None, b.unavailable_reason(); print('pip install . on', '$v', 'ok')"); then :
    else failed+=("pip-install-$v"); fi
    rm -rf "$target"
    ready+=("$v")
    # the notebook tests keep no time: beside the other versions' installs and the unit tests
    if [ "$v" = "3.11" ] && [ $quick = 0 ] && [ -z "${REPEAT:-}" ]; then start_lane; fi
done
if [ $sanitize = 1 ]; then
    step "the sanitized builds (ASan + UBSan, 3.11$([ $sanitize_312 = 1 ] && echo " and 3.12"))$([ -n "$lane_pid" ] && echo ", beside the notebook tests")"
    bash scripts/test_sanitize.sh --build-only || { failed+=("sanitizer-build"); sanitize=0; }
    if [ $sanitize_312 = 1 ]; then
        SANITIZE_PYTHON=3.12 bash scripts/test_sanitize.sh --build-only || { failed+=("sanitizer-build-3.12"); sanitize_312=0; }
    fi
fi

if [ -n "${REPEAT:-}" ]; then
    # Each run's failures are read from pytest's short summary (FAILED/ERROR lines).
    logs=$(mktemp -d)
    flaky=()
    for ((run = 1; run <= REPEAT; run++)); do
        for v in ${ready[@]+"${ready[@]}"}; do
            step "run $run/$REPEAT: python $v: tests"
            t0=$SECONDS
            run_pytest "$v" 2>&1 | tee "$logs/run$run-$v.log"
            rc=${PIPESTATUS[0]}
            echo "run $run/$REPEAT python $v: pytest exit $rc in $((SECONDS - t0)) s"
            [ $rc -eq 0 ] || failed+=("tests-$v-run$run(rc=$rc)")
            n=${#flaky[@]}
            while IFS= read -r line; do
                flaky+=("run $run, python $v: $line")
            done < <(grep -E '^(FAILED|ERROR) ' "$logs/run$run-$v.log" | cut -c1-300)
            if [ $rc -ne 0 ] && [ ${#flaky[@]} -eq "$n" ]; then
                flaky+=("run $run, python $v: pytest exit $rc without a FAILED/ERROR line (see its output)")
            fi
        done
    done
    rm -rf "$logs"
    step "tests that failed in any of the $REPEAT runs"
    if [ ${#flaky[@]} -gt 0 ]; then printf '%s\n' "${flaky[@]}"; else echo "none"; fi
else
    if [[ " ${ready[*]-} " == *" 3.11 "* ]]; then
        step "python 3.11: unit tests (2 cores)$([ -n "$lane_pid" ] && echo ", beside the notebook tests")"
        run_unit || failed+=("unit-3.11")
        if [ -n "$lane_pid" ]; then
            step "python 3.11: the rest of the notebook tests"
            wait_lane || failed+=("notebooks-3.11")
        fi
    fi
    if [ -n "$chroot_pid" ]; then
        step "waiting for the chroot and its venvs' dependencies (background)"
        wait "$chroot_pid" || echo "(its test phase below retries and reports)"
        cat "$setup_logs/chroot.log"
        chroot_rows
        chroot_pid=done
    fi
    for v in ${ready[@]+"${ready[@]}"}; do
        step "python $v: $([ $quick = 1 ] && echo "the other quick tests" || { [ "$v" = 3.11 ] && echo "native, integration and coexistence tests" || echo "the tests marked internals"; }): alone ones one at a time, then two at a time"
        run_sampling "$v" || failed+=("tests-$v")
    done
fi

if [ $sanitize = 1 ]; then
    step "native tests under ASan + UBSan (3.11)"
    bash scripts/test_sanitize.sh --no-build || failed+=("sanitizers")
    if [ $sanitize_312 = 1 ]; then
        step "subinterpreters under ASan + UBSan (3.12)"
        SANITIZE_PYTHON=3.12 bash scripts/test_sanitize.sh --no-build -k "test_subinterpreter_alloc or test_subinterpreter_cpu" \
            || failed+=("sanitizers-3.12")
    fi
fi

if [ -n "$chroot_pid" ]; then
    step "python 3.14 / 3.15 in a Debian chroot"
    if [ "$chroot_pid" != done ]; then  # (REPEAT: still in the background until here)
        wait "$chroot_pid"; cat "$setup_logs/chroot.log"
        chroot_rows
    fi
    if [[ " ${ready[*]-} " == *" 3.11 "* ]]; then  # 3.11 reading the chroot's interpreters
        pytest_of 3.11 -m chroot tests || failed+=("chroot-from-3.11")
    fi
    bash scripts/test_chroot.sh | tee "$setup_logs/chroot-tests.log"
    [ "${PIPESTATUS[0]}" = 0 ] || failed+=("chroot-3.14/3.15")
    # its versions' phases (test_chroot.sh prints "PHASE name: N s" under "=== python V ...")
    while IFS= read -r row; do beside+=("$row"); done < <(awk '
        /^=== python [0-9.]+ in the chroot/ { v = $3 }
        /^PHASE / && v != "" { sub(/^PHASE /, ""); name = $0; sub(/: .*/, "", name)
            secs = $0; sub(/^[^:]*: (FAILED after )?/, "", secs); sub(/ .*/, "", secs)
            if (name !~ /total$/) print "  python " v " in the chroot: " name ":" secs }' "$setup_logs/chroot-tests.log")
fi

rm -rf "$setup_logs"
end_phase
step "summary"
printf '%-82s %8s\n' "phase" "seconds"
for i in "${!phase_names[@]}"; do
    printf '%-82s %8s\n' "${phase_names[$i]}" "${phase_secs[$i]}"
done
for row in ${beside[@]+"${beside[@]}"}; do printf '%-82s %8s\n' "${row%:*}" "${row##*:}"; done
printf '%-82s %8s\n' "total" "$SECONDS"
echo
echo "slowest tests (every pytest run above; seconds, phase, test):"
awk '/^=== / { sub(/^=== /, ""); sub(/ \([0-9:]+\)$/, ""); phase = $0 }
     /^[0-9]+\.[0-9]+s (call|setup|teardown) / { printf "%s\t%s\t%s %s\n", phase, $1, $2, $3 }' "$whole_log" \
    | sort -t$'\t' -k2 -rn | head -n 25 | awk -F'\t' '{ printf "  %7s  %-60.60s  %s\n", $2, $1, $3 }'
echo
if [ ${#failed[@]} -gt 0 ]; then
    # the failing tests of every phase and, for each, its first assertion lines
    grep -aE '^(FAILED|ERROR) |^(E   |>       assert)' "$whole_log" | cut -c1-400 | awk '
        /^(FAILED|ERROR) / { print; next }
        /^>/ { n = 0; print "  " $0; next }
        n++ < 4 { print "  " $0 }' | head -n 80
    echo "FAILED: ${failed[*]}"
    rm -f "$whole_log"
    exit 1
fi
rm -f "$whole_log"
echo "all test runs passed"
