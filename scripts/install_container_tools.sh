#!/usr/bin/env bash
# Installs podman (with runc) and debootstrap from Debian packages and writes the podman
# settings these machines need (/etc/containers/containers.conf): runc, not crun, which fails
# in this cgroup mode; cgroupfs, as there is no systemd; and ulimits within what a process
# may set here. Idempotent. Used by the container test (tests/deploy/container_test.sh).
set -euo pipefail
PACKAGES=(podman runc debootstrap uidmap slirp4netns fuse-overlayfs)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_container_tools: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
CONF=/etc/containers/containers.conf
WANT='[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"'
if [ "$(cat "$CONF" 2>/dev/null)" != "$WANT" ]; then
  $SUDO mkdir -p /etc/containers
  if [ -f "$CONF" ]; then $SUDO cp "$CONF" "$CONF.before-specd"; fi
  echo "$WANT" | $SUDO tee "$CONF" >/dev/null
  echo "install_container_tools: wrote $CONF"
fi
