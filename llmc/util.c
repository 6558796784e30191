// util.c: see util.h.
#include "util.h"
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void (*fail_hooks[8])(void);
static int n_fail_hooks;

void on_fail(void (*fn)(void)) {
    if (n_fail_hooks < 8) fail_hooks[n_fail_hooks++] = fn;
}

const char *fail_prefix = "";
void (*fail_exit_hook)(void);

void fail(const char *fmt, ...) {
    fflush(stdout);
    // One write for the whole line, so lines of ranks failing together do not interleave.
    char line[4096];
    int n = snprintf(line, sizeof line, "error: %s", fail_prefix);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && n < (int)sizeof line) vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    if (len + 1 < sizeof line) line[len++] = '\n', line[len] = 0;
    fwrite(line, 1, len, stderr);
    fflush(stderr);
    for (int i = n_fail_hooks - 1; i >= 0; i--) fail_hooks[i]();
    if (fail_exit_hook) fail_exit_hook();
    exit(1);
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) fail("out of host memory allocating %zu bytes", n);
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) fail("out of host memory allocating %zu x %zu bytes", n, size);
    return p;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

char *read_file(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);  // a FIFO must not block the open
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int dir = S_ISDIR(st.st_mode);
        close(fd);
        errno = dir ? EISDIR : EINVAL;
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return NULL;
    }
    char *buf = xmalloc((size_t)st.st_size + 1);
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

int path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int mkdir_p(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    struct stat st;
    if (stat(tmp, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

int remove_tree(const char *path) {
    if (!path_exists(path)) return 0;
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void join_path(char *out, size_t cap, const char *dir, const char *name) {
    size_t n = strlen(dir);
    if (n && dir[n - 1] == '/') snprintf(out, cap, "%s%s", dir, name);
    else snprintf(out, cap, "%s/%s", dir, name);
}

long long first_nonfinite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return (long long)i;
    return -1;
}

long long parse_size(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v < 0) return -1;
    while (*end == ' ') end++;
    static const struct { const char *suf; double mul; } units[] = {
        {"", 1}, {"B", 1}, {"K", 1e3}, {"KB", 1e3}, {"KiB", 1024.0}, {"M", 1e6}, {"MB", 1e6},
        {"MiB", 1048576.0}, {"G", 1e9}, {"GB", 1e9}, {"GiB", 1073741824.0}, {"T", 1e12},
        {"TB", 1e12}, {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].suf) == 0) return (long long)(v * units[i].mul);
    return -1;
}

void format_bytes(char *out, size_t cap, double b) {
    if (b >= 1073741824.0) snprintf(out, cap, "%.2f GiB", b / 1073741824.0);
    else if (b >= 1048576.0) snprintf(out, cap, "%.2f MiB", b / 1048576.0);
    else if (b >= 1024.0) snprintf(out, cap, "%.1f KiB", b / 1024.0);
    else snprintf(out, cap, "%.0f B", b);
}

uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void rng_seed(Rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(Rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
    return result;
}

float rng_uniform(Rng *r) { return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f); }

float rng_normal(Rng *r) {
    double u1 = ((rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

// glibc's regcomp copies a group's tree once per repetition and multiplies nested repetitions,
// so a short hostile pattern can take gigabytes (fuzz/regressions/adapter_config); backrefs
// make matching exponential. Patterns that name model tensors need none of that.
const char *regex_too_complex(const char *p) {
    if (strlen(p) > 1024) return "more than 1024 characters";
    int depth = 0, maxdepth = 0, quants = 0, prev_quant = 0;
    double copies = 1;
    for (const char *c = p; *c; c++) {
        int quant = 0;
        if (*c == '\\') {
            if (c[1] >= '0' && c[1] <= '9') return "a backreference";
            if (c[1]) c++;
        } else if (*c == '[') {  // a bracket expression: ']' first (or after '^') is a member
            const char *e = c + 1;
            if (*e == '^') e++;
            if (*e == ']') e++;
            while (*e && *e != ']') e++;
            if (!*e) return "an unclosed [";
            c = e;
        } else if (*c == '(') {
            if (++depth > maxdepth) maxdepth = depth;
        } else if (*c == ')') {
            depth--;
        } else if (*c == '*' || *c == '+' || *c == '?') {
            quant = 1;
            if (*c == '+' && c > p && c[-1] == ')') copies *= 2;  // x+ is compiled as x x*
        } else if (*c == '{') {
            char *end;
            long lo = strtol(c + 1, &end, 10), hi = lo;
            if (*end == ',') hi = end[1] == '}' ? lo : strtol(end + 1, &end, 10);
            if (lo > 255 || hi > 255 || lo < 0 || hi < 0) return "a repetition count above 255";
            copies *= (hi > 1 ? hi : 1);
            const char *close = strchr(c, '}');
            if (!close) return "an unclosed {";
            c = close;
            quant = 1;
        }
        if (quant) {
            if (prev_quant) return "a quantifier on a quantifier";
            if (++quants > 64) return "more than 64 quantifiers";
        }
        prev_quant = quant;
    }
    if (maxdepth > 8) return "groups nested more than 8 deep";
    if (copies > 4096) return "counted repetitions that multiply past 4096 copies";
    return NULL;
}

uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
