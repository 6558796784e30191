#!/usr/bin/env bash
# scripts/gpu_check.sh [--out DIR] [PART...]: on the GPU machine, from the repo root, with the
# folder scripts/gpu_deps.sh gathered (.gpudeps/, or $LLMC_GPUDEPS): unpack the libraries into a
# private prefix, build with the local nvcc for the local GPU, run the checks, write a report.
#
# PARTS (each under 10 minutes on one H100; default: all, in this order)
#   build      unpack .gpudeps, build train_llama, train_gpt and dev/cuda/* with -I/-L from the
#              private prefix only (no system OpenBLAS/libyaml/cJSON/stb, no MPI), check with ldd
#              that every such library resolves inside the prefix, 2 CPU training steps
#   emu        make test-cuda-emu: the CUDA kernels on the CPU SIMT emulator (no GPU needed)
#   kernels    (a) make test-cuda: every dev/cuda program (kernel vs CPU reference, fp32 1e-5,
#              bf16 1e-2), with timings
#   train      (b) fp32 CUDA vs CPU whole-model training (losses and weights within 1e-5):
#                  full, LoRA, a Gemma 3 and a Gemma 2 text model
#   modes      (c) every memory mode bit-identical to the plain GPU run; peaks vs --plan
#   sanitizer  (d) compute-sanitizer memcheck + racecheck on a short run of each mode
#   nccl       (e) NCCL world 1 (LLMC_FORCE_NCCL=1), and every GPU when there are several
#   bench      (f) ~1B Llama at 4K tokens, full and LoRA: tok/s, MFU, peak memory vs PyTorch
#   gpt        (h) train_gpt (GPT-2) on the GPU: fp32 vs CPU (losses, one step's gradient), bf16
#              vs fp32 CPU, -r 1/-r 2 bit-identical to -r 0; GPT-2 124M (d12) tok/s and MFU
#   maxctx     8B QLoRA: the longest sequence ours and PyTorch + peft each train one step at
#              (scripts/gpu_bench.py --max-context; not in "all": most of a 10-minute call)
#   memory     (g) the same shape in 5 memory modes and LoRA resident/streamed, under one
#              device_memory_limit: nvidia-smi peaks within 10% of --plan's, hidden_states
#              <= 1.02x checkpointing's step, streaming <= 1.10x resident (not in "all": ~3-5 min)
#   memory8b   (g) the same at Llama-3.1-8B's shape, QLoRA r16 in 5 base modes and streamed (not
#              in "all"; not yet run on a GPU: an 8B NF4 model is made for each run, so expect
#              most of a 10-minute call)
# Without a GPU, every part that needs one reports "skipped: no GPU"; build and emu still run.
#
# Report: DIR/gpu_report.md and DIR/gpu_report.json (DIR: --out, else $OUT, else
# ./gpu_report), and the full log DIR/gpu_check.log. Exit status 0 when nothing failed.
#
# Environment: LLMC_GPUDEPS (the gathered folder), LLMC_GPUDEPS_RUNTIME (where the runtime
# libraries are unpacked; default /tmp/llmc-gpudeps), BUILD (default build-gpu), JOBS,
# LLMC_PART_TIMEOUT (seconds a part may run; default none), LLMC_CHECK_BUDGET (seconds the whole
# script may run: parts are cut to fit and skipped when it is spent), LLMC_CHECK_RUN_TIMEOUT (seconds one
# training run of train/modes/sanitizer/nccl may take; default 600), LLMC_BENCH_ARGS (more
# gpu_bench.py arguments for part bench, split at spaces: e.g. "--ours-env LLMC_ATT_PIPELINE=1
# --torch-amp").
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUTDIR=${OUT:-$ROOT/gpu_report}
PARTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUTDIR=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    all) PARTS+=(build emu kernels train gpt modes sanitizer nccl bench); shift ;;
    build|emu|kernels|train|gpt|modes|sanitizer|nccl|bench|memory|memory8b|maxctx) PARTS+=("$1"); shift ;;
    *) echo "gpu_check: unknown part '$1' (build emu kernels train gpt modes sanitizer nccl bench memory memory8b maxctx all)" >&2; exit 2 ;;
  esac
