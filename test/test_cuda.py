#!/usr/bin/env python3
"""CUDA tests: reported as skipped until the CUDA backend lands and a GPU is present."""
import shutil
import subprocess
import sys

has_gpu = shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
if not has_gpu:
    print("SKIP cuda: no GPU on this machine")
else:
    print("SKIP cuda: this build has no CUDA backend yet")
sys.exit(0)
