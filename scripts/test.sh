#!/usr/bin/env bash
# Set up everything the tests need on a fresh machine and run them all.
#   bash scripts/test.sh            # the whole suite (what CI runs)
#   PYTHONS="3.11" bash scripts/test.sh   # fewer interpreters while developing
#   REPEAT=3 bash scripts/test.sh   # the pytest phases 3 times (after all installs; the
#       sanitizer and chroot phases once), then every test that failed in any run, with its run
#   SLOTS=1 bash scripts/test.sh    # one phase at a time in the block run beside each other
# Each interpreter gets its own venv under .venvs/ with ddprof_nb installed (native
# part compiled for that version).  3.11 runs everything; 3.12 and 3.13 run the parts
# that depend on the interpreter (native, integration without the browser); the
# pure-Python unit tests run on 3.11 and, in the chroot, on 3.15.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHONS=${PYTHONS:-"3.11 3.12 3.13"}
failed=()
# everything printed is kept, so that the summary can end with each failure's reason (CI
# shows the tail of long outputs)
whole_log=$(mktemp)
exec > >(tee "$whole_log") 2>&1
step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)"; }

python_for() {  # the interpreter binary for a version: pyenv's, else python3.X on PATH
    local v=$1 prefix
    if command -v pyenv >/dev/null 2>&1; then
        prefix=$(pyenv prefix "$(pyenv versions --bare | grep -E "^${v//./\\.}(\.[0-9]+)?$" | sort -V | tail -1)" 2>/dev/null) \
            && [ -x "$prefix/bin/python3" ] && { echo "$prefix/bin/python3"; return; }
    fi
    command -v "python$v"
}

# The tests run in two blocks.  Beside: every phase's tests not marked `alone` (their counts
# and presence checks hold at load 10 on 2 cores), at most $SLOTS phases at once, each on
# both cores (pytest-xdist), and the notebook and browser tests as two more phases
# (downloads, builds, Chromium: presence checks, their times printed).  Alone: the `alone`
# tests (shares, rates, per-tick counts, the overhead and accuracy figures), one phase and
# one test at a time, nothing beside.  Two phases at once, not three: with three (six pytest
# workers and the notebooks' kernels on 2 cores, load 10-18) threads went unscheduled long
# enough for sessions of a few hundred ms to keep no CPU sample.
SLOTS=${SLOTS:-2}
PYTEST=(-q -p no:cacheprovider)
LANE=(tests/integration/test_binder.py tests/integration/test_notebooks.py)
BROWSER=tests/integration/test_browser.py
host_tests() {  # the sampling tests of version $1 (pytest arguments; -m comes after)
    if [ "$1" = "3.11" ]; then
        echo "tests --ignore=tests/unit ${LANE[*]/#/--ignore=} --ignore=$BROWSER"
    else
        # (tests/unit is pure Python: 3.11 here and 3.15 in the chroot run it; the coexistence
        # matrix, whose cells are the same Python on every version, runs on 3.11; the browser
        # and the slow notebook tests on 3.11)
        echo "tests/native tests/integration tests/coexist/test_coexist_repros.py tests/coexist/test_coexist_lifecycle.py"
    fi
}
host_marks() { if [ "$1" = "3.11" ]; then echo ""; else echo "not browser and not slow and "; fi; }
beside_part() {  # version $1: its tests not marked alone, both cores
    local v=$1 py="$ROOT/.venvs/$1/bin/python" rc=0
    [ "$v" != "3.11" ] || "$py" -m pytest "${PYTEST[@]}" -n 2 tests/unit || rc=$?
    # shellcheck disable=SC2046
    "$py" -m pytest "${PYTEST[@]}" -n 2 $(host_tests "$v") -m "$(host_marks "$v")not alone" || rc=$?
    return $rc
}
notebooks_part() {  # 3.11: every notebook run headless, in the binder venv and the quick start's
    "$ROOT/.venvs/3.11/bin/python" -m pytest "${PYTEST[@]}" "${LANE[@]}"
}
browser_part() {  # 3.11: JupyterLab and Chromium (one server and one browser for the module)
    "$ROOT/.venvs/3.11/bin/python" -m pytest "${PYTEST[@]}" "$BROWSER"
}
alone_part() {  # version $1: its `alone` tests, one at a time
    local v=$1
    # shellcheck disable=SC2046
    "$ROOT/.venvs/$v/bin/python" -m pytest "${PYTEST[@]}" $(host_tests "$v") -m "$(host_marks "$v")alone"
}
sanitize_beside() { bash scripts/test_sanitize.sh -m "not alone" -n 2; }
sanitize_alone() { bash scripts/test_sanitize.sh --no-build -m alone; }
chroot_part() {  # $1: beside or alone (test_chroot.sh's CHROOT_PART)
    if [ -n "$chroot_pid" ] && [ "$1" = beside ]; then
        # the background build (a job of the main shell: waited for by polling), then its
        # output (test_chroot.sh's own ensure then finds it built, or retries and reports)
        while kill -0 "$chroot_pid" 2>/dev/null; do sleep 2; done
        cat "$setup_logs/chroot.log"
    fi
    CHROOT_PART=$1 bash scripts/test_chroot.sh
}

# enqueue NAME FUNCTION ARGS... (no spaces inside an argument), then run_queue: the queued
# jobs, at most $SLOTS at once, each one's output printed whole when it ends; failures go to
# failed+=, and each job's output is kept as $logs/run<N>-NAME.log for the REPEAT summary
queue=()
enqueue() { queue+=("$*"); }
run_queue() {  # $1: the run's label (REPEAT)
    local label=$1 running=0 job name pid rc
    local -A name_of=() t0_of=()
    while [ ${#queue[@]} -gt 0 ] || [ $running -gt 0 ]; do
        while [ ${#queue[@]} -gt 0 ] && [ $running -lt "$SLOTS" ]; do
            job=${queue[0]}; queue=("${queue[@]:1}")
            name=${job%% *}
            echo "started: $name ($(date +%T))"
            ( ${job#* } ) >"$logs/$label-$name.log" 2>&1 &
            name_of[$!]=$name; t0_of[$!]=$SECONDS; running=$((running + 1))
        done
        # (the jobs' pids only: the chroot's background build is a child of this shell too)
        wait -n -p pid "${!name_of[@]}"; rc=$?
        running=$((running - 1))
        name=${name_of[$pid]}
        unset "name_of[$pid]"
        printf '\n--- %s: exit %s after %s s (%s)\n' "$name" "$rc" $((SECONDS - t0_of[$pid])) "$(date +%T)"
        cat "$logs/$label-$name.log"
        [ $rc -eq 0 ] || failed+=("$name$([ "$label" = run1 ] || echo "-$label")(rc=$rc)")
    done
}
run_alone() {  # $1: the run's label, $2: name, the rest: the command
    local label=$1 name=$2 t0=$SECONDS rc
    shift 2
    printf '\n--- %s (%s)\n' "$name" "$(date +%T)"
    "$@" 2>&1 | tee "$logs/$label-$name.log"
    rc=${PIPESTATUS[0]}
    echo "--- $name: exit $rc after $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || failed+=("$name$([ "$label" = run1 ] || echo "-$label")(rc=$rc)")
}
run_tests() {  # one run of every test phase: $1 = its number, $2 = 1 to include ASan and the chroot
    local run=$1 once=$2 v
    step "run $run: the tests beside each other (at most $SLOTS phases at once, each on both cores)"
    [[ " ${ready[*]-} " == *" 3.11 "* ]] && enqueue notebooks-3.11 notebooks_part
    for v in ${ready[@]+"${ready[@]}"}; do enqueue "tests-$v" beside_part "$v"; done
    [[ " ${ready[*]-} " == *" 3.11 "* ]] && enqueue browser-3.11 browser_part
    [ "$once" = 1 ] && [ $sanitize = 1 ] && enqueue sanitizers sanitize_beside
    [ "$once" = 1 ] && [ -n "$chroot" ] && enqueue chroot-3.14-3.15 chroot_part beside
    run_queue "run$run"
    step "run $run: the tests marked alone, one at a time"
    for v in ${ready[@]+"${ready[@]}"}; do run_alone "run$run" "alone-$v" alone_part "$v"; done
    [ "$once" = 1 ] && [ $sanitize = 1 ] && run_alone "run$run" sanitizers-alone sanitize_alone
    [ "$once" = 1 ] && [ -n "$chroot" ] && run_alone "run$run" chroot-3.14-3.15-alone chroot_part alone
}
ready=()  # versions whose venv is ready, tested after all installs
if [ -n "${REPEAT:-}" ] && ! [[ $REPEAT =~ ^[1-9][0-9]*$ ]]; then
    echo "REPEAT must be a positive integer (got '$REPEAT')"; exit 2
fi

step "system packages"
need=()
command -v go >/dev/null 2>&1 || need+=(golang-go)
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "${need[@]}"; }) \
        || echo "WARNING: could not install ${need[*]}"
fi

extras_for() { if [ "$1" = "3.11" ]; then echo "dev,coexist,browser,bench,dask"; else echo "dev,coexist"; fi; }
sanitize=0
[ "${RUN_SANITIZERS:-1}" = 1 ] && [[ " $PYTHONS " == *" 3.11 "* ]] && sanitize=1

# The installs are mostly downloads and unpacking: every venv's dependencies at once (and the
# chroot of the 3.14/3.15 phase, built in the background until that phase), then the project
# itself built into each venv one after another (the builds share ./build).
setup_logs=$(mktemp -d)
chroot_pid=
if [ "${RUN_CHROOT:-1}" = 1 ] && [ "$(id -u)" = 0 ]; then
    bash tools/pychroot.sh ensure >"$setup_logs/chroot.log" 2>&1 &
    chroot_pid=$!
fi
step "venvs and dependencies of $PYTHONS$([ $sanitize = 1 ] && echo " and the sanitizer venv"), at once"
deps_pids=()
for v in $PYTHONS $([ $sanitize = 1 ] && echo asan-3.11); do
    py=$(python_for "${v#asan-}") || continue  # reported below
    venv="$ROOT/.venvs/$v"
    extras=$(extras_for "$v")
    (
        [ -x "$venv/bin/python" ] || "$py" -m venv "$venv" || exit 1
        "$venv/bin/python" scripts/requirements_of.py "$extras" >"$setup_logs/$v.txt" || exit 1
        "$venv/bin/pip" install -q --disable-pip-version-check -r "$setup_logs/$v.txt"
    ) >"$setup_logs/$v.log" 2>&1 &
    deps_pids+=("$!:$v")
done
for pv in ${deps_pids[@]+"${deps_pids[@]}"}; do
    # a failure here shows again, and counts, in that venv's install of the project below
    wait "${pv%%:*}" || { echo "dependencies of ${pv#*:} failed:"; grep -v "^WARNING: Location" "$setup_logs/${pv#*:}.log" | tail -n 20; }
done
echo "dependencies installed ($(date +%T))"

for v in $PYTHONS; do
    step "python $v: venv and install"
    py=$(python_for "$v") || { echo "python $v not found"; failed+=("python$v-missing"); continue; }
    venv="$ROOT/.venvs/$v"
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    extras=$(extras_for "$v")
    if ! DDPROF_NB_REQUIRE_NATIVE=1 "$venv/bin/pip" install -q --disable-pip-version-check -e ".[$extras]" 2>&1 \
        | grep -v "^WARNING: Location"; then :; fi
    "$venv/bin/python" -c "import ddprof_nb._native" || { failed+=("build-$v"); continue; }
    # a regular (non-editable) `pip install .`, imported from outside the source tree
    target=$(mktemp -d)
    if DDPROF_NB_REQUIRE_NATIVE=1 "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --target "$target" . \
        >/dev/null 2>&1 && (cd / && PYTHONPATH="$target" "$venv/bin/python" -c \
        "import ddprof_nb, ddprof_nb.engines.native.binding as b; assert ddprof_nb.__file__.startswith('$target'), ddprof_nb.__file__; assert b.unavailable_reason() is None, b.unavailable_reason(); print('pip install . on', '$v', 'ok')"); then :
    else failed+=("pip-install-$v"); fi
    rm -rf "$target"
    ready+=("$v")
done

chroot=
if [ "${RUN_CHROOT:-1}" = 1 ] && [ "$(id -u)" = 0 ]; then chroot=1; fi
logs=$(mktemp -d)
runs=${REPEAT:-1}
for ((run = 1; run <= runs; run++)); do
    run_tests "$run" $([ $run = 1 ] && echo 1 || echo 0)
done
if [ -n "${REPEAT:-}" ]; then
    # every run's failures, read from pytest's short summary (FAILED/ERROR lines)
    step "tests that failed in any of the $REPEAT runs"
    grep -E '^(FAILED|ERROR) ' "$logs"/*.log | cut -c1-300 | sed "s|^$logs/||" || echo "none"
fi
rm -rf "$logs"

rm -rf "$setup_logs"
step "summary"
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
