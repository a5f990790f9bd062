#!/usr/bin/env bash
# The interpreter-dependent tests on CPython 3.14 and 3.15 (a Debian sid chroot, see
# tools/README.md), both engines: the native engine supports 3.14 and 3.15.
#
#   bash scripts/test_chroot.sh                 # 3.14 and 3.15
#   CHROOT_PYTHONS=3.15 bash scripts/test_chroot.sh
#   bash scripts/test_chroot.sh --prepare       # only build the chroot and install each venv's
#       dependencies (scripts/test.sh does it in the background while other phases run)
#
# Per version, inside the chroot: pip install -e ".[dev]" (the native part may fail to
# compile: the install must still succeed, and the native engine must then say it is
# unavailable), then pytest on tests/unit (the last version only: it is pure Python) and the
# tests marked internals (tests/native and the integration modules tests/conftest.py names;
# without the native engine, the python engine's tests only), then (native engine) the
# strict accuracy goals of benchmarks/bench_cpu.py (+-3 points; a
# miss fails the version).  A version the native engine claims to support
# (ddprof_nb.engines.native.binding.SUPPORTED) whose native engine is unavailable anyway (module not
# built, layout refused) is a failure (native=MISSING, rc 4), not a silent skip.  The
# time of each phase is printed, and a summary at the end; the exit code is non-zero if
# any phase failed.
# Needs root (tools/pychroot.sh mounts and chroots).  `--inside` is the part that
# runs in the chroot.
set -uo pipefail

