#!/usr/bin/env bash
# Memory modes on the CPU backend: step time relative to the plain run and the measured
# device/host/disk peaks of each mode, for a mid-size model (8 layers, hidden 256, T 512, B 4).
#   bash dev/bench_memory.sh            # STEPS=4 WARMUP=2 BIN=./train_llama
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./train_llama}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
[ "${NO_MAKE:-0}" = 1 ] || make -s >/dev/null
DIR=$(mktemp -d -t bench_mem.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
/usr/bin/python3 - "$DIR" <<'PY'
import random, struct, sys
d = sys.argv[1]; r = random.Random(0); n = 400000
with open(d + "/train.bin", "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
    f.write(struct.pack("<%dH" % n, *[r.randrange(256) for _ in range(n)]))
PY
cat > "$DIR/cfg.yaml" <<CFG
model:
  vocab_size: 256
  hidden_size: 256
  intermediate_size: 688
  num_hidden_layers: 8
  num_attention_heads: 4
  num_key_value_heads: 2
  max_position_embeddings: 512
train_data: $DIR/train.bin
shuffle: false
sequence_len: 512
micro_batch_size: 4
max_steps: $((STEPS + WARMUP))
learning_rate: 1e-3
activation_offloading_dir: $DIR
output_dir: $DIR/out
CFG
modes=(
  "plain|"
  "checkpointing|gradient_checkpointing=true"
  "checkpointing every 2|gradient_checkpointing=true gradient_checkpointing_every=2"
  "selective|gradient_checkpointing=selective"
  "offload true|activation_offloading=true"
  "offload legacy|activation_offloading=legacy"
  "offload disk|activation_offloading=disk"
  "hidden_states|activation_offloading=hidden_states"
  "plain + tiled MLP|tiled_mlp=true tiled_mlp_shards=4"
  "hidden_states + tiled MLP|activation_offloading=hidden_states tiled_mlp=true tiled_mlp_shards=4"
  "LoRA r16 (resident base)|adapter=lora lora_r=16 lora_target_linear=true"
  "LoRA + layer_offloading|adapter=lora lora_r=16 lora_target_linear=true layer_offloading=true"
  "QLoRA r16 (resident NF4 base)|adapter=qlora load_in_4bit=true lora_r=16 lora_target_linear=true"
  "QLoRA + layer_offloading|adapter=qlora load_in_4bit=true lora_r=16 lora_target_linear=true layer_offloading=true"
  "QLoRA + layer_offloading + hidden_states|adapter=qlora load_in_4bit=true lora_r=16 lora_target_linear=true layer_offloading=true activation_offloading=hidden_states"
)
: > "$DIR/rows"
for m in "${modes[@]}"; do
  name=${m%%|*}; sets=${m#*|}
  args=(); for s in $sets; do args+=(--set "$s"); done
  rm -rf "$DIR/out"
  "$BIN" -c "$DIR/cfg.yaml" "${args[@]}" > "$DIR/log" 2>&1 || { tail -3 "$DIR/log"; exit 1; }
  cp "$DIR/out/metrics.jsonl" "$DIR/m$(wc -l < "$DIR/rows").jsonl"
  echo "$name|$DIR/m$(wc -l < "$DIR/rows").jsonl" >> "$DIR/rows"
  echo "ran: $name" >&2
done
/usr/bin/python3 - "$DIR/rows" "$WARMUP" <<'PY'
import json, sys
rows = [l.rstrip("\n").split("|") for l in open(sys.argv[1])]
warm = int(sys.argv[2])
def mib(b): return "%.1f MiB" % (b / 1048576)
out = []
for name, path in rows:
    recs = [json.loads(l) for l in open(path) if '"loss"' in l]
    steady = recs[warm:]
    # The fastest steady step: on a shared machine, other load only ever adds time.
    ms = min(r["ms"] for r in steady)
    out.append((name, ms, recs[-1]["device_peak_bytes"], recs[-1]["host_peak_bytes"], recs[-1]["disk_peak_bytes"],
                recs[-1].get("streamed_weight_bytes", 0), recs[-1]["loss"]))
# Full fine-tuning rows compare with plain; adapter rows with the resident adapter run above them.
base = out[0][1]
print("| mode | ms/step (fastest) | vs reference | device peak | host peak | disk peak | weights streamed/step | loss after last step |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
ref = base
for name, ms, d, h, k, st, loss in out:
    if "resident" in name: ref = ms
    print("| %s | %.0f | %.2fx | %s | %s | %s | %s | %.6f |" % (name, ms, ms / ref, mib(d), mib(h), mib(k), mib(st), loss))
PY
