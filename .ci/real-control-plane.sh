#!/usr/bin/env bash
# CI: every e2e-marked test against a real control plane — etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler, started by pyprovlib.testing.ControlPlane from
# the binaries in ../shared/kube (relative to the repository root). Without that directory it
# says so in one line and succeeds. A failing test fails the run.
#
# The binaries are unpacked into a temporary assets directory (setup-envtest's layout), never
# into the repository; etcd comes from Debian's etcd-server, kubectl from the venv.
# Usage: .ci/real-control-plane.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
shared="$repo/../shared/kube"
if [ ! -d "$shared" ]; then
    echo "== real control plane: skipped (no CI binary cache; set PYPROVLIB_KUBE_ASSETS to an assets directory in setup-envtest's layout and run pytest -m e2e)"
    exit 0
fi
echo "== real control plane: pytest -m e2e against kube-apiserver, kube-controller-manager, kube-scheduler"

assets="$(mktemp -d -t pyprovlib-kube-assets.XXXXXX)"
trap 'rm -rf "$assets"' EXIT
.ci/unpack-assets.sh "$assets"

logs="$assets/logs"
mkdir -p "$logs"
start=$(date +%s)
status=0
env -u PYPROVLIB_E2E_KUBECONFIG -u KUBEBUILDER_ASSETS \
    PYPROVLIB_KUBE_ASSETS="$assets" PYPROVLIB_KUBE_LOG_DIR="$logs" \
    .venv/bin/python -m pytest -m e2e -p no:cacheprovider -q -rs "$@" || status=$?
echo "== real control plane: pytest exit status $status in $(( $(date +%s) - start )) s"
if [ "$status" -ne 0 ]; then
    for log in "$logs"/*.log; do
        [ -f "$log" ] || continue
        echo "-- last lines of $(basename "$log")"
        tail -n 40 "$log"
    done
fi
exit "$status"
