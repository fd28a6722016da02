#!/usr/bin/env bash
# Runs this repository's quick tests (`pytest -m "not slow"`) on Linux aarch64
# under emulation (qemu-user), as a reader on a Graviton or Ampere machine
# would run them, and prints a one-line verdict.
#
# It builds (once) a Debian 12 (bookworm) arm64 root file system with
# debootstrap, with python3 (3.11), python3-venv, python3-dev, gcc, libgomp1
# and git from Debian, and keeps it in a cache folder. Each run then mounts
# proc, sys, dev and this repository (read-only) into it, installs the locked
# environment there (`uv sync --locked` with Debian's Python, no downloaded
# Python, PyPI's aarch64 wheels; the host's CA bundle, proxy and index
# settings are carried in), runs the tests and removes every mount it made,
# also when interrupted or stopped by its time limit.
#
# Time: emulated code runs several times slower than native and torch's
# matrix work far slower still, so by default the tests that take over a
# minute each there (marked heavy_under_emulation, measured with --durations
# on a 2-core VM: inductor's C++ compile, commands that start a new Python
# and load a model, torch's bf16 products in the real shapes) are
# deselected, and a time limit (30 min) stops pytest with the counts so
# far, reported as INCOMPLETE, never as a pass. --all keeps every not-slow
# test. Before the tests it prints which native decode step
# they meet (the C kernels built for this CPU, or torch's matmul); the
# verdict names it too.
#
# Needs: root on a Debian or Ubuntu host (installs debootstrap,
# qemu-user-static and binfmt-support with apt-get where missing), Debian's
# package mirror and PyPI. Not part of .ci/run. One run at a time (a lock).
#
# Usage (from anywhere):
#   sudo scripts/check_arm64.sh                 # build or reuse, then test
#   sudo scripts/check_arm64.sh --minutes 45    # another time limit (0: none)
#   sudo scripts/check_arm64.sh --all           # the heavy ones too
#   sudo scripts/check_arm64.sh --rebuild       # a fresh root file system
#   sudo scripts/check_arm64.sh -- tests/fast   # other pytest arguments
# Options: --cache DIR (or CHECK_ARM64_CACHE; default
# /var/cache/qwen3-ch02-arm64: the root file system, uv's cache and the last
# log, last-run.log), --mirror URL (or CHECK_ARM64_MIRROR; default
# http://deb.debian.org/debian). Exit status 0 only if every test ran and
# passed; 1 for failures or the time limit; 2 for a set-up problem.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cache="${CHECK_ARM64_CACHE:-/var/cache/qwen3-ch02-arm64}"
mirror="${CHECK_ARM64_MIRROR:-http://deb.debian.org/debian}"
minutes=30
rebuild=0
all=0
pytest_args=()

while [[ $# -gt 0 ]]; do
    case "$1" in
        --cache) cache="$2"; shift 2 ;;
        --mirror) mirror="$2"; shift 2 ;;
        --minutes) minutes="$2"; shift 2 ;;
        --rebuild) rebuild=1; shift ;;
        --all) all=1; shift ;;
        --) shift; pytest_args=("$@"); break ;;
        -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
        *) echo "check_arm64: unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done

die() { echo "check_arm64: error: $*" >&2; exit 2; }
say() { echo "== $*"; }

[[ "$minutes" =~ ^[0-9]+$ ]] || die "--minutes takes a whole number, not '$minutes'"
[[ $(id -u) == 0 ]] || die "run as root (it mounts file systems and chroots): sudo $0"
command -v apt-get >/dev/null || die "needs a Debian or Ubuntu host (apt-get)"
[[ $(uname -m) == x86_64 || $(uname -m) == aarch64 ]] \
    || die "tested on x86-64 hosts only (this is $(uname -m))"

mkdir -p "$cache"
cache="$(cd "$cache" && pwd -P)"
rootfs="$cache/rootfs"
partial="$cache/rootfs.partial"
log="$cache/last-run.log"
exec 9>"$cache/lock"
flock -n 9 || die "another check_arm64 run holds $cache/lock"

# --- cleanup: every mount under the cache, our binfmt entry, our mounts ----

