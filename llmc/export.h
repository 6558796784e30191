// export.h: the final output of a run, laid out as transformers / PEFT / Axolotl users load it.
//
//   full fine-tuning: output_dir/{model.safetensors | model-0000k-of-0000N.safetensors +
//                     model.safetensors.index.json}, config.json, and the base's tokenizer files,
//                     chat template and generation_config.json, so from_pretrained(output_dir)
//                     and AutoTokenizer.from_pretrained(output_dir) work on the directory alone;
//   LoRA / QLoRA:     output_dir/adapter_model.safetensors + adapter_config.json (+ tokenizer
//                     files), and with merge_lora the merged model in output_dir/merged/;
//   GPT-2:            output_dir/model.bin (llm.c's layout).
// Everything is written under a temporary directory first, synced, then moved into place.
#pragma once
#include "config.h"
#include "model.h"

// base_dir: the Hugging Face directory the run started from ("" for a random init).
void export_final(const Model *m, const Config *cfg, const char *base_dir);
