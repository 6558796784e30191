// freeze.c: see freeze.h.
#include "freeze.h"
#include <stdlib.h>
#include <string.h>
#include "util.h"

// Axolotl's row range at the end of a pattern: [N] or [N:M] (either side may be empty).
static int has_range(const char *p) {
    size_t n = strlen(p);
    if (n < 3 || p[n - 1] != ']') return 0;
    const char *open = strrchr(p, '[');
    if (!open || open == p) return 0;
    int colons = 0;
    for (const char *c = open + 1; c < p + n - 1; c++) {
        if (*c == ':') colons++;
        else if (*c < '0' || *c > '9') return 0;
    }
    return colons <= 1;
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
    for (char *save, *p = strtok_r(copy, "\n", &save); p; p = strtok_r(NULL, "\n", &save)) {
        if (has_range(p))
            fail("%s: unfrozen_parameters: '%s': a row range (training part of a tensor) is not implemented; "
                 "name whole tensors", src, p);
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

void unfrozen_free(Unfrozen *u) {
    for (int i = 0; i < u->n; i++) regfree(&u->re[i]);
    free(u->re);
    memset(u, 0, sizeof *u);
}
