#!/usr/bin/env python3
"""Runs every test program and prints one summary line: 'N passed, M failed'.

Each test prints 'PASS name' / 'FAIL name: why' lines; a test that exits non-zero without a
FAIL line counts as one failure, so a crash can never pass silently.
  /usr/bin/python3 test/run_tests.py --build build [--asan] [-k substring]
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"


def tests(build):
    bin_ = os.path.join(build, "train_llama")
    return [
        ("ops", [os.path.join(build, "test_ops")]),
        ("cpu_variants", [os.path.join(build, "test_cpu_variants")]),
        ("safetensors", [os.path.join(build, "test_safetensors")]),
        ("nf4", [os.path.join(build, "test_nf4")]),
        ("nf4_ref", [PY, "test/test_nf4.py", "--build", build]),
        ("comm", [PY, "test/test_comm.py", "--build", build]),
        ("seqpar", [PY, "test/test_seqpar.py", "--build", build]),
        ("tiled_attention", [PY, "test/test_tiled_attention.py", "--build", build]),
        ("bad_inputs", [PY, "test/test_bad_inputs.py", "--bin", bin_]),
        ("axolotl_config", [PY, "test/test_axolotl_config.py", "--bin", bin_]),
        ("shards_live", [PY, "test/test_shards_live.py", "--bin", bin_]),
        ("resume", [PY, "test/test_resume.py", "--bin", bin_]),
        ("runs", [PY, "test/test_runs.py", "--bin", bin_]),
        ("torch_ref", [PY, "test/test_torch_ref.py", "--bin", bin_]),
        ("families", [PY, "test/test_families.py", "--bin", bin_]),
        ("phi3", [PY, "test/test_phi3.py", "--bin", bin_]),
        ("adamw8", [PY, "test/test_adamw8.py", "--bin", bin_]),
        ("dpo", [PY, "test/test_dpo.py", "--bin", bin_]),
        ("reward", [PY, "test/test_reward.py", "--bin", bin_]),
        ("gpt2_ref", [PY, "test/test_gpt2_ref.py", "--bin", os.path.join(build, "train_gpt")]),
        ("train_gpt", [PY, "test/test_train_gpt.py", "--bin", os.path.join(build, "train_gpt")]),
        ("gpt2_lora", [PY, "test/test_gpt2_lora.py", "--bin", os.path.join(build, "train_gpt")]),
        ("lora_ref", [PY, "test/test_lora_ref.py", "--bin", bin_]),
        ("qlora", [PY, "test/test_qlora.py", "--bin", bin_]),
        ("int8", [PY, "test/test_int8.py", "--bin", bin_]),
        ("nonfinite", [PY, "test/test_nonfinite.py", "--bin", bin_]),
        ("metrics", [PY, "test/test_metrics.py", "--bin", bin_]),
        ("profile", [PY, "test/test_profile.py", "--bin", bin_]),
        ("export", [PY, "test/test_export.py", "--bin", bin_]),
        ("peft_config", [PY, "test/test_peft_config.py", "--bin", bin_]),
        ("peft_layers", [PY, "test/test_peft_layers.py", "--bin", bin_]),
        ("tokenize_hf", [PY, "test/test_tokenize_hf.py"]),
        ("plan", [PY, "test/test_plan.py", "--bin", bin_]),
        ("plan_accuracy", [PY, "test/test_plan_accuracy.py", "--bin", bin_]),
        ("tiers", [PY, "test/test_tiers.py", "--bin", bin_]),
        ("prepare_data", [PY, "test/test_prepare_data.py"]),
        ("datasets_c", [PY, "test/test_datasets_c.py", "--bin", bin_]),
        ("datasets_ref", [PY, "test/test_datasets_ref.py", "--bin", bin_]),
        ("axolotl_datasets", [PY, "test/test_axolotl_datasets.py", "--bin", bin_]),
        ("plot", [PY, "test/test_plot.py", "--bin", bin_]),
        ("train_smoke", [PY, "test/test_train_smoke.py", "--bin", bin_]),
        ("memory_modes", [PY, "test/test_memory_modes.py", "--bin", bin_]),
        ("sharding", [PY, "test/test_sharding.py", "--bin", bin_]),
        ("limits", [PY, "test/test_limits.py", "--build", build]),
        ("cuda", [PY, "test/test_cuda.py", "--bin", bin_]),
        ("cuda_emu_train", [PY, "test/test_cuda_emu_train.py", "--build", build]),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--asan", action="store_true")
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    env = dict(os.environ)
    # The suite checks the CPU backend; the CUDA tests pick their device themselves.
    env.setdefault("LLMC_DEVICE", "cpu")
    if args.asan:
        env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
        env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    passed = failed = skipped = 0
    start = time.time()
    for name, cmd in tests(args.build):
        if args.k not in name:
            continue
        t0 = time.time()
        print("== %s: %s" % (name, " ".join(cmd)), flush=True)
        p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace")
        np_ = nf = ns = 0
        for line in p.stdout.splitlines():
            if line.startswith("PASS "):
                np_ += 1
            elif line.startswith("FAIL "):
                nf += 1
            elif line.startswith("SKIP "):
                ns += 1
            if line.startswith(("PASS ", "FAIL ", "SKIP ")) or nf or p.returncode:
                print("   " + line)
        if p.returncode != 0 and nf == 0:
            nf = 1
            print("   FAIL %s: exited with %d and no FAIL line" % (name, p.returncode))
        if p.returncode == 0 and np_ + ns == 0:
            nf += 1
            print("   FAIL %s: ran no check" % name)
        passed, failed, skipped = passed + np_, failed + nf, skipped + ns
        print("   -> %d passed, %d failed, %d skipped in %.1fs" % (np_, nf, ns, time.time() - t0), flush=True)
    print("%d passed, %d failed, %d skipped in %.0fs" % (passed, failed, skipped, time.time() - start))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
