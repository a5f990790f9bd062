#!/usr/bin/env bash
# tools/pychroot.sh — run commands under CPython 3.14 / 3.15 (with -dev headers)
# inside a cached Debian unstable chroot. Recipe: DESIGN.md section 7.
#
#   tools/pychroot.sh ensure                  build the chroot if missing (~70 s once)
#   tools/pychroot.sh run VERSION [-- CMD...] run CMD (default: bash) under pythonVERSION
#   tools/pychroot.sh clean                   unmount leftovers and delete the chroot
#
# Needs root (debootstrap, mount, chroot). See tools/README.md for the environment
# variables (PYCHROOT_ROOT, PYCHROOT_SRC, PYCHROOT_COPY, ...).
set -euo pipefail

readonly PROG=pychroot
readonly RECIPE="pychroot-recipe-1"
readonly VERSIONS=(3.14 3.15)
readonly PACKAGES=(python3.14 python3.14-dev python3.14-venv
                   python3.15 python3.15-dev python3.15-venv
                   gcc libc6-dev ca-certificates)
# Host environment variables passed into the chroot as they are (if set).
readonly PASSENV=(http_proxy https_proxy ftp_proxy no_proxy all_proxy
                  HTTP_PROXY HTTPS_PROXY FTP_PROXY NO_PROXY ALL_PROXY
                  TERM COLUMNS LINES CI NO_COLOR FORCE_COLOR PY_COLORS SOURCE_DATE_EPOCH
                  PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_DEFAULT_TIMEOUT
                  PIP_DISABLE_PIP_VERSION_CHECK PIP_NO_CACHE_DIR PIP_PROGRESS_BAR)
readonly CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt  # path inside the chroot
readonly STD_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

