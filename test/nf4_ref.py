#!/usr/bin/python3
"""Reference NF4 quantization in numpy, written from bitsandbytes' algorithm (not from llmc/nf4.c).

What bitsandbytes does (quantize_4bit with quant_type="nf4", CUDA kernel kQuantizeBlockwise):
  * flatten the weight row-major, cut it into blocks of `blocksize` (64) elements; the last block
    may be short;
  * absmax[b] = max |w| over the block (fp32); s = w * (1 / absmax[b]) in fp32;
  * code = number of decision thresholds strictly below s; the thresholds are the kernel's fp32
    constants, the midpoints of neighbouring NF4 values (a NaN, from an all-zero block where
    0 * inf = NaN, compares false everywhere and gets code 0);
  * two codes per byte, element 2i in the high nibble; an odd count pads with s = 0.
Double quantization (compress_statistics / nested): offset = mean(absmax), d = absmax - offset
(fp32) is quantized blockwise (256) to 8 bits with the signed dynamic map; a value between two
map entries goes to the nearer one, and an exact midpoint goes to the entry with the even index
(that is what the kernel's 7-step binary search over entries 0..254 amounts to).
Dequantize: absmax' = map[q] * nested_absmax[b] + offset (fp32), w' = NF4[c] * absmax'.

Not bitsandbytes' own choice (its kernel runs on a GPU): offset here is the float64 sequential
sum of absmax divided by the count, rounded to fp32, and 1/absmax is the correctly rounded
fp32 reciprocal.

    import nf4_ref; st = nf4_ref.quantize(w, blocksize=64, nested=True)
    nf4_ref.state_dict("x.weight", st)   # {name: (safetensors dtype, shape, bytes)}
"""
import json
from fractions import Fraction

import numpy as np

F32 = np.float32

# get_4bit_type("nf4"): the 16 values as bitsandbytes lists them, stored as fp32.
NF4_VALUES = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]
NF4_CODE = np.array(NF4_VALUES, dtype=np.float32)


# The decision tree's constants in bitsandbytes' dQuantizeNF4 (csrc/kernels.cu), as written
# there: float64 midpoints of neighbouring codes printed to 16-17 digits, used as fp32 literals.
TREE_LITERALS = [
    "-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906", "-0.33967943489551544",
    "-0.23460740596055984", "-0.13791173323988914", "-0.045525018125772476", "0.03979014977812767",
    "0.1202552504837513", "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
    "0.5016634166240692", "0.6427869200706482", "0.8614784181118011",
]


def nf4_thresholds():
    """15 fp32 decision thresholds, each literal rounded once to fp32 as a compiler reads it
    (not via float64: four midpoints are exact fp32 ties that the printed digits break)."""
    return np.array([_round_f32(Fraction(s)) for s in TREE_LITERALS], dtype=np.float32)


def nf4_encode(s):
    """Scaled fp32 values -> 4-bit codes (uint8)."""
    s = np.asarray(s, dtype=np.float32)
    q = np.searchsorted(nf4_thresholds(), s, side="left").astype(np.uint8)  # count of t < s
    q[np.isnan(s)] = 0
    return q


def _round_f32(fr):
    """Correctly rounded fp32 of an exact Fraction (ties to even)."""
    f = np.float32(float(fr))
    cands = [f, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))]
    best = None
    for c in cands:
        err = abs(Fraction(float(c)) - fr)
        even = (int(np.array(c, dtype=np.float32).view(np.uint32)) & 1) == 0
        key = (err, not even)
        if best is None or key < best[0]:
            best = (key, c)
    return np.float32(best[1])


def _linspace_f32(start, end, steps):
    """torch.linspace(start, end, steps, dtype=float32) on CPU as current PyTorch computes it:
    step = (end - start) / (steps - 1) in fp32; the first half is start + step*i, the second
    end - step*(steps-1-i), each a single rounding (the compiler fuses them into an FMA)."""
    s, e = F32(start), F32(end)
    step = F32(F32(e - s) / F32(steps - 1))
    out = []
    for i in range(steps):
        if i < steps // 2:
            out.append(_round_f32(Fraction(float(s)) + Fraction(float(step)) * i))
        else:
            out.append(_round_f32(Fraction(float(e)) - Fraction(float(step)) * (steps - 1 - i)))
    return np.array(out, dtype=np.float32)


def dynamic_map():
    """create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): 256 sorted fp32."""
    data = []
    for i in range(7):
        b = _linspace_f32(0.1, 1.0, 2 ** i + 1)
        means = (b[:-1] + b[1:]) / F32(2.0)
        scale = F32(10 ** (i - 6))       # a Python scalar times an fp32 tensor: fp32 multiply
        data += list(scale * means)
        data += list(-scale * means)
    data += [F32(0.0), F32(1.0)]
    assert len(data) == 256
    return np.array(sorted(data), dtype=np.float32)


