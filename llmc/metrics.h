// metrics.h: output_dir/metrics.jsonl, one JSON object per line (per step and per eval).
//
// The file is valid JSON Lines at every moment a reader may look: a non-finite value is
// written as null, each line is flushed whole, and a failed write (full disk) stops the run
// with an error instead of leaving a silent gap. On resume the history up to the checkpoint
// is kept and later lines are dropped, so the file reads as one unbroken run.
#pragma once
#include <stdio.h>

typedef struct {
    FILE *f;        // NULL: this rank does not write (ranks > 0)
    char path[4096];
} Metrics;

// Opens output_dir/metrics.jsonl: truncated for a fresh run (resume_step 0), else rewritten
// (atomically) to the lines of steps <= resume_step and then appended to.
void metrics_open(Metrics *mt, const char *dir, int resume_step, int writer);
// Appends one line: fmt is the object's body without braces, doubles formatted by metrics_num.
void metrics_line(Metrics *mt, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// "%.9g" of v, or "null" when v is NaN or infinite (JSON has no such numbers).
const char *metrics_num(char *buf, size_t cap, double v);
void metrics_close(Metrics *mt);
