// int8.h: 8-bit frozen weights as bitsandbytes stores them for load_in_8bit (LLM.int8 LoRA):
// one int8 per element and one float scale per row, kept in a region like NF4's (nf4.h's
// device layout, Nf4RegionHeader with format REGION_INT8) and dequantized just before use.
//
// Quantization (Int8Params._quantize, bitsandbytes 0.45+, on the weight of a frozen linear
// layer [rows, cols]): the weight is first cast to float16 (round to nearest even), then per
// row absmax = max |w| (SCB, fp32), scale = 127 / absmax, code = round_half_even(w * scale)
// computed in fp32 as its default (PyTorch) backend does, which evaluates `127.0 / absmax` as
// reciprocal(absmax) * 127: checked against bitsandbytes 0.50.2 on a CPU (every code and scale
// equal, 2026-11-28). Its CUDA kernel divides with __fdividef, an approximate reciprocal, so an
// element within an ulp of a .5 boundary can round the other way when a GPU quantizes. An
// all-zero row gets absmax 0 and codes 0.
// Dequantization as bitsandbytes' training products do it (MatMul8bitFp's forward on a CPU,
// MatMul8bitLt's input gradient): w' = code * (absmax * (float)(1.0 / 127.0)), each product
// rounded to fp32 in that order (int8_vectorwise_dequant groups it (code * absmax) / 127,
// which can differ in the last bit).
//
// Every product uses the dequantized weight in the compute precision (float32 on the CPU,
// bfloat16 on a GPU), as bitsandbytes does when it trains on a CPU (MatMul8bitFp) and in every
// backward. What bitsandbytes does on a GPU and this program does not: its Linear8bitLt forward
// rounds the activations to int8 per row (outside the columns where some |x| >=
// llm_int8_threshold, 6 by default, which stay in 16 bits) and multiplies in integers.
#pragma once
#include <stddef.h>
#include <stdint.h>

// Bytes of the region of a [rows, cols] weight: header, rows fp32 scales, rows * cols codes.
size_t int8_region_bytes(size_t rows, size_t cols);
// Quantizes w[rows * cols] (row-major) into region (int8_region_bytes bytes, host memory).
// Fails naming `name` on a non-finite value or one past float16's range (|w| >= 65520, which
// the cast to float16 would make infinite).
void int8_quantize(const float *w, size_t rows, size_t cols, void *region, const char *name);
// out[rows * cols] = the dequantized weight, from a host copy of a region.
void int8_region_dequantize(const void *region, float *out);
// w rounded to the nearest float16 value (ties to even), as a float; +-inf past the range.
float int8_round_f16(float w);