def dyn_encode(code, s):
    """Nearest entry of the sorted 256-entry map; exact midpoints go to the even index."""
    s = np.asarray(s, dtype=np.float32)
    hi = np.searchsorted(code, s, side="left")      # code[hi-1] < s <= code[hi]
    q = np.zeros(s.shape, dtype=np.int64)
    top = hi >= 256
    q[top] = 255
    low = hi == 0
    q[low] = 0
    mid_ok = ~top & ~low
    h = hi[mid_ok]
    lo = h - 1
    x = s[mid_ok]
    mid = (code[lo] + code[h]) * F32(0.5)
    pick = np.where(x < mid, lo, np.where(x > mid, h, np.where(h % 2 == 0, h, lo)))
    q[mid_ok] = pick
    q[np.isnan(s)] = 0
    return q.astype(np.uint8)


def _blocks_absmax(x, blocksize):
    n = x.size
    nb = -(-n // blocksize)
    pad = np.zeros(nb * blocksize, dtype=np.float32)
    pad[:n] = x
    return pad.reshape(nb, blocksize), np.abs(pad.reshape(nb, blocksize)).max(axis=1)


def quantize_blockwise(x, code, blocksize):
    """8-bit blockwise: returns (uint8 codes [n], fp32 absmax [ceil(n/blocksize)])."""
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    blocks, amax = _blocks_absmax(x, blocksize)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = blocks * (F32(1.0) / amax)[:, None]
    return dyn_encode(code, s).reshape(-1)[: x.size], amax.astype(np.float32)


def quantize(w, blocksize=64, nested=True, nested_blocksize=256):
    w = np.ascontiguousarray(w, dtype=np.float32)
    x = w.reshape(-1)
    n = x.size
    blocks, amax = _blocks_absmax(x, blocksize)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = blocks * (F32(1.0) / amax)[:, None]
    # an odd count packs the zero padding of the last block (scaled like the rest) as well
    q = nf4_encode(s).reshape(-1)[: n + n % 2]
    packed = ((q[0::2] << 4) | q[1::2]).astype(np.uint8)
    st = dict(shape=tuple(w.shape), n=n, blocksize=blocksize, nested=nested, packed=packed,
              absmax=amax.astype(np.float32))
    if nested:
        offset = F32(np.cumsum(amax.astype(np.float64))[-1] / np.float64(amax.size))
        code2 = dynamic_map()
        qa, amax2 = quantize_blockwise(amax - offset, code2, nested_blocksize)
        st.update(offset=offset, qabsmax=qa, nested_absmax=amax2, nested_code=code2,
                  nested_blocksize=nested_blocksize)
    return st


def block_absmax(st):
    """The absmax values dequantization uses (fp32)."""
    if not st["nested"]:
        return st["absmax"]
    idx = np.arange(st["qabsmax"].size) // st["nested_blocksize"]
    return (st["nested_code"][st["qabsmax"]] * st["nested_absmax"][idx]) + st["offset"]


def dequantize(st):
    n = st["n"]
    p = st["packed"]
    q = np.empty(p.size * 2, dtype=np.uint8)
    q[0::2] = p >> 4
    q[1::2] = p & 15
    q = q[:n]
    a = block_absmax(st)
    return (NF4_CODE[q] * a[np.arange(n) // st["blocksize"]]).astype(np.float32).reshape(st["shape"])


def py_json(st, dtype="float32"):
    """The quant_state JSON (QuantState.as_dict(packed=True) -> json.dumps)."""
    d = {"quant_type": "nf4", "blocksize": st["blocksize"], "dtype": dtype, "shape": list(st["shape"])}
    if st["nested"]:
        d.update({"nested_blocksize": st["nested_blocksize"], "nested_dtype": "float32",
                  "nested_offset": float(st["offset"])})
    return json.dumps(d)


def state_dict(name, st, dtype="float32"):
    """Linear4bit state dict entries for weight `name` (e.g. "model.x.weight"):
    {tensor name: (safetensors dtype, shape list, raw little-endian bytes)}."""
    n = st["n"]
    out = {name: ("U8", [(n + 1) // 2, 1], st["packed"].tobytes())}
    if st["nested"]:
        out[name + ".absmax"] = ("U8", [st["qabsmax"].size], st["qabsmax"].tobytes())
    else:
        out[name + ".absmax"] = ("F32", [st["absmax"].size], st["absmax"].astype("<f4").tobytes())
    out[name + ".quant_map"] = ("F32", [16], NF4_CODE.astype("<f4").tobytes())
    if st["nested"]:
        out[name + ".nested_absmax"] = ("F32", [st["nested_absmax"].size],
                                        st["nested_absmax"].astype("<f4").tobytes())
        out[name + ".nested_quant_map"] = ("F32", [256], st["nested_code"].astype("<f4").tobytes())
    js = py_json(st, dtype).encode("utf-8")
    out[name + ".quant_state.bitsandbytes__nf4"] = ("U8", [len(js)], js)
    return out


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, shape, bytes)} -> a safetensors file."""
    header, off, blobs = {}, 0, []
    for k in sorted(tensors):
        dt, shape, b = tensors[k]
        header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