SCRIPT_PATH=$(readlink -f "${BASH_SOURCE[0]}")
SCRIPT_DIR=${SCRIPT_PATH%/*}

# ---------------------------------------------------------------- helpers

log() { [[ ${PYCHROOT_QUIET:-0} == 1 ]] || printf '[%s] %s\n' "$PROG" "$*" >&2; }
warn() { printf '[%s] warning: %s\n' "$PROG" "$*" >&2; }
die() { printf '[%s] error: %s\n' "$PROG" "$*" >&2; exit 2; }

usage() {
    cat >&2 <<EOF
usage: tools/pychroot.sh ensure
       tools/pychroot.sh run VERSION [-- CMD [ARGS...]]   (VERSION: ${VERSIONS[*]}; CMD defaults to bash)
       tools/pychroot.sh clean
env:   PYCHROOT_ROOT (default /var/cache/ddprof_nb/chroot-sid), PYCHROOT_SRC (default: repo root),
       PYCHROOT_COPY=1|0 (default 1: copy sources to /build-src; 0: bind-mount them at /src),
       PYCHROOT_MIRROR, PYCHROOT_PASSENV="VAR ...", PYCHROOT_FRESH_VENV=1, PYCHROOT_QUIET=1
EOF
}

now_us() { local t=$EPOCHREALTIME; echo "${t//[.,]/}"; }

# Phase timing: phase_begin NAME ... phase_end. A failure in between is
# reported by the EXIT handler with the phase name and elapsed time.
PHASE="" PHASE_T0=0
phase_begin() { PHASE=$1; PHASE_T0=$(now_us); }
fmt_since() { local d=$(( $(now_us) - $1 )); printf '%d.%01ds' $((d / 1000000)) $((d % 1000000 / 100000)); }
phase_end() { log "$(printf '%-26s %s' "$PHASE" "$(fmt_since "$PHASE_T0")")"; PHASE=""; }

normalize_root() {
    local r=${PYCHROOT_ROOT:-/var/cache/ddprof_nb/chroot-sid}
    [[ $r == /* ]] || die "PYCHROOT_ROOT must be an absolute path (got '$r')"
    [[ $r =~ [[:space:]\\] ]] && die "PYCHROOT_ROOT must not contain whitespace or backslashes"
    r=$(realpath -m -- "$r")
    # refuse obviously dangerous locations: '/', and top-level directories such as /var or /tmp
    [[ $r =~ ^/[^/]+/. ]] || die "refusing PYCHROOT_ROOT='$r' (need at least two path levels)"
    ROOT=$r
    MARKER=$ROOT/.pychroot-ready
    OWNED=$ROOT/.pychroot-owned
    LOCKFILE=$ROOT.lock
    BUILDLOG=$ROOT.build.log
}

need_root() { [[ $EUID -eq 0 ]] || die "must run as root (debootstrap, mount and chroot need it)"; }

LOCK_FD=""
take_lock() {  # take_lock -x|-s
    mkdir -p -- "${ROOT%/*}"
    exec {LOCK_FD}>>"$LOCKFILE"
    if ! flock -n "$1" "$LOCK_FD"; then
        log "waiting for lock $LOCKFILE (another pychroot ensure/run/clean is active)"
        flock "$1" "$LOCK_FD"
    fi
}

# ---------------------------------------------------------------- mounts

# Mount points under ROOT (not ROOT itself), most recently mounted first.
mounts_under_root() {
    local mp
    awk '{print $5}' /proc/self/mountinfo | tac | while IFS= read -r mp; do
        if [[ $mp == *\\* ]]; then  # mountinfo escapes space, tab, newline, backslash as \ooo
            # shellcheck disable=SC2001
            mp=$(printf '%b' "$(sed 's/\\\([0-7][0-7][0-7]\)/\\0\1/g' <<<"$mp")")
        fi
        [[ $mp == "$ROOT"/* ]] && printf '%s\n' "$mp"
    done
    return 0
}

unmount_path() {  # unmount every layer stacked on $1; lazy as a last resort
    local t=$1 i
    for i in 1 2 3 4 5 6; do
        mountpoint -q -- "$t" 2>/dev/null || return 0
        if (( i <= 3 )); then
            umount -- "$t" 2>/dev/null || sleep 0.3
        else
            warn "$t is busy (a process left running inside the chroot?); lazy unmount"
            umount -l -- "$t" 2>/dev/null || true
        fi
    done
    mountpoint -q -- "$t" 2>/dev/null && warn "could not unmount $t"
    return 0
}

# PIDs of processes whose root directory is ROOT (or below it).
chrooted_pids() {
    local d r
    for d in /proc/[0-9]*; do
        r=$(readlink -- "$d/root" 2>/dev/null) || continue
        [[ $r == "$ROOT" || $r == "$ROOT"/* ]] && printf '%s\n' "${d#/proc/}"
    done
    return 0
}

# Stop processes left running inside the chroot (daemons, orphans of the command):
# they would keep the mounts busy. Runs are serialized, so nothing else lives there.
kill_leftovers() {
    local pids i
    mapfile -t pids < <(chrooted_pids)
    (( ${#pids[@]} )) || return 0
    warn "stopping processes left inside the chroot: ${pids[*]}"
    kill -TERM "${pids[@]}" 2>/dev/null
    for i in 1 2 3 4 5 6 7 8 9 10; do
        sleep 0.2
        mapfile -t pids < <(chrooted_pids)
        (( ${#pids[@]} )) || return 0
    done
    kill -KILL "${pids[@]}" 2>/dev/null
    return 0
}

# Unmount everything under ROOT: ours in the order src, sys, dev/shm, dev/pts,
# dev, proc, then anything else found there. Never fails (used from traps).
unmount_all() {
    local t
    kill_leftovers
    for t in src sys dev/shm dev/pts dev proc; do
        unmount_path "$ROOT/$t"
    done
    while IFS= read -r t; do unmount_path "$t"; done < <(mounts_under_root)
    return 0
}

MOUNTED=0
mount_one() {  # mount_one TARGET MOUNT-ARGS... (skip if already a mount point)
    local t=$1; shift
    mkdir -p -- "$t"
    if mountpoint -q -- "$t"; then
        log "already mounted, reusing: $t"
    else
        mount "$@" "$t"
        # If the host's mounts are shared (systemd default), a bind of /dev would be a
        # peer of the host's /dev and our /dev/pts mount would show up on the host too.
        mount --make-private -- "$t"
    fi
}

mount_chroot() {
    MOUNTED=1  # set first: a failure half-way still gets unmounted by the EXIT handler
    mount_one "$ROOT/proc" -t proc proc
    mount_one "$ROOT/dev" --bind /dev
    mount_one "$ROOT/dev/pts" --bind /dev/pts
    if mountpoint -q /dev/shm; then  # POSIX semaphores / multiprocessing need a real /dev/shm
        mount_one "$ROOT/dev/shm" --bind /dev/shm
    fi
    mount_one "$ROOT/sys" -t sysfs sysfs
}

# ---------------------------------------------------------------- exit / signals

CHILD=""
on_exit() {
    local rc=$?
    set +e
    if [[ -n $PHASE && $rc -ne 0 ]]; then
        log "failed in phase '$PHASE' after $(fmt_since "$PHASE_T0") (exit $rc)"
    fi
    if [[ -n $CHILD ]] && kill -0 "$CHILD" 2>/dev/null; then
        kill -TERM "$CHILD" 2>/dev/null; sleep 1; kill -KILL "$CHILD" 2>/dev/null
    fi
    if (( MOUNTED )); then
        unmount_all
        MOUNTED=0
    fi
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- chroot environment

CHROOT_BIN=$(command -v chroot || echo /usr/sbin/chroot)

# Base environment for commands inside the chroot (env -i: nothing else leaks in,
# in particular no host paths such as PIP_FIND_LINKS).
base_env() {
    ENVV=(HOME=/root LANG=C.UTF-8 LC_ALL=C.UTF-8 PATH="$STD_PATH"
          DEBIAN_FRONTEND=noninteractive
          SSL_CERT_FILE="$CA_BUNDLE" SSL_CERT_DIR=/etc/ssl/certs REQUESTS_CA_BUNDLE="$CA_BUNDLE"
          CURL_CA_BUNDLE="$CA_BUNDLE" PIP_CERT="$CA_BUNDLE" PIP_ROOT_USER_ACTION=ignore)
    local v extra=()
    read -r -a extra <<<"${PYCHROOT_PASSENV:-}"
    for v in "${PASSENV[@]}" "${extra[@]}"; do
        [[ $v =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "bad variable name in PYCHROOT_PASSENV: '$v'"
        [[ -n ${!v+set} ]] && ENVV+=("$v=${!v}")
    done
    return 0
}

in_chroot() {  # in_chroot CMD...  (build/venv helper; the lock fd is not inherited)
    env -i "${ENVV[@]}" "$CHROOT_BIN" "$ROOT" "$@" {LOCK_FD}>&-
}

refresh_resolv_conf() {
    if [[ -e /etc/resolv.conf ]]; then
        rm -f -- "$ROOT/etc/resolv.conf"   # never write through a symlink inside ROOT
        cp -L -- /etc/resolv.conf "$ROOT/etc/resolv.conf"
    fi
}

# Copy the host's extra CA certificates (e.g. a TLS-intercepting proxy's CA) into
# the chroot; returns 0 if anything changed (then update-ca-certificates is needed).
sync_certs() {
    local f changed=1 dst=$ROOT/usr/local/share/ca-certificates
    shopt -s nullglob
    local certs=(/usr/local/share/ca-certificates/*.crt)
    shopt -u nullglob
    mkdir -p -- "$dst"
    for f in "${certs[@]}"; do
        if ! cmp -s -- "$f" "$dst/${f##*/}"; then
            cp -- "$f" "$dst/"
            changed=0
        fi
    done
    return $changed
}

