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
