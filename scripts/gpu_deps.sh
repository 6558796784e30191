#!/usr/bin/env bash
# scripts/gpu_deps.sh [DIR]: gather, on a Debian/Ubuntu machine with the package registries, what
# the bare GPU machine lacks to build and run this project, into one git-ignored folder
# (default .gpudeps/ in the repo root) that travels with the device tool's `carry`:
#
#   DIR/debs/      the runtime libraries as Debian packages (compressed; scripts/gpu_check.sh
#                  unpacks them there with dpkg-deb -x, or ar + tar, into a private prefix
#                  outside the repo, never over /): OpenBLAS (OpenMP flavour) and its libgfortran
#                  and libquadmath, libyaml, cJSON, and libgomp as a fallback for a machine
#                  without one
#   DIR/prefix/include/   the headers the build needs, unpacked here with dpkg -x from the
#                  -dev packages and pruned: openblas/ (cblas.h, openblas_config.h), yaml.h,
#                  cjson/, stb/stb_ds.h
#   DIR/MANIFEST   package names, versions, sha256 of each .deb, sizes
#
# Not gathered: Open MPI (large; the GPU build has no MPI path and uses launcher-free NCCL),
# NCCL (the GPU machine has the nvidia-nccl wheel), CUDA (the machine's own toolkit).
# Why not the unpacked .so files: libopenblasp-r0.3.21.so alone is 36 MB unpacked, 6.7 MB as a
# .deb; the folder must stay far below the device tool's 64 MiB with the repo.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=$(realpath -m "${1:-$ROOT/.gpudeps}")
RUNTIME_PKGS="libopenblas0-openmp libgfortran5 libquadmath0 libyaml-0-2 libcjson1 libgomp1"
DEV_PKGS="libopenblas-openmp-dev libyaml-dev libcjson-dev libstb-dev"
MAX_MIB=40

command -v apt-get >/dev/null || { echo "gpu_deps: needs apt-get (Debian or Ubuntu)" >&2; exit 1; }
command -v dpkg-deb >/dev/null || { echo "gpu_deps: needs dpkg-deb" >&2; exit 1; }
if [ "$(dpkg --print-architecture)" != amd64 ]; then
  echo "gpu_deps: this machine is $(dpkg --print-architecture); the GPU machine is amd64 (x86-64)" >&2
  exit 1
fi

# The package lists, once (skipped when they are less than a day old).
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
  echo "gpu_deps: apt-get update"
  apt-get update -qq
fi

rm -rf "$DEST.new"
mkdir -p "$DEST.new/debs" "$DEST.new/dev" "$DEST.new/prefix/include"
chmod 777 "$DEST.new/debs" "$DEST.new/dev"  # apt's download user (_apt) writes there
(cd "$DEST.new/debs" && apt-get download -qq $RUNTIME_PKGS)
(cd "$DEST.new/dev" && apt-get download -qq $DEV_PKGS)

# Headers from the -dev packages, unpacked into a scratch prefix inside the folder, then only
# what the build includes is kept.
X="$DEST.new/dev/x"
for f in "$DEST.new"/dev/*.deb; do dpkg -x "$f" "$X"; done
INC="$DEST.new/prefix/include"
mkdir -p "$INC/openblas" "$INC/stb" "$INC/cjson"
cp "$X"/usr/include/x86_64-linux-gnu/openblas-openmp/*.h "$INC/openblas/"
cp "$X"/usr/include/yaml.h "$INC/"
cp "$X"/usr/include/cjson/*.h "$INC/cjson/"
cp "$X"/usr/include/stb/stb_ds.h "$INC/stb/"
# every header the sources include from these libraries must be here
missing=0
for h in openblas/cblas.h yaml.h cjson/cJSON.h stb/stb_ds.h; do
  [ -f "$INC/$h" ] || { echo "gpu_deps: $h missing" >&2; missing=1; }
done
[ $missing = 0 ]

{
  echo "# gathered by scripts/gpu_deps.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(. /etc/os-release; echo "$PRETTY_NAME")"
  echo "# runtime .debs (unpacked on the GPU machine by scripts/gpu_check.sh):"
  for f in "$DEST.new"/debs/*.deb; do
    printf '%s %s %s %s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" \
      "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-64)"
  done
  echo "# headers (from $(for f in "$DEST.new"/dev/*.deb; do printf '%s=%s ' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)"; done)):"
  (cd "$DEST.new/prefix" && find include -type f | sort)
} > "$DEST.new/MANIFEST"
rm -rf "$DEST.new/dev"

rm -rf "$DEST"
mv "$DEST.new" "$DEST"
size_kib=$(du -sk "$DEST" | cut -f1)
echo "gpu_deps: $DEST: $(find "$DEST" -type f | wc -l) files, $((size_kib / 1024)).$(((size_kib % 1024) * 10 / 1024)) MiB"
if [ "$size_kib" -gt $((MAX_MIB * 1024)) ]; then
  echo "gpu_deps: over the ${MAX_MIB} MiB budget" >&2
  exit 1
fi
# The folder must be git-ignored (it travels through the device tool's carry, not through git).
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1 && ! git -C "$ROOT" check-ignore -q "$DEST/MANIFEST" 2>/dev/null; then
  echo "gpu_deps: warning: $DEST is not git-ignored; add it to .gitignore" >&2
fi
echo "gpu_deps: next, on the GPU machine: bash scripts/gpu_check.sh   (carry: $(realpath --relative-to="$ROOT" "$DEST" 2>/dev/null || echo "$DEST"))"
