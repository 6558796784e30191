#!/usr/bin/env bash
# CPU training throughput: ./train_llama vs PyTorch float32 eager on the same model, data and
# cores. Model: 4 layers, hidden 256, intermediate 688, 4 heads / 2 kv heads, vocab 256;
# B 4, T 256. Each side runs WARMUP + STEPS optimizer steps; the table averages the last STEPS.
#
#   dev/bench_cpu.sh                  # threads: 1 and all cores
#   THREADS="2" STEPS=10 dev/bench_cpu.sh
#   BIN=build/train_llama NO_MAKE=1 dev/bench_cpu.sh
#
# Each thread count runs pinned (taskset) to cores 0..N-1, ours first, then torch.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-/usr/bin/python3}
NCPU=$(nproc)
THREADS=${THREADS:-$( [ "$NCPU" -gt 1 ] && echo "1 $NCPU" || echo 1 )}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-2}
BIN=${BIN:-./train_llama}

# NO_MAKE=1 skips the build (e.g. BIN=build/train_llama while ./train_llama is running).
[ "${NO_MAKE:-0}" = 1 ] || make -s >/dev/null
[ -x "$BIN" ] || { echo "error: $BIN not built" >&2; exit 1; }

# OpenBLAS falls back to its slow generic kernels on VMs that hide the CPU model; train_llama
# corrects that itself (backend_cpu_preinit), and torch gets the same kernels through the env.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    if grep -qw avx512bw /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
fi
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"

DIR=$(mktemp -d -t bench_cpu.XXXXXX)
trap 'rm -rf "$DIR"' EXIT

"$PY" dev/bench_torch.py prepare --dir "$DIR" --steps "$STEPS" --warmup "$WARMUP"

pin() {  # pin to cores 0..n-1 when taskset exists
    local n=$1; shift
    if command -v taskset >/dev/null 2>&1; then taskset -c "0-$((n - 1))" "$@"; else "$@"; fi
}

for n in $THREADS; do
    echo "== threads $n: train_llama"
    t0=$(date +%s.%N)
    pin "$n" "$BIN" -c "$DIR/cfg.yaml" --set "num_threads=$n" --set "output_dir=$DIR/ours_$n" \
        > "$DIR/ours_$n.log" 2>&1 || { tail -20 "$DIR/ours_$n.log"; exit 1; }
    echo "   $(echo "$(date +%s.%N) - $t0" | bc) s wall"
    echo "== threads $n: torch"
    OMP_NUM_THREADS=$n MKL_NUM_THREADS=$n OPENBLAS_NUM_THREADS=$n pin "$n" "$PY" dev/bench_torch.py torch --dir "$DIR" \
        --threads "$n" --steps "$STEPS" --warmup "$WARMUP"
done

"$PY" dev/bench_torch.py table --dir "$DIR" --threads "$THREADS" --warmup "$WARMUP"
