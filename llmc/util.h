// util.h: error exits, checked allocation, a seeded RNG and small helpers shared by every file.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// Print "error: ..." as one line on stderr and exit(1). Every bad input ends here, so a user
// always sees one clear line that names the file, key or value, never a crash.
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
// Register a function that runs before fail() exits (e.g. remove a half-written checkpoint).
void on_fail(void (*fn)(void));
extern const char *fail_prefix;  // e.g. "rank 1: " when several processes train together
// Fuzzing only (fuzz/): when set, fail() calls it instead of exit(1), after printing its line
// and running the on_fail functions. It must not return (the harness longjmps to the fuzzer).
extern void (*fail_exit_hook)(void);

void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
char *xstrdup(const char *s);
// Read a whole file; NULL with errno set if it cannot be opened. *len gets the byte count.
char *read_file(const char *path, size_t *len);
double now_ms(void);
int path_exists(const char *path);
int mkdir_p(const char *path);           // 0 on success
int remove_tree(const char *path);       // rm -rf; 0 on success
void join_path(char *out, size_t cap, const char *dir, const char *name);
// Why a POSIX extended regex is refused before regcomp (it could take unbounded memory or
// time: nested or counted repetitions, deep groups, backreferences), or NULL.
const char *regex_too_complex(const char *p);
// Index of the first NaN or infinity in x[0..n), or -1: guards every weight file we write.
long long first_nonfinite(const float *x, size_t n);
// Parse "2GiB", "512MiB", "100000" into bytes; -1 if malformed.
long long parse_size(const char *s);
void format_bytes(char *out, size_t cap, double bytes);

// FNV-1a over n bytes, continuing from h (14695981039346656037 starts a hash).
uint64_t fnv1a(uint64_t h, const void *p, size_t n);
// float -> bfloat16 bits with round-to-nearest-even, as torch's .to() does.
uint16_t float_to_bf16(float f);

// xoshiro256** seeded by splitmix64: small, fast, and its whole state fits in a checkpoint.
typedef struct { uint64_t s[4]; } Rng;
void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_next(Rng *r);
float rng_uniform(Rng *r);               // [0, 1)
float rng_normal(Rng *r);                // N(0, 1), Box-Muller
