// opprof.h: where a training step's time goes, op by op (train_llama --profile).
//
// opprof_install swaps the backend's compute, clear and copy entries for timed calls of the
// same functions (the numbers do not change). Only the ops between opprof_step_begin and
// opprof_step_end count: the steps, not evaluation, sampling or checkpoints. An op that a
// queued backend (CUDA) runs asynchronously is timed to its end by a sync after it, which also
// takes away the overlap of copies with compute: the profile shows each op's own time, and its
// step times are those of a run without overlap.
#pragma once
#include <stdio.h>
#include "backend.h"

void opprof_install(Backend *bk);
void opprof_step_begin(void);
void opprof_step_end(double step_ms);
// The table: each op's calls, time and share of a step, medians over the steps after the first
// two (all of them when there are fewer than four); then each call's fastest over the same
// steps, summed (the step at its quietest; what dev/bench_cpu.sh sets against the roofline).
void opprof_report(FILE *f);
