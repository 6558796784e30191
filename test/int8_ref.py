"""bitsandbytes' 8-bit weight storage (load_in_8bit), in NumPy, from its source (0.45+):
Int8Params._quantize casts the weight to float16, then int8_vectorwise_quant takes each row's
absmax (fp32) and rounds w * (127 / absmax) half to even (the scale computed as PyTorch does,
reciprocal(absmax) * 127); its training products use the weight code * (absmax * (1 / 127)), all
in float32. An all-zero row has absmax 0 and codes 0."""
import numpy as np

INV127 = np.float32(7.874015718698502e-3)


def to_f16(w):
    return np.asarray(w, np.float32).astype(np.float16).astype(np.float32)  # round to nearest even


def quantize(w):
    """w [rows, cols] -> (int8 codes [rows, cols], float32 absmax [rows])."""
    h = to_f16(w)
    scb = np.max(np.abs(h), axis=1).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        # PyTorch evaluates `127.0 / row_stats` (a scalar over a tensor) as reciprocal(row_stats) * 127
        scale = ((np.float32(1.0) / scb).astype(np.float32) * np.float32(127.0)).astype(np.float32)
        q = np.rint((h * scale[:, None]).astype(np.float32))
    q[scb == 0] = 0
    return q.astype(np.int8), scb


def dequantize(q, scb):
    """The weight bitsandbytes' training products use (MatMul8bitFp's forward, MatMul8bitLt's
    input gradient): CB * (SCB * (1 / 127)), in float32."""
    f = (scb.astype(np.float32) * INV127).astype(np.float32)
    return (q.astype(np.float32) * f[:, None]).astype(np.float32)


def roundtrip(w):
    return dequantize(*quantize(w))
