#!/usr/bin/env python3
"""CUDA tests. With a GPU: `make test-cuda` (every dev/cuda program: each CUDA kernel against a
double-precision CPU reference, plus the backend table), its PASS/FAIL lines passed through.
Without one but with the CUDA headers: `make test-cuda-emu`, the same programs (--quick) on the
CPU emulator (dev/cuda/emu: kernel logic, the mma.sync fragment layout, stream order, the NCCL
world of one, the launcher-free rendezvous; about 1-2 minutes with its build on 2 cores).
Without either, or for a sanitizer build (the emulator's objects are plain): one SKIP line.
  /usr/bin/python3 test/test_cuda.py [--bin build/train_llama]
The CUDA backend has run on one GPU once (dev/results/gpu_h200_2026-11-27/); on the lent GPU
machine, scripts/gpu_check.sh runs this and the whole-model checks (README, "Running on a GPU").
"""
import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def has_gpu():
    if not shutil.which("nvidia-smi"):
        return False, "nvidia-smi absent"
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if p.returncode != 0 or "GPU" not in p.stdout:
        return False, "nvidia-smi lists no GPU"
    return True, p.stdout.strip().splitlines()[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    ok, why = has_gpu()
    build = os.path.dirname(os.path.abspath(args.bin))
    target = "test-cuda"
    if not ok:
        nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
        name = os.path.basename(build)
        if not nvcc or "asan" in name or "fuzz" in name:
            print("SKIP cuda: no GPU (%s) and %s" % (why, "no CUDA headers for the emulator" if not nvcc
                                                      else "a sanitizer build (the emulator links plain objects)"))
            return 0
        print("   no GPU (%s): the dev/cuda programs on the CPU emulator (make test-cuda-emu)" % why)
        target = "test-cuda-emu"
    p = subprocess.run(["make", "-s", "-j2", target, "BUILD=" + os.path.relpath(build, ROOT)], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                       timeout=3600)
    fails = 0
    for line in p.stdout.splitlines():
        if line.startswith(("PASS ", "FAIL ", "SKIP ")):
            print(line)
            fails += line.startswith("FAIL ")
        elif line.startswith(("TIME ", "== ")) or "error" in line.lower():
            print("   " + line)
    if p.returncode != 0 and fails == 0:
        print("FAIL cuda: make %s exited with %d" % (target, p.returncode))
        print(p.stdout[-2000:])
        return 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
