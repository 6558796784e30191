#!/usr/bin/env bash
# scripts/gpu_sim_bare.sh [gpu_check.sh arguments]: run scripts/gpu_check.sh here as if on the
# bare GPU machine, to prove that it needs nothing outside the gathered folder (.gpudeps/).
#
# In a private mount namespace (unshare -m, root; nothing changes outside this command), every
# system copy of what the bare machine lacks is hidden: OpenBLAS, BLAS/LAPACK, libyaml, cJSON,
# stb, libgfortran, libquadmath, Open MPI (libraries, headers, mpicc) are covered by empty
# directories or by /dev/null, so a compile that looked for them fails and a program that
# loaded them would fail to start. The runtime prefix is unpacked afresh. Then, besides
# gpu_check.sh's own ldd check, LD_DEBUG=libs of a CPU training run lists every shared library
# the dynamic loader opened, each classified as: the carried prefix, CUDA, or the C/C++
# toolchain (libc, libm, libstdc++, libgcc_s, libgomp); anything else fails the simulation.
# Not hidden: the CUDA toolkit (nvcc, its headers, cudart, cuBLASLt, NCCL here: the bare machine
# has its own) and the C toolchain.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "gpu_sim_bare: needs root (unshare -m)" >&2; exit 1; }
if [ "${LLMC_SIM_INNER:-}" != 1 ]; then
  exec unshare -m --propagation private env LLMC_SIM_INNER=1 bash "$0" "$@"
fi
L=/usr/lib/x86_64-linux-gnu
hidden=()
for d in /usr/include/stb /usr/include/cjson /usr/include/x86_64-linux-gnu/openblas-openmp \
         /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/x86_64-linux-gnu/openmpi \
         $L/openblas-openmp $L/openblas-pthread $L/blas $L/lapack $L/openmpi; do
  [ -d "$d" ] && mount -t tmpfs -o ro,size=1k none "$d" && hidden+=("$d/")
done
for f in /usr/include/yaml.h /usr/include/x86_64-linux-gnu/openblas_config.h /usr/include/cblas.h \
         $L/libyaml* $L/libcjson* $L/libopenblas* $L/libblas* $L/liblapack* $L/libgfortran* $L/libquadmath* \
         $L/libstb* $L/libmpi* /usr/bin/mpicc /usr/bin/mpicxx /usr/bin/mpirun /usr/bin/mpiexec; do
  [ -e "$f" ] && mount --bind /dev/null "$f" && hidden+=("$f")
done
echo "gpu_sim_bare: hidden ${#hidden[@]} system paths:"
printf '  %s\n' "${hidden[@]}"
# the hiding works: the system's copies are unusable now
if printf '#include <yaml.h>\nint x = sizeof(yaml_parser_t);\n' | gcc -c -x c - -o /tmp/gpu_sim_probe.o 2>/dev/null; then echo "gpu_sim_bare: yaml.h still usable" >&2; exit 1; fi
if printf '#include <cjson/cJSON.h>\n' | gcc -E -x c - >/dev/null 2>&1; then echo "gpu_sim_bare: cJSON.h still visible" >&2; exit 1; fi
if echo 'int main(){return 0;}' | gcc -x c - -o /tmp/gpu_sim_probe -lopenblas 2>/dev/null; then echo "gpu_sim_bare: -lopenblas still links" >&2; exit 1; fi
echo "gpu_sim_bare: yaml.h unusable, cjson/cJSON.h absent, -lopenblas does not link without the prefix: hidden"

export LLMC_GPUDEPS_RUNTIME=${LLMC_GPUDEPS_RUNTIME:-/tmp/llmc-gpudeps-sim}
rm -rf "$LLMC_GPUDEPS_RUNTIME"
export BUILD=${BUILD:-build-gpusim}
st=0
bash "$ROOT/scripts/gpu_check.sh" "$@" || st=$?

# Every library the loader opens for a CPU training run, classified.
RT=$LLMC_GPUDEPS_RUNTIME
LIBPATH="$RT/lib"
w=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0] + "/lib")' 2>/dev/null || true)
tmp=$(mktemp -d)
python3 - "$tmp" <<'EOF'
import random, struct, sys
from array import array
d = sys.argv[1]
t = array("H", (random.Random(0).randrange(64) for _ in range(4096)))
open(d + "/t.bin", "wb").write(struct.pack("<256i", *([20240520, 1, len(t)] + [0] * 253)) + t.tobytes())
open(d + "/c.yaml", "w").write("model:\n  vocab_size: 64\n  hidden_size: 32\n  intermediate_size: 96\n"
    "  num_hidden_layers: 2\n  num_attention_heads: 4\n  num_key_value_heads: 2\n  max_position_embeddings: 64\n"
    "train_data: %s/t.bin\nsequence_len: 32\nmicro_batch_size: 2\nmax_steps: 2\ndevice: cpu\noutput_dir: %s/o\n" % (d, d))
EOF
if [ -x "$ROOT/$BUILD/train_llama" ]; then
  LD_LIBRARY_PATH="$LIBPATH${w:+:$w}" LD_DEBUG=libs "$ROOT/$BUILD/train_llama" -c "$tmp/c.yaml" > "$tmp/run.log" 2> "$tmp/ld.log" || { echo "gpu_sim_bare: CPU run failed"; tail -5 "$tmp/ld.log"; st=1; }
  echo "gpu_sim_bare: shared libraries opened by a CPU training run (LD_DEBUG=libs):"
  bad=0
  for p in $(sed -n 's/.*calling init: \(.*\)$/\1/p' "$tmp/ld.log" | sort -u); do
    case "$p" in
      "$RT"/*) cls="carried prefix" ;;
      */libcuda.so*|*/libcudart.so*|*/libcublas*|*/libnccl.so*|/usr/local/cuda*) cls="CUDA" ;;
      /lib/x86_64-linux-gnu/libc.so.6|/lib/x86_64-linux-gnu/libm.so.6|/lib64/ld-linux-x86-64.so.2|/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2|\
      */libstdc++.so.6|*/libgcc_s.so.1|*/libgomp.so.1|/lib/x86_64-linux-gnu/libpthread.so.0|/lib/x86_64-linux-gnu/libdl.so.2|/lib/x86_64-linux-gnu/librt.so.1) cls="toolchain" ;;
      *) cls="OUTSIDE THE FOLDER"; bad=1 ;;
    esac
    printf '  %-18s %s\n' "$cls" "$p"
  done
  [ $bad = 0 ] || { echo "gpu_sim_bare: a library came from outside the carried folder"; st=1; }
else
  echo "gpu_sim_bare: no $BUILD/train_llama"; st=1
fi
rm -rf "$tmp"
echo "gpu_sim_bare: exit $st"
exit $st
