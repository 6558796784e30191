// quantize.h: write a model with NF4 decoder weights in bitsandbytes' layout.
#pragma once
void quantize_model(const char *in_dir, const char *out_dir);
