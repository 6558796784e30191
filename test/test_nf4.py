#!/usr/bin/python3
"""llmc/nf4.c against the numpy reference test/nf4_ref.py, through build/test_nf4's helper modes.

    /usr/bin/python3 test/test_nf4.py --build build

For each case (sizes that are and are not multiples of 64 and of 64*256, outliers, zero blocks,
constant tensors, values exactly on the decision thresholds, several block sizes, nested and
plain): the C quantizer's emitted tensors (packed codes, absmax or qabsmax, quant_map,
nested_absmax, nested_quant_map, the quant_state JSON, names, dtypes, shapes) must be
byte-identical to the reference's bitsandbytes state dict, the dequantized values bit-identical,
the error within |w - w'| <= absmax * (max half-gap of the NF4 table) + |absmax - absmax'| with
|absmax - absmax'| <= nested_absmax * (max half-gap of the dynamic map); and the C loader, given
a safetensors file the reference wrote, must dequantize it bit-identically.
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nf4_ref as R  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
n_pass = n_fail = 0


def check(name, ok, why=""):
    global n_pass, n_fail
    if ok:
        print("PASS %s" % name)
        n_pass += 1
    else:
        print("FAIL %s: %s" % (name, why))
        n_fail += 1
    sys.stdout.flush()


def read_records(path):
    out = {}
    with open(path, "rb") as f:
        b = f.read()
    p = 0
    while p < len(b):
        (ln,) = struct.unpack_from("<I", b, p); p += 4
        name = b[p:p + ln].decode(); p += ln
        (ln,) = struct.unpack_from("<I", b, p); p += 4
        dt = b[p:p + ln].decode(); p += ln
        (nd,) = struct.unpack_from("<I", b, p); p += 4
        shape = list(struct.unpack_from("<%dq" % nd, b, p)); p += 8 * nd
        (nb,) = struct.unpack_from("<Q", b, p); p += 8
        out[name] = (dt, shape, b[p:p + nb]); p += nb
    return out


def first_diff(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return "byte %d: %r vs %r (of %d / %d bytes)" % (i, a[i], b[i], len(a), len(b))
    return "lengths %d vs %d" % (len(a), len(b))


def half_gap(c):
    c = np.asarray(c, dtype=np.float64)
    return float(np.max(np.diff(c)) / 2)


def error_bound_ok(w, st):
    x = w.reshape(-1).astype(np.float64)
    n, bs = x.size, st["blocksize"]
    deq = R.dequantize(st).reshape(-1).astype(np.float64)
    ad = R.block_absmax(st).astype(np.float64)
    nb = ad.size
    pad = np.zeros(nb * bs)
    pad[:n] = np.abs(x)
    at = pad.reshape(nb, bs).max(axis=1)
    da = np.abs(at - ad)
    if st["nested"]:
        a2 = st["nested_absmax"].astype(np.float64)[np.arange(nb) // st["nested_blocksize"]]
        lim_a = a2 * half_gap(st["nested_code"]) * (1 + 1e-5) + 1e-7 * (abs(float(st["offset"])) + at)
        if np.any(da > lim_a):
            i = int(np.argmax(da - lim_a))
            return False, "absmax %d: |%.9g - %.9g| > %.3g" % (i, at[i], ad[i], lim_a[i])
    elif np.any(da != 0):
        return False, "plain absmax differs"
    lim = (at * half_gap(R.NF4_CODE) * (1 + 1e-5) + da + 1e-6 * (at + np.abs(ad)))[np.arange(n) // bs]
    err = np.abs(x - deq)
    if np.any(err > lim):
        i = int(np.argmax(err - lim))
        return False, "element %d: |%.9g - %.9g| > %.3g" % (i, x[i], deq[i], lim[i])
    return True, ""


def run(cmd):
    return subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace")


def make_cases():
    rng = np.random.default_rng(1234)
    cases = []

    def add(name, w, bs=64, nested=True, dtype="bfloat16"):
        cases.append((name, np.ascontiguousarray(w, dtype=np.float32), bs, nested, dtype))

    for shape in [(1, 1), (1, 63), (64,), (1, 65), (3, 43), (128, 128), (1, 64 * 256 + 64),
                  (5, 6571), (512, 1024)]:
        w = rng.standard_normal(shape).astype(np.float32) * 0.02
        add("normal_%s" % "x".join(map(str, shape)), w)
        if int(np.prod(shape)) in (129, 32855):
            add("normal_plain_%s" % "x".join(map(str, shape)), w, nested=False, dtype="float32")
    w = rng.standard_normal((77, 311)).astype(np.float32) * 0.05
    idx = rng.choice(w.size, 40, replace=False)
    w.reshape(-1)[idx] *= 1000.0
    add("outliers", w)
    add("outliers_plain", w, nested=False)
    w = rng.standard_normal((40, 200)).astype(np.float32)
    w.reshape(-1)[64 * 3:64 * 9] = 0.0          # whole zero blocks
    w.reshape(-1)[-7:] = 0.0                       # zero tail of the last block
    add("zero_blocks", w)
    add("zero_blocks_plain", w, nested=False)
    add("all_zero", np.zeros((10, 10), np.float32))
    add("all_zero_plain", np.zeros(101, np.float32), nested=False)
    add("constant", np.full((33, 65), 0.5, np.float32))  # absmax - offset is all 0
    # values exactly on the decision thresholds (absmax 1 makes s == w), one ulp off them,
    # and the code values themselves
    t = R.nf4_thresholds()
    vals = np.concatenate([t, np.nextafter(t, np.float32(2)), np.nextafter(t, np.float32(-2)), R.NF4_CODE])
    blocks = []
    for i in range(0, vals.size, 63):
        chunk = vals[i:i + 63]
        blocks.append(np.concatenate([[np.float32(1.0) if i % 2 == 0 else np.float32(-1.0)], chunk,
                                      np.zeros(63 - chunk.size, np.float32)]))
    add("thresholds", np.concatenate(blocks).astype(np.float32), nested=False)
    add("thresholds_nested", np.concatenate(blocks).astype(np.float32))
    # bf16-exact weights with a wide range of scales between rows
    w = rng.standard_normal((96, 130)).astype(np.float32) * (10.0 ** rng.uniform(-6, 3, (96, 1))).astype(np.float32)
    w = (w.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    add("bf16_wide_range", w)
    add("bs32_plain", rng.standard_normal((17, 99)).astype(np.float32), bs=32, nested=False)
    add("bs128_nested", rng.standard_normal((70, 1000)).astype(np.float32), bs=128, dtype="float16")
    add("bs4096_nested", rng.standard_normal((3, 5000)).astype(np.float32), bs=4096, dtype="float32")
    return cases


def run_case(build, tmp, case):
    name, w, bs, nested, dtype = case
    wname = "model.layers.3.self_attn.q_proj.weight"
    fin, frec = os.path.join(tmp, "in.f32"), os.path.join(tmp, "out.rec")
    w.astype("<f4").tofile(fin)
    p = run([os.path.join(build, "test_nf4"), "--quantize", fin, frec, wname, dtype, str(bs),
             str(int(nested))] + [str(d) for d in w.shape])
    if p.returncode != 0:
        check("quantize_" + name, False, "helper exited %d: %s" % (p.returncode, p.stdout.strip()))
        return
    got = read_records(frec)
    deq_c = got.pop("__deq__")[2]
    st = R.quantize(w, blocksize=bs, nested=nested)
    want = R.state_dict(wname, st, dtype)
    why = ""
    if sorted(got) != sorted(want):
        why = "tensor names %s vs %s" % (sorted(got), sorted(want))
    else:
        for k in want:
            if got[k][0] != want[k][0] or list(got[k][1]) != list(want[k][1]):
                why = "%s: %s %s vs %s %s" % (k, got[k][0], got[k][1], want[k][0], want[k][1])
                break
            if got[k][2] != want[k][2]:
                why = "%s: %s" % (k, first_diff(got[k][2], want[k][2]))
                if k.endswith("bitsandbytes__nf4"):
                    why += " (%r vs %r)" % (got[k][2], want[k][2])
                break
    check("layout_" + name, not why, why)
    deq_ref = R.dequantize(st).reshape(-1)
    dc = np.frombuffer(deq_c, dtype="<f4")
    same = dc.size == deq_ref.size and np.array_equal(dc.view(np.uint32), deq_ref.view(np.uint32))
    check("dequant_" + name, same,
          "" if same else "first differing element %d" % int(np.argmax(dc.view(np.uint32) != deq_ref.view(np.uint32))))
    ok, why = error_bound_ok(w, st)
    check("bound_" + name, ok, why)
    # the C loader on a safetensors file the reference wrote (with a plain tensor beside it)
    fst, fout = os.path.join(tmp, "m.safetensors"), os.path.join(tmp, "deq.f32")
    tensors = dict(want)
    tensors["model.norm.weight"] = ("F32", [4], np.ones(4, "<f4").tobytes())
    R.write_safetensors(fst, tensors)
    p = run([os.path.join(build, "test_nf4"), "--load", fst, wname, fout])
    if p.returncode != 0:
        check("load_" + name, False, "helper exited %d: %s" % (p.returncode, p.stdout.strip()))
        return
    dl = np.fromfile(fout, dtype="<f4")
    check("load_" + name, dl.size == deq_ref.size and np.array_equal(dl.view(np.uint32), deq_ref.view(np.uint32)),
          "dequantized values differ")
    if name == "normal_3x43":
        p = run([os.path.join(build, "test_nf4"), "--load", fst, "model.norm.weight", fout])
        check("load_not_quantized", p.returncode == 3, "exit %d: %s" % (p.returncode, p.stdout.strip()))


def test_repr(build, tmp):
    rng = np.random.default_rng(5)
    vals = list(rng.standard_normal(3000).astype(np.float32).astype(np.float64) * 10.0 ** rng.integers(-12, 12, 3000))
    vals += list(rng.uniform(0, 1, 2000).astype(np.float32).astype(np.float64))  # offsets are fp32 values
    vals += list(rng.standard_normal(2000) * 10.0 ** rng.integers(-300, 300, 2000))
    vals += [2.0 ** e for e in range(-1074, 1024, 7)] + [0.0, -0.0, 1e16, 1e15, 1e-4, 1e-5, 0.1, 1 / 3]
    f = os.path.join(tmp, "r.f64")
    np.array(vals, dtype="<f8").tofile(f)
    p = run([os.path.join(build, "test_nf4"), "--repr", f])
    lines = p.stdout.splitlines()
    bad = [(v, s) for v, s in zip(vals, lines) if s != repr(float(v))]
    check("py_repr_matches_python", p.returncode == 0 and len(lines) == len(vals) and not bad,
          "rc %d, %d lines, e.g. %r" % (p.returncode, len(lines), bad[:3]))


def test_reference_self(tmp):
    """The reference's own invariants (so a bug in it cannot hide behind agreement)."""
    t = R.nf4_thresholds().astype(np.float64)
    c = R.NF4_CODE.astype(np.float64)
    mid = (c[:-1] + c[1:]) / 2
    ulp = np.spacing(np.abs(R.nf4_thresholds())).astype(np.float64)
    check("ref_thresholds_near_midpoints", bool(np.all(np.abs(t - mid) <= ulp / 2)) and bool(np.all(np.diff(t) > 0)),
          str(t - mid))
    m = R.dynamic_map()
    check("ref_dynamic_map", m.size == 256 and bool(np.all(np.diff(m) > 0)) and m[127] == 0 and m[255] == 1
          and np.array_equal(m[:127], -m[254:127:-1]), "not sorted/symmetric")
    x = np.random.default_rng(3).uniform(-1, 1, 20000).astype(np.float32)
    q = R.dyn_encode(m, x)
    d = np.abs(x[:, None].astype(np.float64) - m[None, :].astype(np.float64))
    check("ref_dyn_encode_nearest", bool(np.all(d[np.arange(x.size), q] <= d.min(axis=1))), "not nearest")
    q4 = R.nf4_encode(x)
    d4 = np.abs(x[:, None].astype(np.float64) - c[None, :])
    check("ref_nf4_encode_nearest", bool(np.all(d4[np.arange(x.size), q4] <= d4.min(axis=1) + 1e-7)), "not nearest")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    build = os.path.abspath(os.path.join(ROOT, args.build)) if not os.path.isabs(args.build) else args.build
    if not os.path.exists(os.path.join(build, "test_nf4")):
        check("nf4_helper_built", False, "%s/test_nf4 is missing" % build)
        print("%d passed, %d failed" % (n_pass, n_fail))
        sys.exit(1)
    tmp = tempfile.mkdtemp(prefix="test_nf4_")
    try:
        test_reference_self(tmp)
        for case in make_cases():
            run_case(build, tmp, case)
        test_repr(build, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (n_pass, n_fail))
    sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
