// nf4.h: NF4 4-bit weight quantization as bitsandbytes does it (QLoRA: frozen linear weights
// kept 4-bit, dequantized just before use), and the tensors of bitsandbytes' serialized
// Linear4bit state dict (what transformers writes to safetensors for a 4-bit model).
//
// Quantization (bitsandbytes quantize_4bit(quant_type="nf4"), CUDA kernel kQuantizeBlockwise):
//   the weight is flattened row-major and cut into blocks of `blocksize` (64) elements, the
//   last one possibly short. absmax[b] = max |w| of the block (fp32); each element is scaled
//   s = w * (1.0f / absmax[b]) and mapped to one of the 16 NF4 values by a decision tree whose
//   thresholds are the midpoints of neighbouring values (nf4_encode: s above a threshold goes
//   up, s equal to it goes down). Two codes per byte, element 2i in the high nibble; an odd
//   count packs the block's zero padding (code 7, or 0 in an all-zero block) in the last low
//   nibble. An all-zero block has absmax 0 and every code 0 (0 * inf is NaN, which the tree
//   sends to code 0); it dequantizes to -0.0.
// Double quantization ("compress_statistics", nested): offset = mean(absmax);
//   absmax - offset is quantized to 8 bits in blocks of 256 with the signed dynamic map
//   (nf4_dynamic_map), one fp32 nested_absmax per 256-block.
// Dequantization: absmax' = nested_map[qabsmax] * nested_absmax + offset (fp32, in that
//   order), w' = NF4[code] * absmax'. bitsandbytes returns w' in the weight's original dtype;
//   these functions give the fp32 value (round it to bf16/fp16 to get bitsandbytes' output).
//
// Where this differs from a checkpoint bitsandbytes made on a GPU (its kernel is built with
// --use_fast_math and torch's mean reduces in fp32 on the device, neither reproducible on a
// CPU): 1/absmax here is the correctly rounded fp32 reciprocal, and offset is the float64
// sequential sum of absmax divided by the count, rounded to fp32. Only an element whose scaled
// value lies within an ulp or two of a threshold, or an offset's last bit, can differ.
// Loading uses the stored tensors, so dequantizing a bitsandbytes checkpoint is exact.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "safetensors.h"

typedef struct {
    int ndim;
    int64_t shape[ST_MAX_DIMS];  // shape of the unquantized weight (row-major)
    size_t n;                    // number of elements
    char dtype[16];              // dtype of the unquantized weight: "bfloat16", "float16", "float32"
    int blocksize;               // elements per absmax block (bitsandbytes default 64)
    size_t nblocks;              // ceil(n / blocksize)
    uint8_t *packed;             // (n + 1) / 2 bytes of codes
    int nested;                  // 1: absmax is double-quantized (qabsmax, offset, nested_*)
    float *absmax;               // [nblocks] when !nested, else NULL
    uint8_t *qabsmax;            // [nblocks] when nested, else NULL
    float offset;                // nested: mean of the block absmax values
    int nested_blocksize;        // nested: 256
    size_t nested_nblocks;       // nested: ceil(nblocks / nested_blocksize)
    float *nested_absmax;        // nested: [nested_nblocks]
    float nested_code[256];      // nested: the 8-bit map (nf4_dynamic_map, or as stored in a file)
} Nf4Weight;

// The 16 NF4 values (bitsandbytes get_4bit_type("nf4")), ascending; index = 4-bit code.
extern const float nf4_code[16];
// Thresholds of the decision tree: nf4_threshold[k] separates codes k and k+1 (15 values);
// bitsandbytes' fp32 constants, each one of the two fp32 values nearest the midpoint.
extern const float nf4_threshold[15];
// create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): 256 ascending values in
// [-0.99296875, 1], as current PyTorch computes them on a CPU.
void nf4_dynamic_map(float out[256]);
// One scaled value (nominally in [-1, 1]) to its 4-bit code; NaN gives 0.
uint8_t nf4_encode(float s);
// One scaled value to its index in a sorted 256-entry map, by bitsandbytes' 8-bit rounding
// (nearest entry; an exact midpoint goes to the entry with the even index); NaN gives 0.
uint8_t nf4_dyn_encode(const float code[256], float s);

