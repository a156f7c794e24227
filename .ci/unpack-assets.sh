#!/usr/bin/env bash
# Unpack ../shared/kube's binaries into the assets directory $1 (setup-envtest's layout plus
# the optional binaries: kubelet, the Go CSI peers, e2e.test, ginkgo, agnhost), with etcd
# from Debian's etcd-server and kubectl from the venv. Never into the repository.
# Usage: .ci/unpack-assets.sh DIR   (run from the repository root)
set -euo pipefail
assets="$1"
shared="$PWD/../shared/kube"
mkdir -p "$assets"
for packed in "$shared"/*.xz; do
    name="$(basename "$packed" .xz)"
    [ -x "$assets/$name" ] && continue
    if command -v xz >/dev/null 2>&1; then
        xz -dc "$packed" >"$assets/$name.part"
    else
        .venv/bin/python - "$packed" "$assets/$name.part" <<'PY'
import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    fi
    chmod +x "$assets/$name.part"
    mv "$assets/$name.part" "$assets/$name"
done
if [ -f "$shared/sha256sums" ]; then
    (cd "$assets" && sha256sum --quiet --check --ignore-missing "$shared/sha256sums")
fi
if ! command -v etcd >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
fi
ln -sf "$(command -v etcd)" "$assets/etcd"
ln -sf "$PWD/.venv/bin/kubectl" "$assets/kubectl"