own_binfmt=""      # the binfmt_misc entry this run registered, if any
own_binfmt_fs=0    # 1 if this run mounted binfmt_misc itself
mounts_under() {   # mount points at or below $1, deepest first
    awk -v top="$1" '$5 == top || index($5, top "/") == 1 { print $5 }' \
        /proc/self/mountinfo | sort -r
}
stop_chroot_processes() {  # processes whose root is inside the cache
    local p root
    for p in /proc/[0-9]*; do
        root="$(readlink "$p/root" 2>/dev/null)" || continue
        if [[ "$root" == "$cache/"* ]]; then kill -KILL "${p#/proc/}" 2>/dev/null || true; fi
    done
}
stop_group() {  # the process group of a job this run started
    local i
    kill -TERM -- "-$1" 2>/dev/null || return 0
    for i in 1 2 3 4 5; do kill -0 -- "-$1" 2>/dev/null || return 0; sleep 1; done
    kill -KILL -- "-$1" 2>/dev/null || true
}
cleanup() {
    local rc=$? m tries
    # Nothing may stop the cleanup: not a failing command, not a closed
    # pipe (Ctrl-C also ends a `| tee` reading this output), not a signal.
    set +e
    trap '' PIPE INT TERM HUP
    if [[ -n "$child" ]]; then stop_group "$child"; fi
    stop_chroot_processes
    for tries in 1 2 3 4 5; do
        [[ -z "$(mounts_under "$cache")" ]] && break
        sleep 1
        for m in $(mounts_under "$cache"); do umount "$m" 2>/dev/null || true; done
    done
    for m in $(mounts_under "$cache"); do
        echo "check_arm64: $m busy, detached lazily" >&2
        umount --lazy "$m" || true
    done
    if [[ -n "$own_binfmt" && -e "/proc/sys/fs/binfmt_misc/$own_binfmt" ]]; then
        echo -1 >"/proc/sys/fs/binfmt_misc/$own_binfmt"
    fi
    if [[ $own_binfmt_fs == 1 ]]; then umount /proc/sys/fs/binfmt_misc || true; fi
    exit "$rc"
}
trap cleanup EXIT
stopped() { trap '' PIPE; echo "check_arm64: $1" >&2 || true; exit "$2"; }
trap 'stopped interrupted 130' INT
trap 'stopped terminated 143' TERM HUP

# Long commands run as jobs (set -m: each in a process group of its own,
# SIGINT not ignored) and are waited for, so that a signal reaches the trap
# at once and the trap can stop the job's whole group.
set -m
child=""
run() {
    local st=0
    "$@" &
    child=$!
    wait "$child" || st=$?
    child=""
    return "$st"
}

# --- host tools and the aarch64 binary handler -----------------------------