// Quantizes w[n], n = product of shape[0..ndim), into q (fresh; free with nf4_free).
// blocksize: a power of two in [32, 4096]; nested: double-quantize absmax (blocks of 256);
// dtype names the weight's original dtype for the quant_state ("bfloat16", "float16",
// "float32"). Fails naming `name` on a non-finite value or a bad argument.
void nf4_quantize(Nf4Weight *q, const float *w, int ndim, const int64_t *shape, int blocksize,
                  int nested, const char *dtype, const char *name);
// The absmax of block b as dequantization uses it (after undoing the double quantization).
float nf4_block_absmax(const Nf4Weight *q, size_t b);
// out[n] = the dequantized weight.
void nf4_dequantize(const Nf4Weight *q, float *out);
// out[count] = dequantized elements [begin, begin + count) of the flattened weight.
void nf4_dequantize_range(const Nf4Weight *q, size_t begin, size_t count, float *out);
void nf4_free(Nf4Weight *q);

// --- The serialized layout -------------------------------------------------------------
// For a weight named W (e.g. "model.layers.0.mlp.down_proj.weight") bitsandbytes' state dict
// holds, in this order:
//   W                                  U8  [(n+1)/2, 1]  packed codes
//   W.absmax                           U8  [nblocks]     (F32 [nblocks] when not nested)
//   W.quant_map                        F32 [16]          nf4_code
//   W.nested_absmax                    F32 [nested_nblocks]          (nested only)
//   W.nested_quant_map                 F32 [256]                     (nested only)
//   W.quant_state.bitsandbytes__nf4    U8  [len]   JSON (Python json.dumps, no NUL):
//     {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [o, i],
//      "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": <repr(float)>}
//     (the nested_* keys only when nested).
#define NF4_MAX_TENSORS 6

// The quant_state JSON exactly as bitsandbytes writes it (malloc'd, NUL-terminated).
char *nf4_quant_state_json(const Nf4Weight *q);
// Python's repr() of a double (shortest round-trip form): the nested_offset text. Returns the
// length written (buf needs 32 bytes).
int nf4_py_repr(double v, char *buf);

// Fills out[] with the tensors above for weight `name` and returns how many (4 or 6). Names
// and the JSON bytes are malloc'd (free with nf4_emit_free); the other data point into q.
int nf4_emit(const Nf4Weight *q, const char *name, StTensor out[NF4_MAX_TENSORS]);
void nf4_emit_free(StTensor *t, int count);

// Looks a tensor up by full name; NULL if absent (st_find / st_model_find fit, via a wrapper).
typedef const StTensor *(*Nf4FindFn)(void *ctx, const char *name);
// Reads weight `name` from its bitsandbytes tensors into q (fresh; data copied). Returns 0 when
// `name.quant_state.bitsandbytes__nf4` is absent (not a 4-bit weight; q untouched), 1 when
// loaded. Fails with one line naming the tensor on anything malformed: fp4, wrong sizes or
// dtypes, bad or unknown JSON fields, a shape that does not match the data.
int nf4_load(Nf4Weight *q, const char *name, Nf4FindFn find, void *ctx);

// --- Device layout ------------------------------------------------------------------------
// One quantized weight as the trainer keeps it in device (or streamed host) memory: a header,
// then the 8-bit map (nested) or nothing, the fp32 absmax (plain) or nested absmax, the packed
// codes, and the 8-bit absmax (nested). Dequantizing it needs nothing else. The same header
// starts an 8-bit region (int8.h: format REGION_INT8, nblocks = rows, blocksize = cols).
enum { REGION_NF4 = 0, REGION_INT8 = 1 };
typedef struct {
    uint64_t n, nblocks, nested_nblocks;
    int32_t blocksize, nested, nested_blocksize, format;
    float offset, pad2;
} Nf4RegionHeader;  // 48 bytes, so the arrays after it stay 16-byte aligned
_Static_assert(sizeof(Nf4RegionHeader) == 48, "Nf4RegionHeader must stay 48 bytes");

size_t nf4_region_bytes(size_t n, int blocksize, int nested);
// Writes q into region (nf4_region_bytes(q->n, q->blocksize, q->nested) bytes, host memory).
void nf4_region_pack(const Nf4Weight *q, void *region);
// out[n] = dequantized weight, in float, from a host copy of a region.
void nf4_region_dequantize(const void *region, float *out);