# ---------------------------------------------------------------- ensure

is_built() {
    [[ -f $MARKER ]] && [[ $(head -n1 -- "$MARKER") == "$RECIPE" ]] || return 1
    local v
    for v in "${VERSIONS[@]}"; do
        [[ -x $ROOT/usr/bin/python$v && -f $ROOT/usr/include/python$v/Python.h ]] || return 1
    done
}

# Remove ROOT; only after everything under it is unmounted, and only if it looks like ours.
safe_remove_root() {
    [[ -e $ROOT || -L $ROOT ]] || return 0
    unmount_all
    if [[ -n $(mounts_under_root) ]]; then
        die "still mounted under $ROOT, refusing to delete:"$'\n'"$(mounts_under_root)"
    fi
    # (the stamp is written before debootstrap starts, so even a half-built chroot has it)
    if [[ ! -e $OWNED && -n $(ls -A -- "$ROOT" 2>/dev/null) ]]; then
        die "$ROOT does not look like a pychroot chroot (no $OWNED); not deleting it"
    fi
    rm -rf --one-file-system -- "$ROOT"
}

detect_mirror() {
    if [[ -n ${PYCHROOT_MIRROR:-} ]]; then echo "$PYCHROOT_MIRROR"; return; fi
    local m=""
    if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
        m=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
    fi
    if [[ -z $m && -f /etc/apt/sources.list ]]; then
        m=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
            /etc/apt/sources.list)
    fi
    echo "${m:-http://deb.debian.org/debian}"
}

