#!/usr/bin/env python3
"""CUDA tests. Without a GPU: one SKIP line. With one: `make test-cuda` (every dev/cuda program:
each CUDA kernel against a double-precision CPU reference, plus the backend table), its
PASS/FAIL lines passed through, and a check that the program was built with CUDA.
  /usr/bin/python3 test/test_cuda.py [--bin build/train_llama]
The CUDA backend has not yet run on a GPU (see llmc/cuda/backend_cuda.cu); the kernels' logic,
stream order, the NCCL world of one and the launcher-free rendezvous are exercised without one
by `make test-cuda-emu` (dev/cuda/emu), which this test does not run (minutes). On the lent GPU
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
    if not ok:
        print("SKIP cuda: no GPU (%s)" % why)
        return 0
    build = os.path.dirname(os.path.abspath(args.bin))
    p = subprocess.run(["make", "-s", "test-cuda", "BUILD=" + os.path.relpath(build, ROOT)], cwd=ROOT,
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
        print("FAIL cuda: make test-cuda exited with %d" % p.returncode)
        print(p.stdout[-2000:])
        return 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