done
[ ${#PARTS[@]} -gt 0 ] || PARTS=(build emu kernels train gpt modes sanitizer nccl bench)
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/gpu_check.log
RES=$(mktemp -d /tmp/llmc_gpucheck_res.XXXXXX)
: > "$LOG"
DEPS=$(realpath -m "${LLMC_GPUDEPS:-$ROOT/.gpudeps}")
RT=$(realpath -m "${LLMC_GPUDEPS_RUNTIME:-/tmp/llmc-gpudeps}")
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
PY=$(command -v python3 || echo /usr/bin/python3)

log() { echo "$@" | tee -a "$LOG"; }
# result PART STATUS SECS DETAIL: one line of the report (STATUS: pass, fail, skipped)
result() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$RES/results.tsv"; log "== $1: $2${4:+ ($4)}"; }

# ---- the machine ---------------------------------------------------------------------------
GPU=0 GPU_NAME="" CCAP="" GPU_WHY=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  GPU=1
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  CCAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' ')
  NGPU=$(nvidia-smi -L | grep -c '^GPU ')
else
  GPU_WHY=$(command -v nvidia-smi >/dev/null 2>&1 && echo "nvidia-smi lists no GPU" || echo "nvidia-smi absent")
  NGPU=0
fi
NVCC=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || echo "")
if [ -n "$CCAP" ]; then
  ARCH=${CCAP/./}
  # sm_90a (Hopper's own instructions) as the -gencode form (HOPPER.md), PTX for the family
  case "$ARCH" in
    90) GENCODE="-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90" ;;
    *) GENCODE="-gencode arch=compute_$ARCH,code=sm_$ARCH -gencode arch=compute_$ARCH,code=compute_$ARCH" ;;
  esac
else
  GENCODE="-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90"
fi

