#!/usr/bin/env bash
# CI: a real node — containerd and a kubelet (pyprovlib.testing._node.KubeletNode) joined to a
# real control plane from ../shared/kube — then
#   1. the node tests (pytest -m node tests/node): pods write into volumes that the hostpath
#      example and python -m pyprovlib.csi provision, on the Go hostpath driver and on
#      pyprovlib's example driver;
#   2. Kubernetes' storage conformance suite (pytest -m conformance tests/node): e2e.test
#      "External Storage" for the Go sidecars, python -m pyprovlib.csi, and pyprovlib's example
#      driver, side by side; it fails when pyprovlib fails a test the Go sidecars pass.
# Without ../shared/kube it says so in one line and succeeds. The node's Debian packages are
# installed here; if that fails (no registry), the tests skip with the reason and a warning.
# Usage: .ci/real-node.sh [extra pytest arguments]
# PYPROVLIB_CONFORMANCE_FOCUS=<regex> (e.g. volume-modify) narrows step 2 to the matching tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d ../shared/kube ]; then
    echo "== real node: skipped (no CI binary cache; the real-node tests need an assets directory named by PYPROVLIB_KUBE_ASSETS with kubelet, see docs/testing)"
    exit 0
fi
packages="containerd runc containernetworking-plugins iptables iproute2 busybox-static"
missing=""
for tool in containerd runc ip iptables busybox; do
    command -v "$tool" >/dev/null 2>&1 || missing="yes"
done
[ -x /usr/lib/cni/bridge ] || missing="yes"
if [ -n "$missing" ]; then
    echo "== real node: apt-get install $packages"
    if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null; then
        export PYPROVLIB_REQUIRE_NODE=1
    else
        echo "WARNING: the node's packages could not be installed; the node tests will be skipped" >&2
    fi
else
    export PYPROVLIB_REQUIRE_NODE=1
fi

work="$(mktemp -d -t pyprovlib-real-node.XXXXXX)"
trap 'rm -rf "$work"' EXIT
assets="$work/assets"
.ci/unpack-assets.sh "$assets"
logs="$work/logs"
mkdir -p "$logs"

run() {
    local what="$1"; shift
    local start status=0
    start=$(date +%s)
    env -u PYPROVLIB_E2E_KUBECONFIG -u KUBEBUILDER_ASSETS \
        PYPROVLIB_KUBE_ASSETS="$assets" PYPROVLIB_KUBE_LOG_DIR="$logs/$what" \
        PYPROVLIB_CONFORMANCE_DIR="$work/conformance" \
        .venv/bin/python -m pytest -p no:cacheprovider -q -rs "$@" || status=$?
    echo "== real node: $what: pytest exit status $status in $(( $(date +%s) - start )) s"
    if [ "$status" -ne 0 ]; then
        for log in "$logs/$what"/*.log; do
            [ -f "$log" ] || continue
            echo "-- last lines of $(basename "$log")"
            tail -n 30 "$log"
        done
    fi
    return "$status"
}

status=0
echo "== real node: pods on volumes pyprovlib provisions (pytest -m node)"
run node -m node tests/node "$@" || status=1
echo "== real node: Kubernetes' storage e2e suite, three stacks (pytest -m conformance)"
run conformance -m conformance tests/node "$@" || status=1
if [ -f "$work/conformance/summary.txt" ]; then
    cat "$work/conformance/summary.txt"
fi
exit "$status"
