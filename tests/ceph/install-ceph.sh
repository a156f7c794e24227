#!/usr/bin/env bash
# Install the Ceph packages the RBD tests need (Debian/Ubuntu): ceph-mon, ceph-osd, ceph-common.
# Idempotent and non-interactive: exits 0 at once when the programs are already installed.
#
#   tests/ceph/install-ceph.sh           install if needed (root, or passwordless sudo)
#   tests/ceph/install-ceph.sh --check   exit 0 if installed, 1 if not; installs nothing
#
# Prints what it did; exits non-zero only when the installation really failed.
set -euo pipefail

readonly PACKAGES=(ceph-mon ceph-osd ceph-common)
readonly PROGRAMS=(ceph-mon ceph-osd ceph ceph-authtool monmaptool rbd)

usage() {
    sed -n '2,8s/^# \{0,1\}//p' "$0"
}

missing_programs() {
    local p
    for p in "${PROGRAMS[@]}"; do
        command -v -- "$p" >/dev/null 2>&1 || printf '%s ' "$p"
    done
}

check_only=0
case "$#:${1-}" in
    0:) ;;
    1:--check) check_only=1 ;;
    1:-h | 1:--help) usage; exit 0 ;;
    *) echo "install-ceph.sh: unexpected arguments: $*" >&2; usage >&2; exit 2 ;;
esac

missing="$(missing_programs)"
if [[ -z "$missing" ]]; then
    echo "install-ceph.sh: ceph already installed ($(rbd --version 2>/dev/null || echo 'rbd present')); nothing to do"
    exit 0
fi
if (( check_only )); then
    echo "install-ceph.sh: missing: $missing" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-ceph.sh: missing $missing and no apt-get here; install ${PACKAGES[*]} by hand" >&2
    exit 1
fi

as_root=()
if (( EUID != 0 )); then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        as_root=(sudo -n)
    else
        echo "install-ceph.sh: missing $missing; run as root (or with passwordless sudo)" >&2
        exit 1
    fi
fi

echo "install-ceph.sh: missing $missing; installing ${PACKAGES[*]}"
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    -- "${PACKAGES[@]}" >/dev/null

missing="$(missing_programs)"
if [[ -n "$missing" ]]; then
    echo "install-ceph.sh: installed ${PACKAGES[*]} but still missing: ${missing% }" >&2
    exit 1
fi
echo "install-ceph.sh: installed $(rbd --version) in $((SECONDS - start))s"
