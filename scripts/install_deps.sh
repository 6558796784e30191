#!/usr/bin/env bash
# Installs everything the build and the tests need on a fresh Debian machine (run as root).
set -euo pipefail
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
pkgs="build-essential libopenblas-openmp-dev libyaml-dev libcjson-dev libstb-dev libopenmpi-dev openmpi-bin python3 python3-torch python3-numpy clang libclang-rt-dev libomp-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends $missing
fi
