// metrics.c: see metrics.h.
#include "metrics.h"
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util.h"

const char *metrics_num(char *buf, size_t cap, double v) {
    if (isfinite(v)) snprintf(buf, cap, "%.9g", v);
    else snprintf(buf, cap, "null");
    return buf;
}

// A line worth keeping on resume: a whole object (a run killed mid-write can leave a torn
// last line) of a step at or before the checkpoint.
static int keep_line(const char *line, int resume_step) {
    size_t n = strlen(line);
    int step;
    return n >= 2 && line[0] == '{' && line[n - 1] == '}' &&
           sscanf(line, "{\"step\": %d", &step) == 1 && step <= resume_step;
}

// Writes the kept history to a temporary file and renames it over the old one, so a crash
// while resuming never loses the history.
static void rewrite_history(const char *path, int resume_step) {
    size_t len;
    char *old = read_file(path, &len);
    if (!old) return;  // no history (or unreadable: then the fopen below reports it)
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) fail("%s: cannot write: %s", tmp, strerror(errno));
    int ok = 1;
    for (char *line = strtok(old, "\n"); line && ok; line = strtok(NULL, "\n"))
        if (keep_line(line, resume_step)) ok = fprintf(f, "%s\n", line) >= 0;
    free(old);
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) ok = 0, e = errno;
    if (!ok || rename(tmp, path) != 0) {
        if (ok) e = errno;
        unlink(tmp);
        fail("%s: cannot rewrite the metrics history: %s", path, strerror(e));
    }
}

void metrics_open(Metrics *mt, const char *dir, int resume_step, int writer) {
    memset(mt, 0, sizeof *mt);
    if (!writer) return;
    join_path(mt->path, sizeof mt->path, dir, "metrics.jsonl");
    if (resume_step > 0) rewrite_history(mt->path, resume_step);
    mt->f = fopen(mt->path, resume_step > 0 ? "a" : "w");
    if (!mt->f) fail("%s: cannot write metrics: %s", mt->path, strerror(errno));
}

void metrics_line(Metrics *mt, const char *fmt, ...) {
    if (!mt->f) return;
    va_list ap;
    va_start(ap, fmt);
    int ok = fputc('{', mt->f) != EOF && vfprintf(mt->f, fmt, ap) >= 0 &&
             fputs("}\n", mt->f) != EOF && fflush(mt->f) == 0;
    va_end(ap);
    if (!ok) fail("%s: writing metrics failed: %s", mt->path, strerror(errno));
}

void metrics_close(Metrics *mt) {
    if (mt->f && fclose(mt->f) != 0) fail("%s: closing metrics failed: %s", mt->path, strerror(errno));
    mt->f = NULL;
}
