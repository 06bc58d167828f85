#!/usr/bin/env bash
# The container image, built and run with podman on this machine (no registry is reachable):
# a debian:bookworm-slim base made locally with debootstrap (minbase) and `podman import`, the
# image built from deploy/Containerfile's `prebuilt` target (binaries built on the host,
# copied into the same runtime stage the full build uses), then the three services run as
# containers (host network, the model mounted read-only, read-only root filesystem, non-root)
# that pass their health checks and answer a prompt through the router.
# Usage: container_test.sh BUILD_DIR   (ctest: container_test; needs root, podman, debootstrap:
# scripts/install_container_tools.sh)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$1" && pwd)
cd "$ROOT"
MODEL=SmolLM2-135M-Instruct.Q4_1.gguf
# SPECD_IMAGE: run an image built already (e.g. the full multi-stage build, --target runtime)
IMAGE=${SPECD_IMAGE:-localhost/specd:ci}
BASE=debian:bookworm-slim
PORT_ROUTER=${PORT_ROUTER:-56051} PORT_TARGET=${PORT_TARGET:-56052} PORT_DRAFT=${PORT_DRAFT:-56053}
RUN="podman run -d --health-interval disable --network host --read-only --tmpfs /tmp --cap-drop ALL \
  --security-opt no-new-privileges -v $ROOT/models:/models:ro"
names=(specd-ci-target specd-ci-draft specd-ci-router)

cleanup() {
  for n in "${names[@]}"; do podman rm -f "$n" >/dev/null 2>&1 || true; done
  rm -rf "$ROOT/.container-bin"
}
trap cleanup EXIT
cleanup

echo "== base image $BASE (debootstrap --variant=minbase bookworm, podman import)"
if ! podman image exists "$BASE"; then
  rootfs=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log"; exit 1; }
  tar -C "$rootfs" -c . | podman import - "$BASE" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"
fi

if [ -z "${SPECD_IMAGE:-}" ]; then
  echo "== image $IMAGE (deploy/Containerfile, target prebuilt)"
  mkdir -p .container-bin
  for b in services/specd-router services/specd-draft services/specd-target tools/specd; do
    install -s "$BUILD/$b" .container-bin/
  done
  podman build -q --format docker --network host -f deploy/Containerfile --target prebuilt \
    -t "$IMAGE" . >/dev/null
fi

user=$(podman run --rm "$IMAGE" id -u)
[ "$user" = 10001 ] || { echo "FAIL: the image runs as uid $user, not 10001"; exit 1; }

echo "== three containers on the host network"
$RUN --name specd-ci-target -e SPECD_HEALTH_SERVER=localhost:$PORT_TARGET "$IMAGE" \
  specd-target --listen 127.0.0.1:$PORT_TARGET --model /models/$MODEL --threads 1 >/dev/null
$RUN --name specd-ci-draft -e SPECD_HEALTH_SERVER=localhost:$PORT_DRAFT "$IMAGE" \
  specd-draft --listen 127.0.0.1:$PORT_DRAFT --model /opt/specd/drafts/${MODEL%.gguf}.draft.gguf \
  --borrow-from /models/$MODEL --threads 1 >/dev/null
$RUN --name specd-ci-router -e SPECD_HEALTH_SERVER=localhost:$PORT_ROUTER "$IMAGE" \
  specd-router --listen 127.0.0.1:$PORT_ROUTER --target 127.0.0.1:$PORT_TARGET \
  --draft 127.0.0.1:$PORT_DRAFT --model /models/$MODEL >/dev/null

healthy() {  # the image's own HEALTHCHECK command, run by podman
  for _ in $(seq 1 120); do
    if podman healthcheck run "$1" >/dev/null 2>&1; then return 0; fi
    if [ "$(podman inspect -f '{{.State.Running}}' "$1")" != true ]; then break; fi
    sleep 1
  done
  echo "FAIL: $1 never became healthy"; podman logs "$1" 2>&1 | tail -20; return 1
}
for n in "${names[@]}"; do healthy "$n"; done

echo "== a prompt through the router"
answer=$(podman exec specd-ci-router specd client generate --server localhost:$PORT_ROUTER --chat \
  -p "What is the capital of France?" -n 16 --temp 0)
echo "answer: $answer"
[ -n "$answer" ] || { echo "FAIL: empty answer"; exit 1; }

echo "== SIGTERM through tini: each service drains and exits 0"
for n in specd-ci-router specd-ci-draft specd-ci-target; do
  podman stop -t 30 "$n" >/dev/null
  code=$(podman inspect -f '{{.State.ExitCode}}' "$n")
  [ "$code" = 0 ] || { echo "FAIL: $n exited $code"; podman logs "$n" 2>&1 | tail -10; exit 1; }
done
echo "container_test: OK"