host_packages() {
    local missing=()
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    [[ -x /usr/bin/qemu-aarch64-static ]] || missing+=(qemu-user-static)
    dpkg -s binfmt-support >/dev/null 2>&1 || missing+=(binfmt-support)
    [[ ${#missing[@]} == 0 ]] && return
    say "installing ${missing[*]} on the host"
    run apt-get update -qq
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
}

AARCH64_MAGIC='7f454c460201010000000000000000000200b700'
AARCH64_MASK='ffffffffffffff00fffffffffffffffffeffffff'
hex_escaped() { sed 's/../\\x&/g' <<<"$1"; }

# Prints the interpreter of an enabled aarch64 entry and its flags, if any.
aarch64_handler() {
    local f
    for f in /proc/sys/fs/binfmt_misc/*; do
        [[ -f "$f" && $(basename "$f") != register && $(basename "$f") != status ]] || continue
        grep -qx enabled "$f" && grep -qx "magic $AARCH64_MAGIC" "$f" || continue
        echo "$(sed -n 's/^interpreter //p' "$f") $(sed -n 's/^flags: //p' "$f")"
        return
    done
}

binfmt() {
    if [[ ! -e /proc/sys/fs/binfmt_misc/register ]]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
        own_binfmt_fs=1
    fi
    local interp flags
    read -r interp flags <<<"$(aarch64_handler)"
    if [[ -z "$interp" ]]; then
        # F: the kernel opens the interpreter now, the chroot needs no copy.
        interp=/usr/libexec/qemu-binfmt/aarch64-binfmt-P flags=PF
        [[ -x "$interp" ]] || interp=/usr/bin/qemu-aarch64-static flags=F
        own_binfmt="qemu-aarch64-check-arm64"
        printf ':%s:M::%s:%s:%s:%s\n' "$own_binfmt" "$(hex_escaped $AARCH64_MAGIC)" \
            "$(hex_escaped $AARCH64_MASK)" "$interp" "$flags" \
            >/proc/sys/fs/binfmt_misc/register
        say "registered $interp for aarch64 binaries (removed at the end)"
    elif [[ "$flags" != *F* ]]; then
        copy_interpreter=$interp  # the chroot needs its own copy
    fi
}
copy_interpreter=""

# --- the root file system ----------------------------------------------------

PACKAGES=python3,python3-venv,python3-dev,gcc,libgomp1,git,ca-certificates

build_rootfs() {
    [[ -z "$(mounts_under "$partial")" ]] || die "$partial still has mounts"
    rm -rf --one-file-system "$partial"
    say "debootstrap: Debian 12 arm64 with $PACKAGES into $partial (about 15 min)"
    run debootstrap --arch=arm64 --variant=minbase --include="$PACKAGES" \
        bookworm "$partial" "$mirror" >"$cache/debootstrap.log" 2>&1 \
        || die "debootstrap failed; see $cache/debootstrap.log"
    mv "$partial" "$rootfs"
}

bind() {  # bind <source> <target inside rootfs> [ro]
    mkdir -p "$rootfs$2"
    mount --bind "$1" "$rootfs$2"
    [[ "${3:-}" != ro ]] || mount -o remount,bind,ro "$rootfs$2"
}

mount_all() {
    mount -t proc proc "$rootfs/proc"
    mount -t sysfs sysfs "$rootfs/sys"
    bind /dev /dev
    bind /dev/pts /dev/pts
    mount -t tmpfs -o mode=1777 shm "$rootfs/dev/shm"
    bind "$repo" /work/repo ro
}

# The host's way to PyPI, carried into the chroot: its CA bundle (HTTPS may
# be intercepted), proxies, and index URLs that are not local folders.
chroot_env=()
carry_network_settings() {
    local bundle="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" var
    if [[ -r "$bundle" ]]; then
        cp "$bundle" "$rootfs/etc/ssl/host-ca-bundle.crt"
        chroot_env+=(SSL_CERT_FILE=/etc/ssl/host-ca-bundle.crt
            PIP_CERT=/etc/ssl/host-ca-bundle.crt)
    fi
    cp -L /etc/resolv.conf "$rootfs/etc/resolv.conf" 2>/dev/null || true
    for var in HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy \
            UV_INDEX_URL UV_DEFAULT_INDEX UV_EXTRA_INDEX_URL UV_INDEX \
            PIP_INDEX_URL PIP_EXTRA_INDEX_URL; do
        [[ -n "${!var:-}" && "${!var}" != *file:* ]] && chroot_env+=("$var=${!var}")
    done
    return 0
}

in_chroot() {  # a command in the chroot with a clean environment
    chroot "$rootfs" /usr/bin/env -i PATH=/opt/venv/bin:/opt/uv/bin:/usr/bin:/bin \
        HOME=/root LANG=C.UTF-8 "${chroot_env[@]}" "$@"
}

# uv for aarch64 from PyPI, the host's version where the host has one.
install_uv() {
    local want="" have=""
    command -v uv >/dev/null && want="$(uv --version | awk '{print $2}')"
    [[ -x "$rootfs/opt/uv/bin/uv" ]] && have="$(in_chroot uv --version | awk '{print $2}')"
    [[ -n "$have" && ( -z "$want" || "$have" == "$want" ) ]] && return
    say "installing uv ${want:-(newest)} into the chroot"
    run in_chroot python3 -m venv --clear /opt/uv
    run in_chroot /opt/uv/bin/pip install --quiet --disable-pip-version-check "uv${want:+==$want}"
}

# --- main --------------------------------------------------------------------

host_packages
binfmt
if [[ $rebuild == 1 && -d "$rootfs" ]]; then
    [[ -z "$(mounts_under "$rootfs")" ]] || die "$rootfs still has mounts"
    rm -rf --one-file-system "$rootfs"
fi
[[ -d "$rootfs" ]] || build_rootfs
if [[ -n "$copy_interpreter" ]]; then
    mkdir -p "$rootfs$(dirname "$copy_interpreter")"
    cp -L "$copy_interpreter" "$rootfs$copy_interpreter"
fi
rm -rf --one-file-system "${rootfs:?}/tmp" && install -d -m 1777 "$rootfs/tmp"
mount_all
carry_network_settings
install_uv

chroot_env+=(UV_PYTHON_DOWNLOADS=never UV_PYTHON=/usr/bin/python3
    UV_PROJECT_ENVIRONMENT=/opt/venv UV_CACHE_DIR=/var/cache/uv UV_LINK_MODE=copy
    QWEN3_STANDIN=1)
say "uv sync --locked (Debian's $(in_chroot python3 -V))"
# Compiled bytecode saves each emulated Python start minutes of compiling.
run in_chroot sh -c 'cd /work/repo && UV_COMPILE_BYTECODE=1 uv sync --locked --quiet' \
    || die "uv sync --locked failed in the chroot"
versions="$(in_chroot /opt/venv/bin/python -c \
    'import platform, torch; print(platform.machine(), "Python", platform.python_version(), "torch", torch.__version__)')"
say "$versions"
# Which native step the tests meet: the C kernels built for this CPU, or
# torch's matmul (then the fast decoder's tests skip)
native="$(in_chroot sh -c 'cd /work/repo && python - 2>/dev/null' <<'PY'
from utils.fast import get_kernels
k = get_kernels()
names = [k.table[k.first[c]].name for c in ("exact", "int8")] if k else []
print("native step: " + (", ".join(names) or "none (torch matmul)"))
PY
)" || native="native step: none (the check failed)"
say "$native"

marks="not slow"
[[ $all == 1 ]] || marks="not slow and not heavy_under_emulation"
args=(-m "$marks" -p no:cacheprovider -q --durations=15)
if [[ ${#pytest_args[@]} -gt 0 ]]; then args+=("${pytest_args[@]}"); else args+=(tests); fi
limit=()
[[ $minutes == 0 ]] || limit=(timeout -s INT -k 120 "${minutes}m")
say "pytest ${args[*]} (limit: ${minutes} min; log: $log)"
start=$SECONDS
: >"$log"
status=0
"${limit[@]}" chroot "$rootfs" /usr/bin/env -i PATH=/opt/venv/bin:/usr/bin:/bin \
    HOME=/root LANG=C.UTF-8 "${chroot_env[@]}" \
    sh -c 'cd /work/repo && exec python -m pytest "$@"' pytest "${args[@]}" \
    >"$log" 2>&1 &
child=$!
tail -n +1 -f --pid="$child" "$log" &
wait "$child" || status=$?
child=""
wait
elapsed=$((SECONDS - start))

summary="$(grep -E '^=* ?[0-9]+ (passed|failed|skipped|deselected|error)' "$log" | tail -1 \
    | sed -E 's/^=+ //; s/ =+$//; s/ in [0-9.]+s.*//')"
count() {  # the number before a word of pytest's summary, 0 if absent
    local n
    n="$(grep -oE "[0-9]+ $1" <<<"$summary" | cut -d' ' -f1 || true)"
    echo "${n:-0}"
}
cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
# Complete: pytest printed its closing counts and was not interrupted (the
# limit may still fall in its exit, after the counts: they stand).
if [[ -z "$summary" ]] || grep -qE '^!+ (KeyboardInterrupt|Interrupted)' "$log"; then
    if [[ $status == 124 ]]; then word="INCOMPLETE (stopped at the ${minutes}-min limit)"
    else word="FAIL (pytest rc $status, no complete run)"; fi
    status=1
elif [[ $(count failed) == 0 && $(count error) == 0 && ( $status == 0 || $status == 124 ) ]]; then
    word=PASS status=0
else
    word="FAIL (pytest rc $status)" status=1
fi
echo "VERDICT: $word: ${versions}, ${native}, under qemu-user on $(nproc)-core $cpu:" \
    "$(count passed) passed, $(count failed) failed, $(count skipped) skipped," \
    "$(count deselected) deselected in $((elapsed / 60)) min $((elapsed % 60)) s"
[[ $status == 0 ]] || exit 1