# ---- the private prefix ----------------------------------------------------------------------
INC=$DEPS/prefix/include
LIB=$RT/lib
unpack_deps() {
  [ -d "$DEPS/debs" ] && [ -d "$INC" ] || { log "gpu_check: $DEPS is missing or incomplete: run scripts/gpu_deps.sh where the registries are, and carry it"; return 1; }
  mkdir -p "$RT/root" "$LIB"
  for deb in "$DEPS"/debs/*.deb; do
    if command -v dpkg-deb >/dev/null 2>&1; then
      dpkg-deb -x "$deb" "$RT/root" || return 1
    else  # ar + tar: the .deb format without dpkg
      t=$(mktemp -d); (cd "$t" && ar x "$deb" && tar xf data.tar.* -C "$RT/root") || return 1; rm -rf "$t"
    fi
  done
  local L=$RT/root/usr/lib/x86_64-linux-gnu
  ln -sf "$L/openblas-openmp/libopenblas.so.0" "$LIB/libopenblas.so.0"
  ln -sf "$L/openblas-openmp/libopenblas.so.0" "$LIB/libopenblas.so"
  ln -sf "$L/libyaml-0.so.2" "$LIB/libyaml-0.so.2"; ln -sf "$L/libyaml-0.so.2" "$LIB/libyaml.so"
  ln -sf "$L/libcjson.so.1" "$LIB/libcjson.so.1"; ln -sf "$L/libcjson.so.1" "$LIB/libcjson.so"
  ln -sf "$L/libgfortran.so.5" "$LIB/libgfortran.so.5"
  ln -sf "$L/libquadmath.so.0" "$LIB/libquadmath.so.0"
  # libgomp belongs to the compiler: the machine's own when it has one (it must match the gcc
  # that compiles -fopenmp); the carried one only where there is none
  rm -f "$LIB/libgomp.so.1"
  if ! { gcc -print-file-name=libgomp.so.1 2>/dev/null | grep -q /; } && ! ldconfig -p 2>/dev/null | grep -q 'libgomp.so.1 '; then
    ln -sf "$L/libgomp.so.1" "$LIB/libgomp.so.1"
  fi
  deps_env
}

# The environment every part needs once the prefix is unpacked (a part run in a later
# invocation of this script, after `build` in an earlier one, needs it too)
deps_env() {
  # NCCL: the pip wheel (nvidia-nccl-cu*) when the toolkit has no nccl.h
  NCCL_INC="" NCCL_LIB=""
  local cuda_home; cuda_home=$(dirname "$(dirname "$(realpath "${NVCC:-/usr/local/cuda/bin/nvcc}")")")
  if [ ! -f "$cuda_home/include/nccl.h" ] && [ ! -f /usr/include/nccl.h ]; then
    local w
    w=$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
    if [ -n "$w" ] && [ -f "$w/include/nccl.h" ]; then
      NCCL_INC=$w/include NCCL_LIB=$w/lib
      ln -sf "$(ls "$w"/lib/libnccl.so* | head -1)" "$LIB/libnccl.so"
    fi
  fi
  export LD_LIBRARY_PATH="$LIB${NCCL_LIB:+:$NCCL_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
[ -e "$LIB/libopenblas.so.0" ] && deps_env

# make with every path from the prefix
NOMPI="-DLLMC_NO_MPI"
mk() {
  local extra_nv="${NCCL_INC:+-I$NCCL_INC}"
  local use_cuda=1; [ -n "$NVCC" ] || use_cuda=0
  ${MK_PREFIX:-} make -j"$JOBS" BUILD="$BUILD" USE_CUDA=$use_cuda ${NVCC:+NVCC=$NVCC} \
    BLAS_INC="$INC/openblas" BLAS_LIB="$LIB" \
    MPI_CFLAGS= MPI_LIBS= \
    CFLAGS="-O3 -g -I$INC -I$INC/stb $NOMPI" \
    CUDA_GENCODE="$GENCODE" NVCCFLAGS="-O3 -std=c++17 $GENCODE $extra_nv" "$@"
}

# ---- parts --------------------------------------------------------------------------------
# LLMC_PART_TIMEOUT=S: each part's commands (not the build) are stopped after S seconds, with
# everything they started (timeout kills its process group), and the part reports a failure
# naming the limit: a hang costs one part, not a lease
# LLMC_CHECK_BUDGET=S: the whole script's seconds (for a lease): a part's limit is cut to what is
# left (less 20 s for the report), and parts that would start with under 50 s left are skipped
PART_TIMEOUT=${LLMC_PART_TIMEOUT:-0}
BUDGET=${LLMC_CHECK_BUDGET:-0}
part_limit() {  # seconds the next command may run, 0 = no limit
  local lim=$PART_TIMEOUT
  if [ "$BUDGET" -gt 0 ] 2>/dev/null; then
    local left=$((BUDGET - SECONDS - 20))
    [ "$left" -lt 1 ] && left=1
    { [ "$lim" -le 0 ] || [ "$left" -lt "$lim" ]; } && lim=$left
  fi
  echo "$lim"
}
limited() { local lim; lim=$(part_limit); PART_LIMIT_USED=$lim; if [ "$lim" -gt 0 ]; then timeout -k 10 "$lim" "$@"; else "$@"; fi; }
# the same for mk, a shell function (timeout runs programs only)
limited_mk() { local lim; lim=$(part_limit); PART_LIMIT_USED=$lim; if [ "$lim" -gt 0 ]; then MK_PREFIX="timeout -k 10 $lim" mk "$@"; else mk "$@"; fi; }
timed_out() { [ "$1" = 124 ] || [ "$1" = 137 ]; }
need_gpu() { if [ $GPU = 0 ]; then result "$1" skipped 0 "skipped: no GPU ($GPU_WHY)"; return 1; fi; }
need_build() { [ -x "$BUILD/train_llama" ] || { result "$1" fail 0 "no $BUILD/train_llama: run the build part first"; return 1; }; }

part_build() {
  local t0=$SECONDS
  unpack_deps >> "$LOG" 2>&1 || { result build fail $((SECONDS - t0)) "cannot unpack $DEPS"; return; }
  log "build: nvcc ${NVCC:-none} ($([ -n "$NVCC" ] && "$NVCC" --version | tail -1)), gcc $(gcc -dumpfullversion 2>/dev/null), GPU ${GPU_NAME:-none} cc ${CCAP:-?}, gencode: $GENCODE"
  local targets="$BUILD/train_llama $BUILD/train_gpt"
  [ -n "$NVCC" ] && targets="$targets cuda-dev"
  if ! mk $targets >> "$LOG" 2>&1; then
    result build fail $((SECONDS - t0)) "make failed: see gpu_check.log"; return
  fi
  # every non-system library the binaries need must come from the prefix (or CUDA / NCCL)
  local bad="" lib
  for b in "$BUILD/train_llama" "$BUILD/train_gpt"; do
    ldd "$b" >> "$LOG" 2>&1
    for lib in libopenblas libyaml libcjson libgfortran libquadmath; do
      local where; where=$(ldd "$b" | awk -v l="$lib" 'index($1, l) == 1 {print $3; exit}')
      case "$where" in
        "$RT"/*) ;;
        *) bad="$bad $(basename "$b"):$lib=>${where:-missing}" ;;
      esac
    done
    if ldd "$b" | grep -q 'not found'; then bad="$bad $(basename "$b"):$(ldd "$b" | awk '/not found/ {print $1}' | tr '\n' ',')"; fi
  done
  if grep -E -- '-I/usr/include/x86_64-linux-gnu/openblas|-L/usr/lib/x86_64-linux-gnu/openblas' "$LOG" | grep -q .; then
    bad="$bad compile-lines-name-system-openblas"
  fi
  # two CPU training steps: the libraries load and work
  local tmp; tmp=$(mktemp -d)
  "$PY" - "$tmp" <<'EOF' >> "$LOG" 2>&1
import random, struct, sys
from array import array
d = sys.argv[1]
r = random.Random(0)
t = array("H", (r.randrange(64) for _ in range(4096)))
open(d + "/t.bin", "wb").write(struct.pack("<256i", *([20240520, 1, len(t)] + [0] * 253)) + t.tobytes())
open(d + "/c.yaml", "w").write("""model:
  vocab_size: 64
  hidden_size: 32
  intermediate_size: 96
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  max_position_embeddings: 64
train_data: %s/t.bin
sequence_len: 32
micro_batch_size: 2
max_steps: 2
device: cpu
output_dir: %s/o
""" % (d, d))
EOF
  if ! "$BUILD/train_llama" -c "$tmp/c.yaml" >> "$LOG" 2>&1 || [ ! -s "$tmp/o/metrics.jsonl" ]; then
    bad="$bad cpu-smoke-run-failed"
  fi
  if [ -n "$NVCC" ]; then
    "$BUILD/train_llama" -c "$tmp/c.yaml" --set device=cuda --set output_dir="$tmp/o2" >> "$LOG" 2>&1
    log "build: device: cuda on this machine: exit $? (expected to fail with a clear line without a GPU)"
  fi
  rm -rf "$tmp"
  if [ -n "$bad" ]; then result build fail $((SECONDS - t0)) "$bad"
  else result build pass $((SECONDS - t0)) "ldd: OpenBLAS, libyaml, cJSON, libgfortran, libquadmath from $LIB; CPU smoke run ok${NVCC:+; nvcc build for $GENCODE}"
  fi
}

part_emu() {
  local t0=$SECONDS
  [ -d "$LIB" ] || unpack_deps >> "$LOG" 2>&1
  if [ -z "$NVCC" ]; then result emu skipped 0 "skipped: no CUDA headers (nvcc not found)"; return; fi
  limited_mk EMU="$BUILD-emu" test-cuda-emu > "$RES/emu.log" 2>&1; local rc=$?
  timed_out $rc && { cat "$RES/emu.log" >> "$LOG"; result emu fail $((SECONDS - t0)) "timed out after ${PART_LIMIT_USED:-?} s"; return; }
  cat "$RES/emu.log" >> "$LOG"
  local p f; p=$(grep -c '^PASS ' "$RES/emu.log"); f=$(grep -c '^FAIL ' "$RES/emu.log")
  [ $rc = 0 ] && [ "$f" = 0 ] && result emu pass $((SECONDS - t0)) "$p checks passed on the emulator" \
    || result emu fail $((SECONDS - t0)) "$f failed, $p passed, make exit $rc"
}

part_kernels() {
  need_gpu kernels || return; need_build kernels || return
  local t0=$SECONDS
  limited_mk test-cuda > "$RES/kernels.log" 2>&1; local rc=$?
  cat "$RES/kernels.log" >> "$LOG"
  timed_out $rc && echo "FAIL kernels: timed out after ${PART_LIMIT_USED:-?} s (LLMC_PART_TIMEOUT / LLMC_CHECK_BUDGET)" >> "$RES/kernels.log"
  grep -E '^(TIME|FAIL) ' "$RES/kernels.log" > "$RES/kernels.table" || true
  local p f; p=$(grep -c '^PASS ' "$RES/kernels.log"); f=$(grep -c '^FAIL ' "$RES/kernels.log")
  [ $rc = 0 ] && [ "$f" = 0 ] && [ "$p" -gt 0 ] && result kernels pass $((SECONDS - t0)) "$p checks passed" \
    || result kernels fail $((SECONDS - t0)) "$f failed, $p passed, make exit $rc"
}

part_py() {  # part_py PART [PYPART ARGS...]: scripts/gpu_train_check.py PYPART (default PART) ARGS
  # (on PY_BIN, default train_llama)
  local part=$1 py=${2:-$1}
  local extra=("${@:3}")
  need_gpu "$part" || return; need_build "$part" || return
  local t0=$SECONDS
  PART_LIMIT_USED=$(part_limit)
  # under a limit, the script stops starting runs in time to write its report
  local budget=()
  [ "$PART_LIMIT_USED" -gt 60 ] && budget=(--budget $((PART_LIMIT_USED - 45)))
  PYTHONUNBUFFERED=1 limited "$PY" scripts/gpu_train_check.py "$py" "${extra[@]}" --bin "${PY_BIN:-$BUILD/train_llama}" --json "$RES/$part.json" "${budget[@]}" 2>&1 | tee -a "$LOG" | grep -E '^(PASS|FAIL|SKIP)' || true
  if timed_out "${PIPESTATUS[0]}"; then
    result "$part" fail $((SECONDS - t0)) "timed out after ${PART_LIMIT_USED:-?} s (LLMC_PART_TIMEOUT / LLMC_CHECK_BUDGET): see gpu_check.log"
  elif [ -f "$RES/$part.json" ]; then
    local s; s=$("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["status"], sum(c["ok"] for c in r["checks"]), sum(not c["ok"] for c in r["checks"]))' "$RES/$part.json")
    set -- $s
    result "$part" "$1" $((SECONDS - t0)) "$2 passed, $3 failed"
  else
    result "$part" fail $((SECONDS - t0)) "no result: see gpu_check.log"
  fi
}

part_bench() {  # part_bench PART [gpu_bench.py ARGS...]
  local part=${1:-bench}
  need_gpu "$part" || return; need_build "$part" || return
  local t0=$SECONDS
  PART_LIMIT_USED=$(part_limit)
  local extra=("${@:2}")
  # the ladder's budget: what the part may take, less a minute for the report
  [ "$part" = maxctx ] && extra+=(--budget $(( PART_LIMIT_USED > 120 ? PART_LIMIT_USED - 60 : 540 )))
  PYTHONUNBUFFERED=1 limited "$PY" scripts/gpu_bench.py --bin "$BUILD/train_llama" --json "$RES/$part.json" "${extra[@]}" 2>&1 | tee -a "$LOG" | tail -8
  timed_out "${PIPESTATUS[0]}" && { result "$part" fail $((SECONDS - t0)) "timed out after ${PART_LIMIT_USED:-?} s (LLMC_PART_TIMEOUT / LLMC_CHECK_BUDGET)"; return; }
  [ -f "$RES/$part.json" ] && result "$part" "$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$RES/$part.json")" $((SECONDS - t0)) "see the table" \
    || result "$part" fail $((SECONDS - t0)) "no result: see gpu_check.log"
}

for p in "${PARTS[@]}"; do
  log "== part $p ($(date -u +%H:%M:%S))"
  if [ "$BUDGET" -gt 0 ] 2>/dev/null && [ $((BUDGET - SECONDS)) -lt 50 ]; then
    result "$p" skipped 0 "skipped: $((BUDGET - SECONDS)) s left of LLMC_CHECK_BUDGET=$BUDGET"; continue
  fi
  case $p in
    build) part_build ;;
    emu) part_emu ;;
    kernels) part_kernels ;;
    train|modes|sanitizer|nccl|memory) part_py "$p" ;;
    memory8b) part_py memory8b memory --shape 8b ;;
    gpt) PY_BIN="$BUILD/train_gpt" part_py gpt ;;
    bench) part_bench bench ${LLMC_BENCH_ARGS:-} ;;
    maxctx) part_bench maxctx --shape 8b --qlora --max-context ;;
  esac
done

# ---- report ---------------------------------------------------------------------------------
"$PY" - "$RES" "$OUTDIR" "$GPU_NAME" "$CCAP" "$GENCODE" "${NVCC:-}" "$DEPS" "$RT" "$NGPU" <<'EOF'
import json, os, subprocess, sys, time
res, out, gpu, cc, gencode, nvcc, deps, rt, ngpu = sys.argv[1:10]
parts = []
for line in open(os.path.join(res, "results.tsv")) if os.path.exists(os.path.join(res, "results.tsv")) else []:
    name, status, secs, detail = (line.rstrip("\n").split("\t") + [""] * 4)[:4]
    d = {"part": name, "status": status, "secs": int(secs or 0), "detail": detail}
    j = os.path.join(res, name + ".json")
    if os.path.exists(j):
        d["result"] = json.load(open(j))
    if name == "kernels" and os.path.exists(os.path.join(res, "kernels.table")):
        d["timings"] = open(os.path.join(res, "kernels.table")).read().splitlines()
    parts.append(d)
def cmd(*a):
    try:
        return subprocess.run(a, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        return ""
machine = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "gpu": gpu or None, "gpus": int(ngpu or 0),
           "compute_capability": cc or None, "gencode": gencode, "nvcc": (cmd(nvcc, "--version").splitlines() or [""])[-1] if nvcc else None,
           "driver": cmd("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader") or None,
           "gcc": cmd("gcc", "-dumpfullversion"), "host": os.uname().nodename, "kernel": os.uname().release,
           "git": cmd("git", "rev-parse", "--short", "HEAD") + (" (modified)" if cmd("git", "status", "--porcelain", "-uno") else ""),
           "deps": deps, "runtime_prefix": rt}
rep = {"machine": machine, "parts": parts, "ok": all(p["status"] != "fail" for p in parts)}
json.dump(rep, open(os.path.join(out, "gpu_report.json"), "w"), indent=1)
L = ["# GPU check report", "", "%s UTC, GPU: %s (cc %s, %s GPU(s)), driver %s, %s, gcc %s, git %s" % (
    machine["date_utc"], gpu or "none", cc or "-", ngpu, machine["driver"] or "-", machine["nvcc"] or "no nvcc", machine["gcc"], machine["git"]),
     "", "Build: `%s`; libraries from %s unpacked into %s." % (gencode, deps, rt), "",
     "| part | status | seconds | detail |", "|---|---|---|---|"]
for p in parts:
    L.append("| %s | %s | %d | %s |" % (p["part"], p["status"], p["secs"], p["detail"].replace("|", "/")))
for p in parts:
    r = p.get("result")
    if p.get("timings"):
        L += ["", "## kernels: timings and failures", "", "```"] + p["timings"][:200] + ["```"]
    if not r:
        continue
    bad = [c for c in r.get("checks", []) if not c["ok"]]
    if r.get("checks"):
        L += ["", "## %s" % p["part"], ""] + ["- %s %s" % ("PASS" if c["ok"] else "FAIL", c["name"]) for c in r["checks"]]
        for c in bad:
            L += ["", "<details><summary>%s</summary>" % c["name"], "", "```", c["detail"][-2000:], "```", "</details>"]
    tables = dict(r.get("tables", {}))
    if "rows" in r:
        tables["bench (%s, %s params, T=%s, MFU vs %s TFLOP/s)" % (r.get("shape"), r.get("params"), r.get("seq"), r.get("peak_tflops"))] = r["rows"]
        L += ["", "Not covered by this benchmark yet: " + "; ".join(r.get("not_covered", []))]
    for name, rows in tables.items():
        if not rows:
            continue
        keys = list(dict.fromkeys(k for row in rows for k in row))
        L += ["", "### " + name, "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        L += ["| " + " | ".join(str(row.get(k, "")) for k in keys) + " |" for row in rows]
open(os.path.join(out, "gpu_report.md"), "w").write("\n".join(L) + "\n")
print("\n".join(L[:8 + len(parts)]))
sys.exit(0 if rep["ok"] else 1)
EOF
rc=$?
rm -rf "$RES"
echo "gpu_check: report in $OUTDIR/gpu_report.md and gpu_report.json, log in $OUTDIR/gpu_check.log"
exit $rc
