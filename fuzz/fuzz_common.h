// fuzz_common.h: shared by the libFuzzer targets in fuzz/ (see README.md, "Fuzzing").
//
// The parsers report bad input through fail(), which prints one line and exits; under libFuzzer
// an exit is a crash, so the harness sets fail_exit_hook and longjmps back to the target instead.
// What the failing parser held would then leak (a run with a YAML error leaks libyaml's 64 KiB
// of buffers, so millions of runs would exhaust memory): the harness records, through the
// sanitizer's malloc/free hooks, every block the main thread allocates inside FUZZ_TRY and has
// not freed, and frees those after a fail(). It also closes the descriptors and unmaps the
// files under its temporary directory that the failing parser left open. (This assumes a
// failing reader stores no new allocation in state that outlives the call, true of the
// readers fuzzed here; a wrong assumption would show up as a use-after-free report. A stdio
// FILE is such state: libc keeps every open stream in a list, so a reader closes its FILE
// before fail(). gpt2_io's header reader did not, and fuzz_gpt2_bin spun at exit in
// _IO_flush_all_lockp, walking that list through the freed stream.)
//
// Each target writes its input into a file under fuzz_dir() and calls the reader on that path,
// exactly as the trainer does: no parser is refactored for fuzzing.
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sanitizer/allocator_interface.h>
#include <sys/mman.h>
#include <unistd.h>
#include "util.h"

// Live blocks allocated inside FUZZ_TRY: open addressing on the pointer, 0 empty, 1 deleted.
// The hooks run inside the allocator: they must not allocate. If the table fills, further
// blocks are not tracked (they leak, as without this).
#define FUZZ_TRACK_CAP (1 << 18)
static uintptr_t fuzz_live[FUZZ_TRACK_CAP];
static uint32_t fuzz_log[FUZZ_TRACK_CAP];  // slots written since the last reset
static size_t fuzz_nlog;
static __thread int fuzz_tracking;  // only the fuzzing thread's blocks

static size_t fuzz_slot(uintptr_t p) { return (size_t)((p >> 4) * 0x9E3779B97F4A7C15ULL >> 46); }

static void fuzz_malloc_hook(const volatile void *ptr, size_t size) {
    (void)size;
    if (!fuzz_tracking || !ptr || fuzz_nlog >= FUZZ_TRACK_CAP) return;
    uintptr_t p = (uintptr_t)ptr;
    for (size_t i = fuzz_slot(p), n = 0; n < FUZZ_TRACK_CAP; i = (i + 1) & (FUZZ_TRACK_CAP - 1), n++)
        if (fuzz_live[i] <= 1) {
            fuzz_live[i] = p;
            fuzz_log[fuzz_nlog++] = (uint32_t)i;
            return;
        }
}

static void fuzz_free_hook(const volatile void *ptr) {
    if (!fuzz_tracking || !ptr) return;
    uintptr_t p = (uintptr_t)ptr;
    for (size_t i = fuzz_slot(p), n = 0; n < FUZZ_TRACK_CAP; i = (i + 1) & (FUZZ_TRACK_CAP - 1), n++) {
        if (fuzz_live[i] == p) {
            fuzz_live[i] = 1;
            return;
        }
        if (fuzz_live[i] == 0) return;  // allocated before tracking began
    }
}

// Forgets every tracked block; frees them first when release is set.
static void fuzz_track_reset(int release) {
    fuzz_tracking = 0;
    for (size_t k = 0; k < fuzz_nlog; k++) {
        uintptr_t p = fuzz_live[fuzz_log[k]];
        if (release && p > 1) free((void *)p);
        fuzz_live[fuzz_log[k]] = 0;
    }
    fuzz_nlog = 0;
}

static jmp_buf fuzz_jmp;
static volatile int fuzz_armed;
static char fuzz_tmp[256];

static void fuzz_jump(void) {
    if (fuzz_armed) {
        fuzz_armed = 0;
        fuzz_tracking = 0;
        longjmp(fuzz_jmp, 1);
    }
    abort();  // fail() outside FUZZ_TRY: a harness bug, or setup that must not fail
}

static void fuzz_remove_tmp(void) {
    if (fuzz_tmp[0]) remove_tree(fuzz_tmp);
}

// The per-process scratch directory (created on first use, removed at exit).
static const char *fuzz_dir(void) {
    if (!fuzz_tmp[0]) {
        const char *base = getenv("FUZZ_TMPDIR");
        if (!base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fuzz_tmp, sizeof fuzz_tmp, "%s/llmc_fuzz_XXXXXX", base);
        if (!mkdtemp(fuzz_tmp)) {
            perror("mkdtemp");
            abort();
        }
        atexit(fuzz_remove_tmp);
        fail_exit_hook = fuzz_jump;
        __sanitizer_install_malloc_and_free_hooks(fuzz_malloc_hook, fuzz_free_hook);
    }
    return fuzz_tmp;
}

static void fuzz_path(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", fuzz_dir(), name);
}

static void fuzz_write(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

// Closes descriptors and unmaps files under fuzz_dir() that a failed parser left behind.
static void fuzz_cleanup(void) {
    size_t dl = strlen(fuzz_tmp);
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        int self = dirfd(d), fds[256], nfd = 0;
        struct dirent *e;
        while ((e = readdir(d)) && nfd < 256) {
            int fd = atoi(e->d_name);
            if (e->d_name[0] == '.' || fd == self) continue;
            char link[64], target[4096];
            snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n > 0 && (size_t)n >= dl && !memcmp(target, fuzz_tmp, dl)) fds[nfd++] = fd;
        }
        closedir(d);
        for (int i = 0; i < nfd; i++) close(fds[i]);
    }
    FILE *m = fopen("/proc/self/maps", "r");
    if (!m) return;
    uintptr_t lo[256], hi[256];
    int nm = 0;
    char line[4352];
    while (fgets(line, sizeof line, m) && nm < 256) {
        char *p = strchr(line, '/');
        if (!p || strncmp(p, fuzz_tmp, dl)) continue;
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx", &a, &b) == 2) lo[nm] = a, hi[nm] = b, nm++;
    }
    fclose(m);
    for (int i = 0; i < nm; i++) munmap((void *)lo[i], hi[i] - lo[i]);
}

// FUZZ_TRY({ ...calls that may fail()... }): a fail() inside returns here and cleans up.
#define FUZZ_TRY(...)                           \
    do {                                        \
        fuzz_dir();                             \
        if (setjmp(fuzz_jmp) == 0) {            \
            fuzz_armed = 1;                     \
            fuzz_tracking = 1;                  \
            __VA_ARGS__;                        \
            fuzz_armed = 0;                     \
            fuzz_track_reset(0);                \
        } else {                                \
            fuzz_track_reset(1);                \
            fuzz_cleanup();                     \
        }                                       \
    } while (0)
