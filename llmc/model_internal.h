// model_internal.h: what model.c (a model's table, memory and parameters) and
// forward_backward.c (its forward and backward) share; nothing else includes it.
#pragma once
#include "model.h"

// Byte offset of the NF4 region inside a streamed block.
static inline size_t quant_base(const Model *m) { return (m->tab.stream_block * m->bk->act_bytes + 63) & ~(size_t)63; }

// The slot that holds target t's adapter in layer l (-1: none); *brow: the first row of its B
// that t's outputs use (model.c).
int model_lora_slot(const Model *m, int l, int t, size_t *brow);
