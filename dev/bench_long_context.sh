#!/usr/bin/env bash
# Long context on the CPU backend: for a small Llama (2 layers, hidden 256, 4/2 heads, MLP 688,
# vocab 256, B 1) at T = 1K..16K tokens, each memory mode's measured device, host and disk
# peaks (metrics.jsonl) and its fastest steady step. Writes dev/results/long_context.{md,json}
# and, with matplotlib, dev/results/long_context.png (dev/plot_long_context.py).
#   bash dev/bench_long_context.sh                 # TS="1024 2048 4096 8192 16384" STEPS=2
#   TS="1024 4096" BIN=build/train_llama NO_MAKE=1 bash dev/bench_long_context.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./train_llama}
TS=${TS:-1024 2048 4096 8192 16384}
STEPS=${STEPS:-2}
WARMUP=${WARMUP:-1}
OUT=${OUT:-dev/results}
[ "${NO_MAKE:-0}" = 1 ] || make -s >/dev/null
mkdir -p "$OUT"
DIR=$(mktemp -d -t bench_long.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
maxT=$(for t in $TS; do echo "$t"; done | sort -n | tail -1)
/usr/bin/python3 - "$DIR" "$maxT" <<'PY'
import random, struct, sys
d, T = sys.argv[1], int(sys.argv[2]); r = random.Random(0); n = 4 * T + 1
with open(d + "/train.bin", "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
    f.write(struct.pack("<%dH" % n, *[r.randrange(256) for _ in range(n)]))
PY
modes=(
  "plain|"
  "checkpointing|gradient_checkpointing=true"
  "hidden_states|activation_offloading=hidden_states"
  "hidden_states + tiled MLP|activation_offloading=hidden_states tiled_mlp=true tiled_mlp_shards=8"
  "hidden_states + tiled MLP + attention|activation_offloading=hidden_states tiled_mlp=true tiled_mlp_shards=8 tiled_attention=true"
  "all activations on disk|activation_offloading=disk"
)
for extra in ${EXTRA_MODES:-}; do modes+=("$extra"); done
: > "$DIR/rows"
for T in $TS; do
  for m in "${modes[@]}"; do
    name=${m%%|*}; sets=${m#*|}
    cat > "$DIR/cfg.yaml" <<CFG
model:
  vocab_size: 256
  hidden_size: 256
  intermediate_size: 688
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  max_position_embeddings: $T
train_data: $DIR/train.bin
shuffle: false
sequence_len: $T
micro_batch_size: 1
max_steps: $((STEPS + WARMUP))
learning_rate: 1e-3
activation_offloading_dir: $DIR
output_dir: $DIR/out
CFG
    args=(); for s in $sets; do args+=(--set "$s"); done
    rm -rf "$DIR/out"
    if "$BIN" -c "$DIR/cfg.yaml" "${args[@]}" > "$DIR/log" 2>&1; then
      cp "$DIR/out/metrics.jsonl" "$DIR/m$(wc -l < "$DIR/rows").jsonl"
      echo "$T|$name|$DIR/m$(wc -l < "$DIR/rows").jsonl" >> "$DIR/rows"
      echo "ran: T=$T $name" >&2
    else
      echo "failed: T=$T $name: $(grep -m1 error "$DIR/log" || tail -1 "$DIR/log")" >&2
    fi
  done
done
/usr/bin/python3 - "$DIR/rows" "$WARMUP" "$OUT" "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" <<'PY'
import json, sys, datetime
rows = [l.rstrip("\n").split("|") for l in open(sys.argv[1])]
warm, out, cpu = int(sys.argv[2]), sys.argv[3], sys.argv[4]
res = []
for T, name, path in rows:
    recs = [json.loads(l) for l in open(path) if '"loss"' in l]
    steady = recs[warm:] or recs
    res.append({"T": int(T), "mode": name, "ms": min(r["ms"] for r in steady),  # other load only adds time
                "device_peak_bytes": recs[-1]["device_peak_bytes"], "host_peak_bytes": recs[-1]["host_peak_bytes"],
                "disk_peak_bytes": recs[-1]["disk_peak_bytes"], "loss": recs[-1]["loss"]})
meta = {"cpu": cpu, "date": datetime.date.today().isoformat(),
        "model": "2 layers, hidden 256, 4/2 heads, MLP 688, vocab 256, B 1, float32", "rows": res}
json.dump(meta, open(out + "/long_context.json", "w"), indent=1)
mib = lambda b: "%.1f" % (b / 1048576)
lines = ["Long context on the CPU (%s, %s): %s; fastest steady step." % (cpu, meta["date"], meta["model"]), "",
         "| T | mode | ms/step | device peak MiB | host peak MiB | disk peak MiB | loss |",
         "|---:|---|---:|---:|---:|---:|---:|"]
for r in res:
    lines.append("| %d | %s | %.0f | %s | %s | %s | %.6f |" % (r["T"], r["mode"], r["ms"], mib(r["device_peak_bytes"]),
                 mib(r["host_peak_bytes"]), mib(r["disk_peak_bytes"]), r["loss"]))
open(out + "/long_context.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
/usr/bin/python3 dev/plot_long_context.py "$OUT/long_context.json" "$OUT/long_context.png" || echo "(no plot: matplotlib missing?)"
