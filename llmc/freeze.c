// freeze.c: see freeze.h.
#include "freeze.h"
#include <stdlib.h>
#include <string.h>
#include "util.h"

// Axolotl's row range at the end of a pattern (its regex ^(.+)\[([0-9]*)(?::([0-9]*))?\]$):
// the '[' where it starts, or NULL.
static const char *range_start(const char *p) {
    size_t n = strlen(p);
    if (n < 3 || p[n - 1] != ']') return NULL;
    const char *open = strrchr(p, '[');
    if (!open || open == p) return NULL;
    int colons = 0;
    for (const char *c = open + 1; c < p + n - 1; c++) {
        if (*c == ':') colons++;
        else if (*c < '0' || *c > '9') return NULL;
    }
    return colons <= 1 ? open : NULL;
}

// A decimal of at most 15 digits (Axolotl reads any size; rows past 10^15 exist in no model).
static int64_t range_num(const char *a, const char *b, const char *src, const char *pat) {
    if (b - a > 15) fail("%s: unfrozen_parameters: '%s': a row index of more than 15 digits", src, pat);
    int64_t v = 0;
    for (; a < b; a++) v = v * 10 + (*a - '0');
    return v;
}

// "[N]" is row N; "[a:b]" rows a..b-1, either side may be empty (0, the end); "[]" the whole
// tensor, as Axolotl parses them.
static RowRange parse_range(const char *open, const char *src, const char *pat) {
    const char *close = open + strlen(open) - 1, *colon = memchr(open, ':', (size_t)(close - open));
    RowRange r;
    if (!colon) {
        if (close == open + 1) return (RowRange){0, -1};
        r.start = range_num(open + 1, close, src, pat);
        r.end = r.start + 1;
        return r;
    }
    r.start = colon > open + 1 ? range_num(open + 1, colon, src, pat) : 0;
    r.end = close > colon + 1 ? range_num(colon + 1, close, src, pat) : -1;
    if (r.end >= 0 && r.start >= r.end)
        fail("%s: unfrozen_parameters: '%s': the range's end must be greater than its start", src, pat);
    return r;
}

static const char *python_only(const char *p) {
    static const char *const bad[] = {"\\d", "\\D", "\\w", "\\W", "\\s", "\\S", "\\b", "\\B", "\\A", "\\Z",
                                      "(?", "*?", "+?", "??", "}?"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (strstr(p, bad[i])) return bad[i];
    int in_class = 0;
    for (const char *c = p; *c; c++) {
        if (*c == '[' && !in_class) in_class = 1;
        else if (*c == ']' && in_class) in_class = 0;
        else if (in_class && (*c == '.' || *c == '\\')) return "a '.' or '\\' inside [...]";
    }
    return NULL;
}

void unfrozen_compile(Unfrozen *u, const char *patterns, const char *src) {
    memset(u, 0, sizeof *u);
    char *copy = xmalloc(strlen(patterns) + 1);
    strcpy(copy, patterns);
    int cap = 1;
    for (const char *c = patterns; *c; c++) cap += *c == '\n';
    u->re = xcalloc((size_t)cap, sizeof(regex_t));
    u->range = xcalloc((size_t)cap, sizeof(RowRange));
    u->text = xcalloc((size_t)cap, sizeof(char *));
    for (char *save, *p = strtok_r(copy, "\n", &save); p; p = strtok_r(NULL, "\n", &save)) {
        u->text[u->n] = xmalloc(strlen(p) + 1);
        strcpy(u->text[u->n], p);
        char *open = (char *)range_start(p);
        u->range[u->n] = open ? parse_range(open, src, u->text[u->n]) : (RowRange){-1, -1};
        if (open) *open = 0;  // the name part is the regex
        const char *why = python_only(p);
        if (why)
            fail("%s: unfrozen_parameters: '%s' uses %s, Python regex syntax that this program's POSIX regexes "
                 "do not read the same way; write it with [0-9], [a-z_] and plain groups", src, p, why);
        why = regex_too_complex(p);
        if (why) fail("%s: unfrozen_parameters: '%s' has %s, which this program does not compile", src, p, why);
        // "^(" + the pattern with Axolotl's dot rewrite + ")": re.match anchors at the start only.
        size_t n = strlen(p);
        char *ere = xmalloc(2 * n + 4), *o = ere;
        *o++ = '^', *o++ = '(';
        for (size_t i = 0; i < n; i++) {
            if (p[i] == '.' && p[i + 1] != '+') *o++ = '\\';
            *o++ = p[i];
        }
        *o++ = ')', *o = 0;
        int rc = regcomp(&u->re[u->n], ere, REG_EXTENDED | REG_NOSUB);
        free(ere);
        if (rc) {
            char msg[128];
            regerror(rc, &u->re[u->n], msg, sizeof msg);
            fail("%s: unfrozen_parameters: '%s' is not a valid regex: %s", src, p, msg);
        }
        u->n++;
    }
    free(copy);
    if (!u->n) fail("%s: unfrozen_parameters is empty; leave it out to train every parameter", src);
}

int unfrozen_match(const Unfrozen *u, const char *name) {
    for (int i = 0; i < u->n; i++)
        if (regexec(&u->re[i], name, 0, NULL, 0) == 0) return 1;
    return 0;
}

static int by_start(const void *x, const void *y) {
    const RowRange *a = x, *b = y;
    return a->start < b->start ? -1 : a->start > b->start ? 1 : (a->end > b->end) - (a->end < b->end);
}

int unfrozen_rows(const Unfrozen *u, const char *name, int64_t rows, RowRange *keep, const char *src) {
    RowRange *all = xmalloc(sizeof(RowRange) * (size_t)(u->n ? u->n : 1));
    int n = 0;
    for (int i = 0; i < u->n; i++) {
        if (u->range[i].start < 0 || regexec(&u->re[i], name, 0, NULL, 0) != 0) continue;
        RowRange r = u->range[i];
        if (r.end < 0) r.end = rows;
        if (r.end > rows || r.start >= r.end)
            fail("%s: unfrozen_parameters: '%s': rows [%lld, %lld) are not inside %s's %lld rows", src, u->text[i],
                 (long long)r.start, (long long)r.end, name, (long long)rows);
        all[n++] = r;
    }
    qsort(all, (size_t)n, sizeof *all, by_start);
    int m = 0;  // merge overlapping (and touching) ranges, as Axolotl's _merge_ranges
    for (int i = 0; i < n; i++) {
        if (m && all[i].start <= keep[m - 1].end) {
            if (all[i].end > keep[m - 1].end) keep[m - 1].end = all[i].end;
            continue;
        }
        if (m == UNFROZEN_MAX_RANGES)
            fail("%s: unfrozen_parameters: %s: more than %d separate row ranges", src, name, UNFROZEN_MAX_RANGES);
        keep[m++] = all[i];
    }
    free(all);
    return m;
}

void unfrozen_free(Unfrozen *u) {
    for (int i = 0; i < u->n; i++) regfree(&u->re[i]), free(u->text[i]);
    free(u->re);
    free(u->range);
    free(u->text);
    memset(u, 0, sizeof *u);
}
