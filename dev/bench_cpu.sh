#!/usr/bin/env bash
# CPU training throughput, three figures from one run on the same model, data and cores:
# ./train_llama, PyTorch float32 eager (its BLAS is the same OpenBLAS; the core type it runs
# is printed), and the SGEMM-only roofline of the same step (dev/sgemm_roofline.c: every
# matrix product of the step timed at its shape, the better of threaded alone and side by side,
# one a thread). Prints the CPU, OpenBLAS's config and
# core type, the three figures and the two ratios (ours/torch, roofline/ours).
#   SHAPE=small (default): 4 layers, hidden 256, intermediate 688, 4/2 heads, vocab 256, B 8, T 256
#   SHAPE=large:          12 layers, hidden 768, intermediate 2048, 12/12 heads, vocab 256, B 1, T 1024
#   SHAPE=vocab:          4 layers, hidden 512, intermediate 1376, 8/4 heads, vocab 128256, B 4, T 256
# Each side runs WARMUP + STEPS optimizer steps; the table averages the last STEPS.
#
#   dev/bench_cpu.sh                  # threads: 1 and all cores
#   THREADS="2" STEPS=10 SHAPE=large dev/bench_cpu.sh
#   BIN=build/train_llama NO_MAKE=1 dev/bench_cpu.sh
#   ROUNDS=3 dev/bench_cpu.sh          # each side 3 times, interleaved; the table takes the fastest
#   PROBES=1 dev/bench_cpu.sh          # one timing pass per OpenBLAS core type (default 3)
#   PROFILE=0 dev/bench_cpu.sh         # ours without --profile (no split of its step by parts)
#
# Each thread count runs pinned (taskset) to cores 0..N-1: the roofline, ours, the roofline again,
# then torch.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-/usr/bin/python3}
NCPU=$(nproc)
THREADS=${THREADS:-$( [ "$NCPU" -gt 1 ] && echo "1 $NCPU" || echo 1 )}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-2}
BIN=${BIN:-./train_llama}
SHAPE=${SHAPE:-small}
ROUNDS=${ROUNDS:-1}
BUILD=${BUILD:-build}

# NO_MAKE=1 skips the build (e.g. BIN=build/train_llama while ./train_llama is running).
[ "${NO_MAKE:-0}" = 1 ] || make -s >/dev/null
make -s BUILD="$BUILD" "$BUILD/sgemm_roofline" >/dev/null
[ -x "$BIN" ] || { echo "error: $BIN not built" >&2; exit 1; }
# A VM's model name can be a bare "AMD EPYC": the family and model tell Zen 3 (25/1) from Zen 4
# (25/17), and the widest vector set decides which of our kernels and OpenBLAS's run.
isa=$(grep -qw avx512bw /proc/cpuinfo && echo "AVX-512" || { grep -qw avx2 /proc/cpuinfo && echo "AVX2, no AVX-512" || echo "no AVX2"; })
fam=$(sed -n 's/^cpu family[[:space:]]*: *//p' /proc/cpuinfo | head -1)
mod=$(sed -n 's/^model[[:space:]]*: *//p' /proc/cpuinfo | head -1)
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1) (family $fam model $mod; $isa), $(nproc) cores; $(date -u +%Y-%m-%d)"


DIR=$(mktemp -d -t bench_cpu.XXXXXX)
trap 'rm -rf "$DIR"' EXIT

"$PY" dev/bench_torch.py prepare --shape "$SHAPE" --dir "$DIR" --steps "$STEPS" --warmup "$WARMUP"
ROOF_ARGS=$("$PY" dev/bench_torch.py shape --shape "$SHAPE" --dir "$DIR")

# The OpenBLAS kernel set (core type) for all three sides: the fastest of those this CPU can
# run, by the SGEMM roofline at one thread. The core type in effect can be far off: on VMs that
# hide the CPU model OpenBLAS falls back to generic SSE3 kernels, and an OPENBLAS_CORETYPE set
# in the environment wins over detection (this project's AMD EPYC sessions set Haswell: AVX2
# kernels at half the speed of the AVX-512 ones there). A caller's OPENBLAS_CORETYPE is
# replaced; BENCH_CORETYPE=NAME fixes the choice instead.
cands="Haswell"
grep -qw avx2 /proc/cpuinfo || cands="Prescott"
grep -qw avx512bw /proc/cpuinfo && cands="$cands SkylakeX"
grep -qw avx512_bf16 /proc/cpuinfo && cands="$cands Cooperlake"
grep -q AuthenticAMD /proc/cpuinfo && grep -qw avx2 /proc/cpuinfo && cands="$cands Zen"
# The candidates are timed in PROBES passes (default 3), alternated, each keeping its fastest:
# one pass let a neighbour's burst make the best kernel set look twice as slow (2026-11-26:
# Haswell 860 ms against ~400 in the passes before and after).
PROBES=${PROBES:-3}
[[ "$PROBES" =~ ^[1-9][0-9]?$ ]] || { echo "error: PROBES=$PROBES: expected a count of passes, 1-99" >&2; exit 1; }
if [ -n "${BENCH_CORETYPE:-}" ]; then
    export OPENBLAS_CORETYPE=$BENCH_CORETYPE
