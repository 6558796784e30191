#!/usr/bin/python3
"""Planning for the GPU on any machine, and the host budget (issue 12, items 1 and 2 in part).

  * `--plan` with `device: cuda` runs without a GPU, needs device_memory_limit (one error line
    naming it otherwise), and prints the device assumptions it used;
  * the CUDA plan in float32 is the CPU plan plus the fixed device memory it states, row by
    row (same allocations, same element size); in bfloat16 every row needs less device memory,
    and gradients are counted at 4 bytes (float) per trainable parameter;
  * host_memory_limit marks modes whose host peak exceeds it as not fitting (on the CPU backend,
    where "device" memory is host memory, device + host must fit), and `auto` picks only among
    modes that fit both budgets, or stops with an error when none does;
  * the Llama-3.1-8B shape (config.json only: planning loads no weights) with QLoRA r16 at 131K
    tokens on an 80 GB GPU has a fitting mode, and at 524,288 tokens hidden_states + tiled MLP
    fits 80 GiB device + 128 GiB host with no disk; with 8 ranks of sequence parallelism a full
    fine-tune at 524,288 tokens (Axolotl's ALST example) fits 80 GiB a rank with offload_params,
    which moves each rank's pieces and float gradients (6 B a parameter / 8) off the device.
Usage: /usr/bin/python3 test/test_plan.py --bin build/train_llama
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile

from checks import check, finish, run_trainer, write_shard

UNITS = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}


def run(binary, cfg, *sets):
    return run_trainer(binary, cfg, *sets, drop_env=("LLMC_DEVICE",))


def rows(out):
    """mode -> (device bytes, host bytes, fits) from a printed plan."""
    got = {}
    for line in out.splitlines():
        m = re.match(r"\| (.+?) +\| +([\d.]+) (\w+) \| +([\d.]+) (\w+) \|.*\| +(yes|no) \|$", line)
        if m:
            got[m.group(1)] = (float(m.group(2)) * UNITS[m.group(3)], float(m.group(4)) * UNITS[m.group(5)],
                               m.group(6) == "yes")
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    root = tempfile.mkdtemp(prefix="test_plan.")
    try:
        toks = [i % 200 for i in range(5000)]
        data = os.path.join(root, "train.bin")
        write_shard(data, toks)
        cfg = os.path.join(root, "cfg.yaml")
        with open(cfg, "w") as f:
            f.write("model:\n  vocab_size: 256\n  hidden_size: 64\n  intermediate_size: 160\n"
                    "  num_hidden_layers: 2\n  num_attention_heads: 4\n  max_position_embeddings: 256\n"
                    "train_data: %s\nsequence_len: 128\nmicro_batch_size: 2\nmax_steps: 2\nnum_threads: 1\n"
                    "output_dir: %s\n" % (data, os.path.join(root, "out")))

        rc, out, err = run(binary, cfg, "device=cuda", "--plan")
        lines = [l for l in err.splitlines() if l.strip()]
        check("cuda plan without device_memory_limit: one error naming it",
              rc == 1 and len(lines) == 1 and "device_memory_limit" in lines[0], err)
        rc, out, err = run(binary, cfg, "device=cuda", "device_memory_limit=80GiB", "dtype=float32", "--plan")
        cuda32 = rows(out)
        check("cuda plan runs without a GPU and prints its assumptions",
              rc == 0 and len(cuda32) >= 8 and "assumptions (H100" in out and "TFLOP/s" in out, out + err)
        fixed = re.search(r"fixed device memory ([\d.]+) (\w+)", out)
        fixed = float(fixed.group(1)) * UNITS[fixed.group(2)] if fixed else -1
        rc, out, err = run(binary, cfg, "device=cpu", "--plan")
        cpu = rows(out)
        check("cuda and cpu plans both have the 8 tiled-attention rows",
              sum(k.endswith("+ attention") for k in cpu) == 8 and sum(k.endswith("+ attention") for k in cuda32) == 8,
              sorted(cuda32))
        # The tiered modes (offload true, ckpt + offload, hidden_states) keep what the 80 GiB
        # leave on the device: their host peak drops to zero there; the others are the same
        # allocations on both.
        tiered = [k for k in cpu if k.startswith(("offload true", "ckpt + offload true", "hidden_states"))]
        check("cuda fp32 plan = cpu plan + the stated fixed device memory, every untiered row",
              len(cpu) >= 8 and cpu.keys() == cuda32.keys() and fixed > 0 and len(tiered) == 9 and
              all(abs(cuda32[k][0] - cpu[k][0] - fixed) <= 0.01 * cpu[k][0] + 2 ** 20 and
                  abs(cuda32[k][1] - cpu[k][1]) <= 0.01 * max(cpu[k][1], 1) for k in cpu if k not in tiered),
              "fixed %s\ncpu %s\ncuda %s" % (fixed, cpu, cuda32))
        check("cuda plan with room on the device: the tiered modes keep everything there (no host peak)",
              all(cuda32[k][1] == 0 and cuda32[k][2] and cuda32[k][0] <= cpu[k][0] + cpu[k][1] + fixed + 2 ** 20
                  for k in tiered), repr({k: (cpu[k], cuda32[k]) for k in tiered}))
        rc, out, err = run(binary, cfg, "device=cuda", "device_memory_limit=80GiB", "--plan")
        bf16 = rows(out)
        check("cuda bf16 plan needs less device memory than fp32 in every row",
              len(bf16) >= 8 and bf16.keys() == cuda32.keys() and all(bf16[k][0] < cuda32[k][0] for k in bf16),
              repr(bf16))

        # Gradients are float in bf16 too (backend.h): 1024 more vocabulary rows (embedding and
        # head, untied, full fine-tuning) cost 2 (weights) + 4 (gradients) + 4 (fp32 master) +
        # 8 (AdamW moments) bytes per parameter, plus the 2-byte sampling logits; bf16
        # gradients would have been 16 bytes per parameter (0.25 MiB less here).
        cfg_v = os.path.join(root, "cfg_v.yaml")
        with open(cfg) as f, open(cfg_v, "w") as g:
            g.write(f.read().replace("vocab_size: 256", "vocab_size: 1280"))
        rc, out, err = run(binary, cfg_v, "device=cuda", "device_memory_limit=80GiB", "--plan")
        wide = rows(out)
        want = 1024 * (64 * 2 * 18 + 2)
        got = wide.get("plain", (0,))[0] - bf16.get("plain", (0,))[0]
        check("cuda bf16 plan counts float gradients: 1024 more vocabulary rows add %.4f MiB (measured %.2f)"
              % (want / 2 ** 20, got / 2 ** 20), rc == 0 and abs(got - want) <= 0.011 * 2 ** 20, out + err)

        # Host budget on the CPU backend: device + host must fit.
        plain_dev = cpu["plain"][0]
        hl = int(plain_dev * 0.8)
        rc, out, err = run(binary, cfg, "device=cpu", "host_memory_limit=%d" % hl, "--plan")
        lim = rows(out)
        check("host_memory_limit: modes over it do not fit, modes under it do",
              rc == 0 and not lim["plain"][2] and
              all(v[2] == (v[0] + v[1] <= hl) for v in lim.values()), repr(lim))
        fit = [k for k, v in lim.items() if v[2]]
        rc, out, err = run(binary, cfg, "device=cpu", "host_memory_limit=%d" % hl,
                           "activation_offloading=auto", "output_dir=" + os.path.join(root, "auto"))
        picked = re.search(r"auto picked '(.+)'", out)
        check("auto picks a mode within host_memory_limit",
              rc == 0 and picked and picked.group(1) in fit, out[-400:] + err)
        rc, out, err = run(binary, cfg, "device=cpu", "host_memory_limit=1KiB",
                           "activation_offloading=auto", "output_dir=" + os.path.join(root, "auto2"))
        check("auto with no fitting mode: one error", rc == 1 and "no mode fits" in err, err)

        # The 8B shape: QLoRA r16 at 131,072 tokens on one 80 GB GPU.
        d8 = os.path.join(root, "llama8b")
        os.makedirs(d8)
        json.dump({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
                   "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "max_position_embeddings": 4194304, "rms_norm_eps": 1e-5,
                   "rope_theta": 500000.0, "torch_dtype": "bfloat16"}, open(os.path.join(d8, "config.json"), "w"))
        c8 = os.path.join(root, "c8.yaml")
        with open(c8, "w") as f:
            f.write("base_model: %s\ntrain_data: %s\nsequence_len: 131072\nmicro_batch_size: 1\n"
                    "adapter: qlora\nload_in_4bit: true\nlora_r: 16\nlora_alpha: 32\nlora_target_linear: true\n"
                    "device: cuda\ndevice_memory_limit: 80GiB\nhost_memory_limit: 128GiB\noutput_dir: %s\n"
                    % (d8, data, os.path.join(root, "o8")))
        rc, out, err = run(binary, c8, "--plan")
        r8 = rows(out)
        check("8B QLoRA r16 at 131K tokens: a mode fits 80 GiB device and 128 GiB host",
              rc == 0 and any(v[2] for v in r8.values()) and
              all(v[0] <= 80 * 2 ** 30 and v[1] <= 128 * 2 ** 30 for v in r8.values() if v[2]), out + err)
        # 524,288 tokens with no disk: hidden states on the host, the MLP tiled, and the offload
        # stash capped (two 4 GiB buffers, not max_fwd_stash_size's five).
        rc, out, err = run(binary, c8, "sequence_len=524288", "--plan")
        r8 = rows(out)
        hs = r8.get("hidden_states + tiled MLP", (0, 0, False))
        check("8B QLoRA r16 at 524,288 tokens: hidden_states + tiled MLP fits 80 GiB device and 128 GiB host "
              "(%.1f GiB, %.1f GiB)" % (hs[0] / 2 ** 30, hs[1] / 2 ** 30),
              rc == 0 and hs[2] and 0 < hs[0] <= 80 * 2 ** 30 and 0 < hs[1] <= 128 * 2 ** 30, out + err)
        # 4,194,304 tokens per sequence over 8 ranks (sequence_parallel_degree 8, ALST's 3.7M).
        if shutil.which("mpirun"):
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            env.pop("LLMC_DEVICE", None)
            p = subprocess.run(["mpirun", "-np", "8", "--oversubscribe", "--bind-to", "none", binary, "-c", c8,
                                "--set", "sequence_len=4194304", "--set", "sequence_parallel_degree=8", "--plan"],
                               capture_output=True, text=True, timeout=300, env=env)
            fit = {k: v for k, v in rows(p.stdout).items() if v[2]}
            check("8B QLoRA r16 at 4,194,304 tokens over 8 ranks (sequence parallel): a mode fits 80 GiB device "
                  "and 128 GiB host per rank (%s)" % ", ".join("%s %.1f GiB" % (k, v[0] / 2 ** 30) for k, v in fit.items()),
                  p.returncode == 0 and fit and all(v[0] <= 80 * 2 ** 30 and v[1] <= 128 * 2 ** 30 for v in fit.values()),
                  p.stdout[-2000:] + p.stderr[-500:])
            # A full fine-tune of the 8B shape at 524,288 tokens over 8 ranks (Axolotl's ALST
            # example: ZeRO-3 with everything offloaded): offload_params takes each rank's
            # pieces (bf16) and their float gradients off the device, 6 B x 8.03e9 / 8, and puts
            # the pieces on the host; with checkpointing + tiled MLP a rank then fits 80 GiB.
            ft = os.path.join(root, "c8ft.yaml")
            with open(ft, "w") as f:
                f.write("base_model: %s\ntrain_data: %s\nsequence_len: 524288\nmicro_batch_size: 1\n"
                        "sequence_parallel_degree: 8\ndtype: bfloat16\ndevice: cuda\ndevice_memory_limit: 80GiB\n"
                        "host_memory_limit: 128GiB\noutput_dir: %s\n" % (d8, data, os.path.join(root, "o8ft")))
            got = {}
            for how in (("zero_stage=3", "offload_optimizer=true"), ("offload_params=true",)):
                sets = sum((["--set", x] for x in how), [])
                p = subprocess.run(["mpirun", "-np", "8", "--oversubscribe", "--bind-to", "none", binary, "-c", ft] + sets +
                                   ["--plan"], capture_output=True, text=True, timeout=300, env=env)
                got[how[0]] = (p.returncode, rows(p.stdout).get("checkpointing + tiled MLP"), p.stdout[-1500:] + p.stderr[-500:])
            (ra, a, oa), (rb, b, ob) = got["zero_stage=3"], got["offload_params=true"]
            pieces = 8.03e9 / 8
            check("8B full fine-tune at 524,288 tokens over 8 ranks, checkpointing + tiled MLP: offload_params takes "
                  ">= 6 B x 8.03e9 / 8 off each rank's device (%s) and puts >= 2 B x that on its host (%s), and fits "
                  "80 GiB" % ("%.1f -> %.1f GiB" % (a[0] / 2 ** 30, b[0] / 2 ** 30) if a and b else "?",
                              "%.1f -> %.1f GiB" % (a[1] / 2 ** 30, b[1] / 2 ** 30) if a and b else "?"),
                  ra == 0 and rb == 0 and a and b and a[0] - b[0] >= 6 * pieces and b[1] - a[1] >= 2 * pieces and b[2],
                  oa + ob)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
