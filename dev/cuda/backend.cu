// dev/cuda/backend.cu: the CUDA Backend table itself (llmc/cuda/backend_cuda.cu): availability,
// dev_alloc/dev_free and host_alloc/host_free accounting, the budget's out-of-memory message
// (same shape as the CPU backend's, naming what was allocated and appending oom_hint) and a
// real driver out-of-memory (run in child processes, since both end in fail()), act
// upload/download and host conversions, memzero, and copies ordered across a second queue with
// events; pinned host memory only within its cap (the rest pageable, copies still right); under
// the emulator also: no CUDA context on any GPU but the one asked for (MPI ranks asked for
// theirs after a probe had put one on GPU 0), and the stream-order check catching a copy on one
// queue and a kernel on another with no event between them (both orders).
#include <sys/wait.h>
#include <unistd.h>
#include "dev_common.cuh"
extern "C" {
#include "llmc/backend.h"
}

static int child(const char *mode) {
#ifdef LLMC_EMU
    if (!strcmp(mode, "ctx")) {  // two GPUs; this "rank" uses GPU 1
        setenv("EMU_DEVICES", "2", 1);
        emu_context_reset();
        char why[256];
        if (!backend_cuda_available(why, sizeof why)) return 3;
        Backend *bk = backend_cuda_create(1, 1);
        void *d = bk->dev_alloc(bk, 256, "x");
        bk->memzero(bk, d, 256, NULL);
        bk->sync(bk);
        fprintf(stderr, "context mask %u\n", emu_context_mask());
        return emu_context_mask() == 2u ? 0 : 2;
    }
    if (!strcmp(mode, "raw") || !strcmp(mode, "war")) {
        Backend *bk = backend_cuda_create(1, 0);
        const size_t n = 4096;
        void *h = bk->host_alloc(bk, n * 2, "h");
        memset(h, 0, n * 2);
        void *d = bk->dev_alloc(bk, n * 2, "d"), *y = bk->dev_alloc(bk, n * 2, "y");
        bk->memzero(bk, y, n * 2, NULL);
        bk->sync(bk);
        Queue *q = bk->queue_create(bk);
        if (!strcmp(mode, "raw")) {
            bk->copy_h2d(bk, d, h, n * 2, q);  // copy queue writes d ...
            bk->add(bk, y, d, d, n);           // ... the compute queue reads it: no event between
        } else {
            bk->memzero(bk, d, n * 2, NULL);
            bk->sync(bk);
            bk->add(bk, y, d, d, n);           // compute queue reads d ...
            bk->copy_h2d(bk, d, h, n * 2, q);  // ... the copy queue overwrites it: no event between
        }
        bk->sync(bk);
        return 0;  // not reached: the emulator stops at the hazard
    }
#endif
    Backend *bk = backend_cuda_create(1, 0);
    bk->oom_hint = "hint-modes";
    if (!strcmp(mode, "limit")) {
        bk->mem.limit = 1 << 20;
        bk->dev_alloc(bk, 600 << 10, "first tensor");
        bk->dev_alloc(bk, 600 << 10, "test tensor");
    } else {
        bk->dev_alloc(bk, (size_t)1 << 52, "huge tensor");
    }
    return 0;  // not reached: fail() exits 1
}