now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ------------------------------------------------------------------ inside the chroot
inside() {
    local v log t rc=0 native_ok=0 native_reason
    v=$(python -c 'import platform; print(platform.python_version())')
    log=/tmp/ddprof_nb-install-$v.log
    # the tests' C extensions, compiled once for this version's pytest runs (tests/c_extensions.py)
    export DDPROF_NB_TEST_EXT_CACHE
    DDPROF_NB_TEST_EXT_CACHE=$(mktemp -d)
    echo "--- python $v ($(command -v python)) in $(pwd)"

    t=$(now)
    echo "--- install: pip install -e .[dev] (log: chroot:$log)"
    if ! python -m pip install --disable-pip-version-check -v -e ".[dev]" >"$log" 2>&1; then
        tail -n 40 "$log"
        echo "PHASE install: FAILED after $(since "$t") s"
        echo "@@summary $v install=$(since "$t") tests=- native=install-failed rc=3"
        return 3
    fi
    local install_s
    install_s=$(since "$t")
    echo "PHASE install: $install_s s"
    if grep -q "native sampler could not be built" "$log"; then
        echo "native part did not compile (the install went on without it):"
        grep -E "native sampler could not be built|error:" "$log" | grep -v "^ *warning" | head -n 12 | sed 's/^/    /'
    fi
    # dependencies pip had to build from source (no wheel for this Python)
    local built
    built=$(grep -oE "Building wheel for [A-Za-z0-9_.-]+" "$log" | awk '{print $4}' | grep -vx "ddprof_nb" | sort -u | tr '\n' ' ')
    [[ -n $built ]] && echo "built from source (no wheel for $v): $built"
    python -m pip list --disable-pip-version-check --format=freeze 2>/dev/null \
        | grep -iE '^(numpy|plotly|ipywidgets|anywidget|cffi|ipython|ipykernel|pyzmq|psutil|debugpy|tornado|pytest)==' \
        | tr '\n' ' ' | sed 's/^/versions: /'; echo

    native_reason=$(python - <<'EOF'
try:
    import ddprof_nb._native  # noqa: F401
    built = "module built"
except Exception as exc:  # noqa: BLE001
    built = f"module not built ({type(exc).__name__})"
try:
    from ddprof_nb.engines.native import NativeEngine
    reason = NativeEngine.unavailable_reason()
except Exception as exc:  # noqa: BLE001
    reason = f"engines/native/ failed to import: {type(exc).__name__}: {exc}"
print(f"{built}; " + ("native engine available" if reason is None else f"native engine unavailable: {reason}"))
EOF
)
    echo "native: $native_reason"
    [[ $native_reason == "module built; native engine available" ]] && native_ok=1
    # does the native engine claim this version?  (the binding's SUPPORTED table, GIL builds)
    local claimed
    claimed=$(python -c 'import sys, sysconfig
from ddprof_nb.engines.native.binding import SUPPORTED
print(int(sys.version_info[:2] in SUPPORTED and not sysconfig.get_config_var("Py_GIL_DISABLED")))' 2>/dev/null || echo 0)
    local native_rc=0
    if (( claimed && !native_ok )); then
        echo "NATIVE MISSING: the native engine claims CPython $v but is unavailable here: $native_reason"
        grep -E "native sampler could not be built|error:" "$log" | grep -v "^ *warning" | head -n 12 | sed 's/^/    /'
        native_rc=4
    fi

    # what depends on the interpreter (tests marked internals: tests/native and the modules
    # tests/conftest.py names); without the native engine, the python engine's tests only
    local targets=(tests --ignore=tests/unit) expr="internals and not browser and not c_variant and not chroot"
    if (( !native_ok )); then
        targets=(tests/integration/test_api_python_engine.py tests/integration/test_python_engine.py
                 tests/integration/test_python_engine_threads.py tests/integration/test_engine_choice.py)
        expr="not browser"
    fi
    t=$(now)
    # tests/unit is pure Python and keeps no time: both cores at once (pytest-xdist); the
    # rest samples and keeps time: the tests marked alone one at a time, then the others
    # two at a time
    if (( unit )); then
        echo "--- tests: pytest -n 2 tests/unit, then pytest ${targets[*]} -m '$expr'"
        python -m pytest -q -p no:cacheprovider --durations=15 --durations-min=1 -n 2 tests/unit || rc=$?
    else
        echo "--- tests: pytest ${targets[*]} -m '$expr' (tests/unit: on the newest version only)"
    fi
    local r
    python -m pytest -q -p no:cacheprovider --durations=15 --durations-min=1 -m "($expr) and alone" "${targets[@]}"
    r=$?; [[ $r -eq 0 || $r -eq 5 ]] || rc=$r
    python -m pytest -q -p no:cacheprovider --durations=15 --durations-min=1 -n 2 -m "($expr) and not alone" "${targets[@]}"
    r=$?; [[ $r -eq 0 ]] || rc=$r
    rm -rf "$DDPROF_NB_TEST_EXT_CACHE"
    local tests_s
    tests_s=$(since "$t")
    echo "PHASE tests: $tests_s s (pytest exit $rc)"
    [[ $rc -eq 5 ]] && echo "pytest ran no test: counted as a failure"

    # the strict accuracy goals (+-3 points: cpu 60/30/10, thread split, wall per thread)
    local accuracy="-" acc_rc=0
    if (( native_ok )) && [[ -e benchmarks/bench_cpu.py ]]; then
        t=$(now)
        echo "--- accuracy: native engine, benchmarks/bench_cpu.py --sections accuracy --strict"
        local acc_out
        acc_out=$(python benchmarks/bench_cpu.py --sections accuracy --tools ddprof --strict 2>&1) || acc_rc=$?
        echo "$acc_out" | grep -E "^\| ddprof_nb|goals met"
        accuracy=$(grep -oE "[0-9]+/[0-9]+ goals met" <<<"$acc_out" | tail -n1 | awk '{print $1}')
        accuracy=${accuracy:-none}
        echo "PHASE accuracy: $(since "$t") s (exit $acc_rc)"
    fi
    local native_word=unavailable
    (( native_ok )) && native_word=available
    (( native_rc )) && native_word=MISSING
    local final=$(( rc != 0 ? rc : native_rc != 0 ? native_rc : acc_rc ))
    echo "@@summary $v install=$install_s tests=$tests_s accuracy=$accuracy native=$native_word rc=$final"
    return "$final"
}

if [[ ${1:-} == --inside-deps ]]; then  # the venv's dependencies, without the project
    reqs=$(mktemp)
    python scripts/requirements_of.py dev >"$reqs" && python -m pip install -q --disable-pip-version-check -r "$reqs"
    rc=$?
    rm -f "$reqs"
    exit $rc
fi
if [[ ${1:-} == --inside ]]; then
    unit=0
    [[ ${2:-} == --unit ]] && unit=1
    inside
    exit $?
fi

# ------------------------------------------------------------------ on the host
cd "$(dirname "$0")/.." || exit 2
PYTHONS=${CHROOT_PYTHONS:-"3.14 3.15"}
status=0
summaries=()
t_all=$(now)

t=$(now)
echo "=== chroot: tools/pychroot.sh ensure ($(date +%T))"
if ! bash tools/pychroot.sh ensure; then
    echo "PHASE chroot: FAILED after $(since "$t") s"
    exit 2
fi
chroot_s=$(since "$t")
echo "PHASE chroot: $chroot_s s"

if [[ ${1:-} == --prepare ]]; then
    for v in $PYTHONS; do
        t=$(now)
        echo "=== python $v in the chroot: dependencies ($(date +%T))"
        bash tools/pychroot.sh run "$v" -- bash scripts/test_chroot.sh --inside-deps || status=1
        echo "PHASE dependencies of $v: $(since "$t") s"
    done
    exit $status
fi

# tests/unit is pure Python, none of it version-dependent (3.11 runs it too): on the last
# version only; the native, python-engine and remote tests run on every version
last=${PYTHONS##* }
for v in $PYTHONS; do
    t=$(now)
    echo
    echo "=== python $v in the chroot ($(date +%T))"
    out=$(mktemp)
    unit_arg=()
    [[ $v == "$last" ]] && unit_arg=(--unit)
    bash tools/pychroot.sh run "$v" -- bash scripts/test_chroot.sh --inside "${unit_arg[@]}" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    line=$(grep -E "^@@summary " "$out" | tail -n1)
    rm -f "$out"
    [[ -n $line ]] || line="@@summary $v install=- tests=- accuracy=- native=? rc=$rc"
    summaries+=("${line#@@summary } total=$(since "$t")")
    echo "PHASE python $v total: $(since "$t") s (exit $rc)"
    (( rc != 0 )) && status=1
done

echo
echo "=== summary (chroot ensure ${chroot_s} s; all $(since "$t_all") s)"
printf '%-8s %-8s %-10s %-10s %-9s %-12s %s\n' version result install_s tests_s accuracy native total_s
for s in "${summaries[@]}"; do
    declare -A f=()
    read -r ver rest <<<"$s"
    for kv in $rest; do f[${kv%%=*}]=${kv#*=}; done
    result=passed
    [[ ${f[rc]} == 0 ]] || result="FAILED(${f[rc]})"
    printf '%-8s %-8s %-10s %-10s %-9s %-12s %s\n' "$ver" "$result" "${f[install]}" "${f[tests]}" \
        "${f[accuracy]:--}" "${f[native]}" "${f[total]}"
    unset f
done
exit $status