install_debootstrap() {
    command -v debootstrap >/dev/null 2>&1 && return 0
    [[ -x /usr/sbin/debootstrap ]] && return 0
    log "installing debootstrap on the host (apt-get)"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap >>"$BUILDLOG" 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update >>"$BUILDLOG" 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap >>"$BUILDLOG" 2>&1
    fi
}

show_log_tail() {
    [[ -f $BUILDLOG ]] || return 0
    printf '[%s] last lines of %s:\n' "$PROG" "$BUILDLOG" >&2
    tail -n 40 -- "$BUILDLOG" | sed 's/^/    /' >&2
}

build_root() {
    local t0 mirror
    t0=$(now_us)
    : >"$BUILDLOG"
    log "building chroot at $ROOT (log: $BUILDLOG)"

    phase_begin "install debootstrap"
    install_debootstrap || { show_log_tail; exit 1; }
    phase_end

    if [[ -e $ROOT ]]; then
        phase_begin "remove incomplete chroot"
        safe_remove_root
        phase_end
    fi

    phase_begin "debootstrap sid"
    mirror=$(detect_mirror)
    log "mirror: $mirror"
    mkdir -p -- "$ROOT"
    : >"$OWNED"
    local dbs
    dbs=$(command -v debootstrap || echo /usr/sbin/debootstrap)
    "$dbs" --variant=minbase sid "$ROOT" "$mirror" >>"$BUILDLOG" 2>&1 || { show_log_tail; exit 1; }
    phase_end

    phase_begin "configure apt and certs"
    cat >"$ROOT/etc/apt/apt.conf.d/99no-valid-until" <<'EOF'
Acquire::Check-Valid-Until "false";
Acquire::Check-Date "false";
Acquire::Retries "3";
EOF
    sync_certs || true
    refresh_resolv_conf
    base_env
    mount_chroot
    phase_end

    phase_begin "apt-get install pythons"
    {
        in_chroot apt-get update &&
        in_chroot apt-get install -y --no-install-recommends -o Dpkg::Use-Pty=0 "${PACKAGES[@]}" &&
        in_chroot update-ca-certificates
    } >>"$BUILDLOG" 2>&1 || { show_log_tail; exit 1; }
    phase_end

    phase_begin "apt-get clean + unmount"
    in_chroot apt-get clean >>"$BUILDLOG" 2>&1
    unmount_all
    MOUNTED=0
    phase_end

    local v versions=()
    for v in "${VERSIONS[@]}"; do
        versions+=("$(in_chroot "python$v" -c 'import platform; print(platform.python_version())')")
    done
    printf '%s\nbuilt %s\npythons %s\n' "$RECIPE" "$(date -u +%FT%TZ)" "${versions[*]}" >"$MARKER.tmp"
    mv -f -- "$MARKER.tmp" "$MARKER"
    log "chroot ready: python ${versions[*]}, $(du -sh --one-file-system "$ROOT" | cut -f1); total $(fmt_since "$t0")"
}

ensure_locked() {
    phase_begin "ensure (cached check)"
    if is_built; then
        phase_end
        return 0
    fi
    PHASE=""
    [[ -e $ROOT ]] && log "$ROOT exists but is incomplete or from another recipe: rebuilding"
    build_root
}