else
    declare -A probe_ms
    for p in $(seq "$PROBES"); do
        line="core types, pass $p of $PROBES (SGEMM roofline ms/step at 1 thread):"
        for c in $cands; do
            # shellcheck disable=SC2086
            ms=$(OPENBLAS_CORETYPE=$c OMP_NUM_THREADS=1 taskset -c 0 "$BUILD/sgemm_roofline" $ROOF_ARGS --threads 1 \
                 --reps 3 | sed -n 's/^sgemm roofline: \([0-9.]*\) ms.*/\1/p')
            [ -n "$ms" ] || { echo "error: sgemm_roofline printed no time under core type $c" >&2; exit 1; }
            line="$line $c $ms"
            if [ -z "${probe_ms[$c]:-}" ] || [ "$(echo "$ms < ${probe_ms[$c]}" | bc)" = 1 ]; then probe_ms[$c]=$ms; fi
        done
        echo "$line"
    done
    best="" best_ms=""
    for c in $cands; do
        echo "core type $c: SGEMM roofline ${probe_ms[$c]} ms/step at 1 thread (fastest of $PROBES)"
        if [ -z "$best" ] || [ "$(echo "${probe_ms[$c]} < $best_ms" | bc)" = 1 ]; then best=$c best_ms=${probe_ms[$c]}; fi
    done
    export OPENBLAS_CORETYPE=$best
fi
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"

pin() {  # pin to cores 0..n-1 when taskset exists
    local n=$1; shift
    if command -v taskset >/dev/null 2>&1; then taskset -c "0-$((n - 1))" "$@"; else "$@"; fi
}

prof=$([ "${PROFILE:-1}" = 0 ] || echo --profile)

# ROUNDS=n repeats the three sides n times, interleaved, and the table takes each side's fastest
# round: on a shared (virtual) machine a neighbour's load comes and goes within a minute.
for n in $THREADS; do
  for r in $(seq "$ROUNDS"); do
    sfx=$([ "$ROUNDS" -gt 1 ] && echo "_r$r" || true)
    [ "$ROUNDS" -gt 1 ] && echo "== round $r of $ROUNDS"
    # The roofline also right before ours: a round's ratio sets ours against the mean of the
    # two rooflines that bracket it, so a load that rises or falls during ours counts on both
    # sides (a roofline run lasts ~1 s at the small shape, ~4 s at the large; ours 4-30 s).
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$n pin "$n" "$BUILD/sgemm_roofline" $ROOF_ARGS --threads "$n" | tail -1 > "$DIR/roofline_$n${sfx}_pre.json"
    echo "== threads $n: train_llama"
    t0=$(date +%s.%N)
    # --profile (PROFILE=0: without) times each op of the same steps; the numbers do not change
    pin "$n" "$BIN" -c "$DIR/cfg.yaml" --set "num_threads=$n" --set "output_dir=$DIR/ours_$n$sfx" $prof \
        > "$DIR/ours_$n$sfx.log" 2>&1 || { tail -20 "$DIR/ours_$n$sfx.log"; exit 1; }
    echo "   $(echo "$(date +%s.%N) - $t0" | bc) s wall"
    echo "== threads $n: SGEMM roofline"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$n pin "$n" "$BUILD/sgemm_roofline" $ROOF_ARGS --threads "$n" > "$DIR/roofline_$n$sfx.txt"
    head -3 "$DIR/roofline_$n$sfx.txt"
    tail -1 "$DIR/roofline_$n$sfx.txt" > "$DIR/roofline_$n$sfx.json"
    echo "== threads $n: torch"
    OMP_NUM_THREADS=$n MKL_NUM_THREADS=$n OPENBLAS_NUM_THREADS=$n pin "$n" "$PY" dev/bench_torch.py torch --shape "$SHAPE" \
        --dir "$DIR" --threads "$n" --steps "$STEPS" --warmup "$WARMUP" --tag "$sfx"
  done
done

"$PY" dev/bench_torch.py table --shape "$SHAPE" --dir "$DIR" --threads "$THREADS" --warmup "$WARMUP" --rounds "$ROUNDS"