// Runs this program with `--child mode`; returns its exit status and stderr.
static int run_child(const char *mode, std::string &err) {
    int fd[2];
    if (pipe(fd)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        execl("/proc/self/exe", "backend", "--child", mode, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[512];
    ssize_t r;
    while ((r = read(fd[0], buf, sizeof buf)) > 0) err.append(buf, (size_t)r);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) return child(argv[2]);
    dev_init(argc, argv);
    char why[256];
    check_true("backend_cuda_available", backend_cuda_available(why, sizeof why), why);
    for (int bf = 0; bf < 2; bf++) {
        Backend *bk = backend_cuda_create(bf, 0);
        char name[128];
        snprintf(name, sizeof name, "create %s: name cuda, act_bytes %d", prec(bf), bf ? 2 : 4);
        check_true(name, !strcmp(bk->name, "cuda") && bk->act_bytes == (bf ? 2 : 4), "wrong fields");
        void *a = bk->dev_alloc(bk, 1000, "a"), *b = bk->dev_alloc(bk, 5000, "b");
        bk->dev_free(bk, a);
        void *c2 = bk->dev_alloc(bk, 300, "c");
        snprintf(name, sizeof name, "dev_alloc accounting %s", prec(bf));
        check_true(name, bk->mem.in_use == 5300 && bk->mem.peak == 6000, "in_use/peak wrong");
        bk->dev_free(bk, b), bk->dev_free(bk, c2);
        void *h = bk->host_alloc(bk, 4096, "h");
        snprintf(name, sizeof name, "host_alloc accounting %s", prec(bf));
        check_true(name, bk->mem.in_use == 0 && bk->mem.host_in_use == 4096 && bk->mem.host_peak == 4096, "host counts wrong");
        // act conversions
        const size_t n = 777;
        std::vector<float> x = randn(n), y(n), xr = x;
        round_act(xr, bf);
        void *d = bk->dev_alloc(bk, n * bk->act_bytes, "x");
        bk->upload_act(bk, d, x.data(), n);
        bk->download_act(bk, y.data(), d, n);
        snprintf(name, sizeof name, "upload_act/download_act round trip %s", prec(bf));
        check_true(name, !memcmp(y.data(), xr.data(), n * 4), "values differ from act rounding");
        std::vector<unsigned char> hb(n * bk->act_bytes);
        std::vector<float> z(n);
        bk->host_from_f32(bk, hb.data(), x.data(), n);
        bk->host_to_f32(bk, z.data(), hb.data(), n);
        snprintf(name, sizeof name, "host_from_f32/host_to_f32 round trip %s", prec(bf));
        check_true(name, !memcmp(z.data(), xr.data(), n * 4), "values differ from act rounding");
        // copies across queues: h2d on q, compute queue waits, d2d there, d2h into pinned memory
        const size_t bytes = 4096;
        unsigned char *src = (unsigned char *)bk->host_alloc(bk, bytes, "src"), *dst = (unsigned char *)h;
        for (size_t i = 0; i < bytes; i++) src[i] = (unsigned char)(i * 7 + 3);
        void *d1 = bk->dev_alloc(bk, bytes, "d1"), *d2 = bk->dev_alloc(bk, bytes, "d2");
        Queue *q = bk->queue_create(bk);
        Event *e = bk->event_create(bk), *e2 = bk->event_create(bk);
        bk->queue_wait(bk, q, e2);  // never recorded: returns at once
        bk->copy_h2d(bk, d1, src, bytes, q);
        bk->event_record(bk, e, q);
        bk->queue_wait(bk, NULL, e);
        bk->copy_d2d(bk, d2, d1, bytes, NULL);
        bk->copy_d2h(bk, dst, d2, bytes, NULL);
        bk->event_record(bk, e2, NULL);
        bk->event_sync(bk, e2);
        snprintf(name, sizeof name, "copies ordered by events across queues %s", prec(bf));
        check_true(name, !memcmp(src, dst, bytes), "bytes differ");
        bk->memzero(bk, d2, bytes, q);
        bk->sync(bk);
        bk->copy_d2h(bk, dst, d2, bytes, NULL);
        bk->sync(bk);
        int zero = 1;
        for (size_t i = 0; i < bytes; i++) zero &= dst[i] == 0;
        snprintf(name, sizeof name, "memzero on a queue %s", prec(bf));
        check_true(name, zero, "not zero");
        snprintf(name, sizeof name, "sumsq_many of a float gradient and its first half through the table %s", prec(bf));
        double ss = 0, half = 0;
        for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i], half += i < n / 2 ? (double)x[i] * x[i] : 0;
        float *g = (float *)bk->dev_alloc(bk, n * sizeof(float), "gradient");
        bk->copy_h2d(bk, g, x.data(), n * sizeof(float), NULL);
        const float *gs[2] = {g, g};
        const size_t lens[2] = {n, n / 2};
        double each[2];
        bk->sumsq_many(bk, gs, lens, 2, each);
        check_true(name, fabs(each[0] / ss - 1) < 1e-12 && fabs(each[1] / half - 1) < 1e-12, "wrong sum");
        bk->dev_free(bk, g);
        bk->event_destroy(bk, e), bk->event_destroy(bk, e2), bk->queue_destroy(bk, q);
        bk->dev_free(bk, d), bk->dev_free(bk, d1), bk->dev_free(bk, d2);
        bk->host_free(bk, h), bk->host_free(bk, src);
        snprintf(name, sizeof name, "everything freed %s", prec(bf));
        check_true(name, bk->mem.in_use == 0 && bk->mem.host_in_use == 0, "counts not back to zero");
        bk->destroy(bk);
    }
    // pinned memory within its cap: 1 MiB in all, 768 KiB per buffer
    {
        setenv("LLMC_PINNED_LIMIT_MB", "1", 1);
        setenv("LLMC_PIN_MAX_BUFFER_MB", "0.75", 1);
        Backend *bk = backend_cuda_create(1, 0);
        auto pinned = [](const void *p) {
            cudaPointerAttributes a;
            cudaError_t e = cudaPointerGetAttributes(&a, p);
            (void)cudaGetLastError();
            return e == cudaSuccess && a.type == cudaMemoryTypeHost;
        };
        unsigned char *a = (unsigned char *)bk->host_alloc(bk, 512 << 10, "a");
        unsigned char *b = (unsigned char *)bk->host_alloc(bk, 512 << 10, "b");
        unsigned char *c = (unsigned char *)bk->host_alloc(bk, 4096, "c (past the cap)");
        unsigned char *d = (unsigned char *)bk->host_alloc(bk, 800 << 10, "d (larger than a buffer may be)");
        check_true("host_alloc pins within LLMC_PINNED_LIMIT_MB and LLMC_PIN_MAX_BUFFER_MB, the rest is pageable",
                   pinned(a) && pinned(b) && !pinned(c) && !pinned(d), "wrong pinning");
        bk->host_free(bk, b);
        unsigned char *e = (unsigned char *)bk->host_alloc(bk, 256 << 10, "e");
        check_true("freeing pinned memory returns it to the cap", pinned(e), "not pinned");
        check_true("host accounting counts pinned and pageable alike",
                   bk->mem.host_in_use == (size_t)(512 << 10) + 4096 + (800 << 10) + (256 << 10), "wrong count");
        // copies through pageable memory on a second queue, ordered by events
        const size_t bytes = 4096;
        for (size_t i = 0; i < bytes; i++) c[i] = (unsigned char)(i * 5 + 1);
        void *d1 = bk->dev_alloc(bk, bytes, "d1");
        Queue *q = bk->queue_create(bk);
        Event *ev = bk->event_create(bk);
        bk->copy_h2d(bk, d1, c, bytes, q);
        bk->event_record(bk, ev, q);
        bk->queue_wait(bk, NULL, ev);
        bk->copy_d2h(bk, d, d1, bytes, NULL);
        bk->sync(bk);
        check_true("copies between pageable host memory and the device across queues", !memcmp(c, d, bytes), "bytes differ");
        bk->event_destroy(bk, ev), bk->queue_destroy(bk, q), bk->dev_free(bk, d1);
        bk->host_free(bk, a), bk->host_free(bk, c), bk->host_free(bk, d), bk->host_free(bk, e);
        bk->destroy(bk);
        unsetenv("LLMC_PINNED_LIMIT_MB"), unsetenv("LLMC_PIN_MAX_BUFFER_MB");
    }
    std::string err;
#ifdef LLMC_EMU
    int cst = run_child("ctx", err);
    check_true("a rank that uses GPU 1 creates no context on GPU 0 (availability probe, create)", cst == 0, err.c_str());
    err.clear();
    cst = run_child("raw", err);
    check_true("emulator: a kernel reading what a copy on another queue wrote, no event between, is a hazard",
               cst != 0 && err.find("stream-order hazard (read after write)") != std::string::npos, err.c_str());
    err.clear();
    cst = run_child("war", err);
    check_true("emulator: a copy overwriting what a kernel on another queue reads, no event between, is a hazard",
               cst != 0 && err.find("stream-order hazard (write after read)") != std::string::npos, err.c_str());
    err.clear();
#endif
    int st = run_child("limit", err);
    check_true("budget out-of-memory message names the tensor and appends oom_hint",
               st == 1 && err.find("device memory limit reached allocating") != std::string::npos &&
                   err.find("for test tensor") != std::string::npos && err.find("modes that fit: hint-modes") != std::string::npos,
               err.c_str());
    err.clear();
    st = run_child("driver", err);
    check_true("driver out-of-memory message names the tensor",
               st == 1 && err.find("out of device memory allocating") != std::string::npos &&
                   err.find("for huge tensor") != std::string::npos && err.find("hint-modes") != std::string::npos,
               err.c_str());
    return dev_finish("backend");
}