cmd_ensure() {
    need_root
    take_lock -x
    local t0
    t0=$(now_us)
    ensure_locked
    log "ensure done in $(fmt_since "$t0"): $ROOT"
}

# ---------------------------------------------------------------- run

# skipped in copy mode: VCS/venv/cache/build directories anywhere, top-level build/ and
# dist/, compiled extension modules and objects
SKIP_RE='(^|/)(\.git|__pycache__|\.venv[^/]*|venv|\.tox|\.nox|\.eggs|\.pytest_cache|[^/]*\.egg-info)/|^(build|dist)/|\.(so|pyd|o)$'

list_source_files() {  # NUL-separated paths relative to $SRC, filtered
    local f
    {
        if command -v git >/dev/null 2>&1 && git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
            git -C "$SRC" ls-files -z --cached --others --exclude-standard
        else
            (cd -- "$SRC" && find . -mindepth 1 \( -name .git -o -name node_modules \) -prune \
                -o \( -type f -o -type l \) -printf '%P\0')
        fi
    } | while IFS= read -r -d '' f; do
        [[ -e $SRC/$f || -L $SRC/$f ]] || continue      # deleted but still in the index
        [[ $f =~ $SKIP_RE ]] && continue
        printf '%s\0' "$f"
    done
}

copy_source() {
    local dest=$ROOT/build-src n
    if [[ -n $(mounts_under_root | grep -F -- "$dest" || true) ]]; then
        die "something is mounted under $dest; refusing to delete it"
    fi
    rm -rf --one-file-system -- "$dest"
    mkdir -p -- "$dest"
    list_source_files | tar -C "$SRC" --null --no-recursion -T - -cf - | tar -C "$dest" -xf -
    n=$(find "$dest" -type f | wc -l)
    log "copied $n files from $SRC to /build-src"
}

ensure_venv() {
    local v=$1 venv=/venv-$1
    if [[ ${PYCHROOT_FRESH_VENV:-0} == 1 ]]; then
        log "PYCHROOT_FRESH_VENV=1: recreating $venv"
        rm -f -- "$ROOT$venv/.pychroot-ready"
    fi
    # (bin/python is a symlink to an absolute path inside the chroot: test with -L, not -x)
    [[ -f $ROOT$venv/.pychroot-ready && -f $ROOT$venv/pyvenv.cfg && -L $ROOT$venv/bin/python ]] && return 0
    rm -rf --one-file-system -- "${ROOT:?}$venv"
    local out
    if ! out=$(in_chroot "python$v" -m venv "$venv" 2>&1); then
        printf '%s\n' "$out" >&2; die "python$v -m venv $venv failed"
    fi
    if ! out=$(in_chroot "$venv/bin/python" -m pip install --upgrade pip 2>&1); then
        printf '%s\n' "$out" >&2
        die "pip upgrade in $venv failed (network/proxy? the chroot uses the host's CA certs and proxy variables)"
    fi
    : >"$ROOT$venv/.pychroot-ready"
    log "created $venv ($(in_chroot "$venv/bin/python" -m pip --version | cut -d' ' -f1,2))"
}

