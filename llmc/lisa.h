// lisa.h: Axolotl's LISA (lisa_n_layers, lisa_step_interval; Pan et al., "LISA: Layerwise
// Importance Sampling for Memory-Efficient Large Language Model Fine-Tuning", 2024). A full
// fine-tune in which only lisa_n_layers decoder layers, drawn at random without replacement,
// train at a time; the draw is redone every lisa_step_interval optimizer steps. The embedding,
// the final norm and the head train throughout.
//
// As Axolotl's callback does it with the Hugging Face Trainer: the draw happens before an
// optimizer step when the steps completed so far, s, satisfy s % interval == 0 or s == 1 (so
// the first two steps both draw). A layer outside the draw has no gradient: it adds nothing to
// the gradient norm, and torch's AdamW skips it (no update, no weight decay, its moments kept);
// AdamW's bias correction counts each tensor's own updates, so a layer's count moves only on
// the steps it trains. Axolotl draws with numpy's global generator; this program draws with its
// own (seeded by `seed` and the step), so the layers chosen differ from Axolotl's.
#pragma once
#include <stdint.h>

typedef struct {
    int n, interval, L;
    uint64_t seed;
    unsigned char *on;  // [L]: layer l trains in the current step
    int *updates;       // [L]: AdamW updates each layer has had (its bias-correction count)
} Lisa;

void lisa_init(Lisa *z, int n, int interval, int L, uint64_t seed);
void lisa_free(Lisa *z);
// Whether a draw happens before the step that follows s completed steps.
int lisa_draws_at(const Lisa *z, int s);
// The draw in force for the step after s completed steps (the last draw at or before s).
int lisa_last_draw(const Lisa *z, int s);
// Sets z->on to the draw made at s completed steps: n layers out of L, from (seed, s).
void lisa_draw(Lisa *z, int s);
// "3, 7, 12" into buf: the layers that train now.
void lisa_describe(const Lisa *z, char *buf, int cap);
