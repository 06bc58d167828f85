#!/usr/bin/env bash
# Installs every build/test dependency from Debian packages (prometheus: the monitoring test
# scrapes a running cluster with a real Prometheus and checks rules with promtool).
# Idempotent: skips apt when all packages are already present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates unzip curl openssl
  python3 python3-pip python3-venv
  libabsl-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev
  libpcre2-dev libsimde-dev nlohmann-json3-dev libboost1.74-dev
  clang-14 libclang-rt-14-dev
  prometheus
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