cmd_run() {
    local version=${1:-}
    [[ -n $version ]] || { usage; exit 2; }
    shift
    local ok=0 v
    for v in "${VERSIONS[@]}"; do [[ $v == "$version" ]] && ok=1; done
    (( ok )) || die "unknown VERSION '$version' (choose one of: ${VERSIONS[*]})"
    [[ ${1:-} == -- ]] && shift
    (( $# )) || set -- bash
    need_root

    local copy=${PYCHROOT_COPY:-1}
    [[ $copy == 0 || $copy == 1 ]] || die "PYCHROOT_COPY must be 0 or 1"
    SRC=${PYCHROOT_SRC:-}
    if [[ -z $SRC ]]; then
        SRC=$(git -C "$SCRIPT_DIR" rev-parse --show-toplevel 2>/dev/null || realpath -- "$SCRIPT_DIR/..")
    fi
    [[ -d $SRC ]] || die "PYCHROOT_SRC '$SRC' is not a directory"
    SRC=$(realpath -- "$SRC")
    [[ $SRC == "$ROOT" || $SRC == "$ROOT"/* ]] && die "PYCHROOT_SRC must not be inside the chroot"

    # One run at a time: the mounts, /build-src and the venvs are shared state.
    take_lock -x
    local t_all
    t_all=$(now_us)
    ensure_locked

    phase_begin "mount"
    kill_leftovers  # orphans of an earlier run that was killed with SIGKILL
    refresh_resolv_conf
    base_env
    mount_chroot
    if sync_certs; then in_chroot update-ca-certificates >/dev/null 2>&1; fi
    local cwd
    if (( copy )); then
        cwd=/build-src
    else
        cwd=/src
        mount_one "$ROOT/src" --bind "$SRC"
    fi
    phase_end

    if (( copy )); then
        phase_begin "copy source"
        copy_source
        phase_end
    fi

    phase_begin "venv $version"
    ensure_venv "$version"
    phase_end

    local venv=/venv-$version
    ENVV+=(PATH="$venv/bin:$STD_PATH" VIRTUAL_ENV="$venv")
    # bind mode: keep foreign-ABI byte code out of the host tree
    (( copy )) || ENVV+=(PYTHONPYCACHEPREFIX=/tmp/pycache)

    log "run python$version in $cwd: $*"
    phase_begin "command"
    # Background + wait so that TERM/HUP reach the command (and we still unmount
    # afterwards); stdin is passed on explicitly. Terminal Ctrl-C reaches the command
    # through the process group, so INT is not forwarded (it would arrive twice).
    local in_fd rc
    if [[ -e /proc/self/fd/0 ]]; then exec {in_fd}<&0; else exec {in_fd}</dev/null; fi
    # bash starts background commands with SIGINT/SIGQUIT ignored: reset them (env
    # --default-signal, coreutils >= 8.31), or Ctrl-C would not reach the command and
    # Python would not raise KeyboardInterrupt.
    local sigreset=()
    # shellcheck disable=SC2054  # the comma is part of the option
    env --default-signal=INT true 2>/dev/null && sigreset=(--default-signal=INT,QUIT)
    # shellcheck disable=SC2016  # $1/$@ are expanded by the inner sh
    env -i "${sigreset[@]}" "${ENVV[@]}" "$CHROOT_BIN" "$ROOT" /bin/sh -c 'cd "$1" || exit 125; shift; exec "$@"' \
        pychroot "$cwd" "$@" <&"$in_fd" {in_fd}<&- {LOCK_FD}>&- &
    CHILD=$!
    exec {in_fd}<&-
    trap 'kill -TERM "$CHILD" 2>/dev/null || true' TERM
    trap 'kill -HUP "$CHILD" 2>/dev/null || true' HUP
    trap ':' INT
    while :; do
        wait "$CHILD" && rc=0 || rc=$?
        kill -0 "$CHILD" 2>/dev/null || break
    done
    CHILD=""
    trap 'exit 129' HUP
    trap 'exit 130' INT
    trap 'exit 143' TERM
    PHASE="command (exit $rc)"
    phase_end

    phase_begin "unmount"
    unmount_all
    MOUNTED=0
    phase_end
    log "run total $(fmt_since "$t_all")"
    return "$rc"
}

# ---------------------------------------------------------------- clean

cmd_clean() {
    need_root
    take_lock -x
    phase_begin "clean"
    safe_remove_root
    rm -f -- "$BUILDLOG"
    phase_end
    log "removed $ROOT"
}

# ---------------------------------------------------------------- main

main() {
    local cmd=${1:-}
    (( $# )) && shift
    case $cmd in
        ensure) (( $# == 0 )) || { usage; exit 2; }; normalize_root; cmd_ensure ;;
        run) normalize_root; cmd_run "$@" ;;
        clean) (( $# == 0 )) || { usage; exit 2; }; normalize_root; cmd_clean ;;
        -h|--help|help) usage ;;
        *) usage; exit 2 ;;
    esac
}

main "$@"
