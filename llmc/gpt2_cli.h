// gpt2_cli.h: what makes train_gpt a drop-in for llm.c's GPT-2 trainer (train_gpt2cu): its
// command-line flags (translated into this program's YAML keys), its config box and step line
// (loss, norm, lr, ms, MFU, tok/s), samples decoded through llm.c's gpt2_tokenizer.bin, and its
// HellaSwag evaluation over the .bin file dev/data/hellaswag.py writes. README "train_gpt" has
// the flag table.
#pragma once
#include <stdint.h>
#include "backend.h"
#include "config.h"
#include "model.h"

// Rewrites train_gpt's command line (llm.c flags, -c FILE.yaml, --set, --plan, ...) into the
// form config_from_args reads (-c FILE, --set key=value, ...). Without a YAML file, llm.c's
// defaults come first (its train_gpt2cu's), then each flag in order. Fails with one line naming
// the flag on a bad value or an unknown or unsupported flag. The result lives until exit.
void gpt2_cli_translate(int argc, char **argv, int *out_argc, char ***out_argv);
// The help text: every flag, its llm.c meaning, its key.
void gpt2_cli_help(FILE *f);

// The config box, llm.c's two-column table.
void gpt2_print_box(const Config *cfg, const Model *m, const Backend *bk, int world, size_t acts_bytes);
// Model FLOPs utilisation of a step (llm.c's estimate: 6 N + 6 L C T FLOPs per token) against
// the device's peak ($LLMC_PEAK_TFLOPS, else a known GPU's bf16 dense peak); < 0 when unknown.
double gpt2_mfu(const Model *m, const Backend *bk, const Config *cfg, double tokens, double seconds);

// llm.c's sample: from <|endoftext|>, gen_len - 1 tokens drawn with llm.c's xorshift generator
// seeded 1337 each time, printed through ./gpt2_tokenizer.bin (else as ids, with a note).
void gpt2_sample(Model *m, int T, int gen_len);

// HellaSwag (llm.c's eval file: magic 20240522, version 1, examples of 4 completions).
typedef struct {
    char path[1024];
    int n;                 // examples
    int *label, *ctx_len;  // per example
    int *comp_len;         // [n x 4]
    uint16_t **ctx, **comp;  // per example; comp[i] holds the 4 completions one after another
} HellaSwag;
// Reads and checks the whole file (every example must fit in T tokens, ids below vocab).
void hellaswag_open(HellaSwag *h, const char *path, int T, int vocab);
// Accuracy (acc_norm as llm.c: the completion with the lowest mean token loss) over all
// examples in batches of B rows (B / 4 examples each; B >= 4). Every rank runs all batches.
double hellaswag_eval(Model *m, const HellaSwag *h, int B, int T, int *correct);
void hellaswag_close(HellaSwag *h);
