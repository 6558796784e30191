#!/usr/bin/python3
"""Runs build/test_seqpar (sequence parallelism's reshuffles and attention through them) alone
and under `mpirun -np 2`, `-np 3` and `-np 4`; without mpirun the MPI cases SKIP.
    /usr/bin/python3 test/test_seqpar.py --build build
"""
import argparse
import os
import shutil
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    exe = os.path.join(a.build, "test_seqpar")
    runs = [("single", [exe])]
    if shutil.which("mpirun"):
        for n in (2, 3, 4):
            runs.append(("mpi %d" % n, ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", exe]))
    else:
        print("SKIP sequence parallel under MPI: no mpirun on PATH")
    failed = 0
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for name, cmd in runs:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        out = [l for l in r.stdout.splitlines() if l.startswith(("PASS", "FAIL"))]
        if r.returncode == 0 and len(out) == 1 and out[0].startswith("PASS"):
            print(out[0])
        else:
            failed += 1
            print("FAIL sequence parallel (%s): exit %d: %s" % (name, r.returncode, (out or r.stderr.strip().splitlines()[-3:] or ["no output"])))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
