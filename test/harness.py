"""Shared by the reference tests: run named checks, print PASS/FAIL lines, count them.

A check is a callable returning (errors, summary); an exception counts as a failure (a crash
of the trainer or unreadable output), never as a pass.
"""
import sys
import time


def run_cases(cases, only="", verbose=False, timed=False):
    """cases: iterable of (name, fn). Returns (passed, failed)."""
    passed = failed = 0
    for name, fn in cases:
        if only and only not in name:
            continue
        t0 = time.time()
        try:
            errs, summary = fn()
        except Exception as e:  # noqa: BLE001
            errs, summary = [f"{type(e).__name__}: {e}"], ""
        if timed:
            summary = (summary + f"; {time.time() - t0:.1f}s").lstrip("; ")
        if errs:
            failed += 1
            print(f"FAIL {name}: " + "; ".join(errs[:6]))
            if summary:
                print(f"     {summary}")
        else:
            passed += 1
            print(f"PASS {name}" + (f"  ({summary})" if verbose else ""))
        sys.stdout.flush()
    return passed, failed


def case_main(tag, cases, begin, needs=("transformers",)):
    """The main of a file of trainer cases: --bin (default build/train_llama), --only CASE, --keep
    (leave the work directory); SKIP when a module of needs is missing; begin(args, work) before
    the cases (work: a fresh temporary directory). Exits 1 when a case failed."""
    import argparse
    import importlib
    import os
    import shutil
    import tempfile
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(root, "build", "train_llama"))
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    args.bin = os.path.abspath(args.bin)
    for m in needs:
        try:
            importlib.import_module(m)
        except ImportError:
            print("SKIP %s: %s not installed (scripts/install_deps.sh)" % (tag, m))
            return
    work = tempfile.mkdtemp(prefix="test_%s." % tag)
    begin(args, work)
    try:
        passed, failed = run_cases(cases, args.only, verbose=True, timed=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)
