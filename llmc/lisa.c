// lisa.c: see lisa.h.
#include "lisa.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"

void lisa_init(Lisa *z, int n, int interval, int L, uint64_t seed) {
    if (n < 1 || n > L || interval < 1) fail("internal: LISA with %d of %d layers every %d steps", n, L, interval);
    *z = (Lisa){.n = n, .interval = interval, .L = L, .seed = seed};
    z->on = xcalloc((size_t)L, 1);
    z->updates = xcalloc((size_t)L, sizeof(int));
}

void lisa_free(Lisa *z) {
    free(z->on);
    free(z->updates);
    memset(z, 0, sizeof *z);
}

int lisa_draws_at(const Lisa *z, int s) { return s % z->interval == 0 || s == 1; }

int lisa_last_draw(const Lisa *z, int s) {
    int d = s / z->interval * z->interval;
    return s >= 1 && d < 1 ? 1 : d;
}

// A partial Fisher-Yates shuffle of 0..L-1: its first n entries are the draw. The generator is
// xoshiro256** (util.c) seeded from (seed, s), so a resumed run redraws the same layers.
void lisa_draw(Lisa *z, int s) {
    int *idx = xmalloc(sizeof(int) * (size_t)z->L);
    for (int i = 0; i < z->L; i++) idx[i] = i;
    Rng r;
    rng_seed(&r, z->seed * 0x9E3779B97F4A7C15ULL + 0x4C495341ULL + (uint64_t)s);
    memset(z->on, 0, (size_t)z->L);
    for (int i = 0; i < z->n; i++) {
        const int j = i + (int)(rng_next(&r) % (uint64_t)(z->L - i)), t = idx[i];
        idx[i] = idx[j], idx[j] = t;
        z->on[idx[i]] = 1;
    }
    free(idx);
}

void lisa_describe(const Lisa *z, char *buf, int cap) {
    int w = 0;
    buf[0] = 0;
    for (int l = 0; l < z->L && w < cap; l++)
        if (z->on[l]) w += snprintf(buf + w, (size_t)(cap - w), "%s%d", w ? ", " : "", l);
}
