// dev/cuda/comm.cu: comm.h over NCCL (llmc/cuda/comm_nccl.cu) on one GPU, and the launcher-free
// pieces that need no GPU.
//   - NCCL world of one (as LLMC_FORCE_NCCL=1 runs it): every collective, device and host
//     buffers, in-place and out-of-place reduce-scatter, a broadcast that outgrows its staging;
//   - the timeout: a boot comm without one (single process, the launcher-free comm) must not
//     hand NCCL a 0 s timeout; under the emulator a collective that takes 30 ms must succeed and
//     one that never finishes must fail after LLMC_COMM_TIMEOUT with a message;
//   - the launcher-free comm (WORLD_SIZE) carries the default timeout;
//   - the rendezvous file (comm_file_rendezvous, in forked processes): ranks that start before
//     rank 0, a file left in the GO state by an earlier run that crashed (the old reader took its
//     id and hung), a rank 0 that never comes (fails after the timeout), the file removed after.
#include <sys/wait.h>
#include <unistd.h>
#include "dev_common.cuh"
extern "C" {
#include "llmc/backend.h"
#include "llmc/comm.h"
}

// Runs fn in a forked process with stderr captured; returns its exit status (-1: signal).
template <class F> static pid_t spawn(F fn, int *errfd) {
    int fd[2];
    if (pipe(fd)) return -1;
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        int rc = fn();
        fflush(stderr);
        _exit(rc);
    }
    close(fd[1]);
    *errfd = fd[0];
    return pid;
}
static int reap(pid_t pid, int errfd, std::string &err) {
    char buf[512];
    ssize_t r;
    while ((r = read(errfd, buf, sizeof buf)) > 0) err.append(buf, (size_t)r);
    close(errfd);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static std::vector<unsigned char> blob_of(int seed) {
    std::vector<unsigned char> b(128);
    for (size_t i = 0; i < b.size(); i++) b[i] = (unsigned char)(seed * 131 + i * 7 + 1);
    return b;
}

static void rendezvous_tests() {
    char path[256];
    snprintf(path, sizeof path, "/tmp/llmc_rdv_test_%d", (int)getpid());
    const double T = 20;  // generous: the checks below must pass long before it
    // (a) three ranks, ranks 1 and 2 up before rank 0
    {
        std::vector<unsigned char> want = blob_of(1);
        pid_t p[3];
        int fd[3];
        for (int r = 2; r >= 0; r--) {
            p[r] = spawn([&, r]() {
                std::vector<unsigned char> b = r == 0 ? want : std::vector<unsigned char>(128, 0);
                comm_file_rendezvous(path, r, 3, b.data(), b.size(), T);
                return b == want ? 0 : 2;
            }, &fd[r]);
            if (r) usleep(100000);
        }
        std::string err;
        int ok = 1;
        for (int r = 0; r < 3; r++) ok &= reap(p[r], fd[r], err) == 0;
        check_true("rendezvous: 3 ranks, rank 0 last, every rank gets rank 0's id", ok, err.c_str());
        comm_file_rendezvous_done(path, 0);
        check_true("rendezvous: rank 0 removes the file when done", access(path, F_OK) != 0, "file still there");
    }
    // (b) run A leaves its file in the GO state (rank 0 died before removing it); run B's rank 1
    // starts first and must wait for run B's rank 0, not take run A's id
    {
        std::vector<unsigned char> a = blob_of(2), b = blob_of(3);
        pid_t p0, p1;
        int f0, f1;
        p1 = spawn([&]() {
            std::vector<unsigned char> x(128, 0);
            comm_file_rendezvous(path, 1, 2, x.data(), x.size(), T);
            return x == a ? 0 : 2;
        }, &f1);
        p0 = spawn([&]() {
            std::vector<unsigned char> x = a;
            comm_file_rendezvous(path, 0, 2, x.data(), x.size(), T);
            return 0;  // no comm_file_rendezvous_done: the file stays
        }, &f0);
        std::string err;
        int ok = reap(p0, f0, err) == 0 && reap(p1, f1, err) == 0;
        FILE *f = fopen(path, "rb");
        std::vector<unsigned char> file(4096);
        size_t n = f ? fread(file.data(), 1, file.size(), f) : 0;
        if (f) fclose(f);
        int stale = n >= 128 && !memcmp(file.data() + n - 128, a.data(), 128);  // run A's id, readable
        check_true("rendezvous: a crashed run leaves its id file behind (the old reader would take it)", ok && stale,
                   err.c_str());
        p1 = spawn([&]() {
            std::vector<unsigned char> x(128, 0);
            comm_file_rendezvous(path, 1, 2, x.data(), x.size(), T);
            return x == b ? 0 : x == a ? 3 : 2;
        }, &f1);
        usleep(300000);  // rank 1 sees only the stale file for a while
        p0 = spawn([&]() {
            std::vector<unsigned char> x = b;
            comm_file_rendezvous(path, 0, 2, x.data(), x.size(), T);
            return 0;
        }, &f0);
        err.clear();
        int r0 = reap(p0, f0, err), r1 = reap(p1, f1, err);
        char det[600];
        snprintf(det, sizeof det, "rank 0 exit %d, rank 1 exit %d (3: took the stale id) %s", r0, r1, err.c_str());
        check_true("rendezvous: a stale GO file of an earlier run is ignored; rank 1 gets this run's id", r0 == 0 && r1 == 0, det);
        comm_file_rendezvous_done(path, 0);
    }
    // (c) no rank 0: rank 1 fails after the timeout, with a message
    {
        int fd;
        double t0 = now_ms();
        pid_t p = spawn([&]() {
            std::vector<unsigned char> x(128, 0);
            comm_file_rendezvous(path, 1, 2, x.data(), x.size(), 0.3);
            return 0;
        }, &fd);
        std::string err;
        int st = reap(p, fd, err);
        double s = (now_ms() - t0) / 1e3;
        check_true("rendezvous: without rank 0, rank 1 fails after the timeout with a message",
                   st == 1 && err.find("did not publish") != std::string::npos && s < 5, err.c_str());
        char ack[300];
        snprintf(ack, sizeof ack, "%s.ack1", path);
        unlink(ack);
    }
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    unsetenv("LLMC_COMM_TIMEOUT");
    // the launcher-free comm carries a timeout
    setenv("WORLD_SIZE", "2", 1), setenv("RANK", "1", 1), setenv("LOCAL_RANK", "0", 1);
    int ac = 1;
    char **av = argv;
    Comm *env = comm_create(&ac, &av);
    char det[200];
    snprintf(det, sizeof det, "name %s timeout %.1f", env->name, env->timeout_s);
    check_true("launcher-free comm (WORLD_SIZE=2) has the default 300 s timeout", !strcmp(env->name, "env") && env->timeout_s == 300, det);
    env->destroy(env);
    unsetenv("WORLD_SIZE"), unsetenv("RANK"), unsetenv("LOCAL_RANK");

    rendezvous_tests();

#ifdef LLMC_EMU
    setenv("EMU_NCCL_DELAY_MS", "30", 1);  // every collective "runs" 30 ms: a 0 s timeout fails it
#endif
    for (int bf = 0; bf < 2; bf++) {
        Backend *bk = backend_cuda_create(bf, 0);
        Comm *c = comm_nccl_create(comm_single(), 0, 1, 0, bk);
        snprintf(det, sizeof det, "name %s timeout %.1f", c->name, c->timeout_s);
        char name[160];
        snprintf(name, sizeof name, "nccl world 1 %s: a boot comm without a timeout gives the default 300 s", prec(bf));
        check_true(name, !strcmp(c->name, "nccl") && c->timeout_s == 300, det);
        const size_t n = 1000;
        std::vector<float> x = randn(2 * n), xr = x, y(2 * n);
        round_act(xr, bf);
        void *d = bk->dev_alloc(bk, 2 * n * bk->act_bytes, "x"), *d2 = bk->dev_alloc(bk, 2 * n * bk->act_bytes, "y");
        // The sums carry gradients: float in both precisions (comm.h), so values pass unrounded.
        float *g = (float *)bk->dev_alloc(bk, 2 * n * sizeof(float), "g"), *g2 = (float *)bk->dev_alloc(bk, 2 * n * sizeof(float), "g2");
        auto down_f = [&](const float *src, size_t k) {
            bk->copy_d2h(bk, y.data(), src, k * sizeof(float), NULL);
            bk->sync(bk);
        };
        bk->copy_h2d(bk, g, x.data(), 2 * n * sizeof(float), NULL);
        c->all_reduce_sum(c, g, 2 * n);
        down_f(g, 2 * n);
        snprintf(name, sizeof name, "nccl world 1 %s: all-reduce (float gradients) is the identity", prec(bf));
        check_true(name, !memcmp(y.data(), x.data(), 2 * n * 4), "values changed");
        c->reduce_scatter_sum(c, g2, g, 2 * n);
        down_f(g2, 2 * n);
        snprintf(name, sizeof name, "nccl world 1 %s: reduce-scatter (float) out of place", prec(bf));
        check_true(name, !memcmp(y.data(), x.data(), 2 * n * 4), "values changed");
        c->reduce_scatter_sum(c, g, g, n);
        down_f(g, n);
        snprintf(name, sizeof name, "nccl world 1 %s: reduce-scatter (float) in place", prec(bf));
        check_true(name, !memcmp(y.data(), x.data(), n * 4), "values changed");
        bk->upload_act(bk, d, x.data(), n);
        c->all_gather(c, d2, d, n);
        bk->download_act(bk, y.data(), d2, n);
        snprintf(name, sizeof name, "nccl world 1 %s: all-gather (act precision)", prec(bf));
        check_true(name, !memcmp(y.data(), xr.data(), n * 4), "values changed");
        bk->upload_act(bk, d, x.data(), 2 * n);
        bk->memzero(bk, d2, 2 * n * bk->act_bytes, NULL);
        c->all_to_all(c, d2, d, n);  // world 1: block 0 to itself; the rest of recv untouched
        bk->download_act(bk, y.data(), d2, 2 * n);
        snprintf(name, sizeof name, "nccl world 1 %s: all-to-all (grouped send/receive)", prec(bf));
        check_true(name, !memcmp(y.data(), xr.data(), n * 4) && y[n] == 0 && y[2 * n - 1] == 0, "values changed");
        double h[3] = {1.5, -2, 1e300};
        c->all_reduce_sum_f64(c, h, 3);
        snprintf(name, sizeof name, "nccl world 1 %s: host f64 all-reduce", prec(bf));
        check_true(name, h[0] == 1.5 && h[1] == -2 && h[2] == 1e300, "values changed");
        std::vector<unsigned char> small = blob_of(5), big(5000);
        for (size_t i = 0; i < big.size(); i++) big[i] = (unsigned char)(i * 13);
        std::vector<unsigned char> s0 = small, b0 = big;
        c->broadcast(c, small.data(), small.size(), 0);
        c->broadcast(c, big.data(), big.size(), 0);  // grows the staging buffers
        c->barrier(c);
        snprintf(name, sizeof name, "nccl world 1 %s: host broadcasts (staging grows), barrier", prec(bf));
        check_true(name, small == s0 && big == b0, "bytes changed");
        bk->dev_free(bk, d), bk->dev_free(bk, d2), bk->dev_free(bk, g), bk->dev_free(bk, g2);
        c->destroy(c);
        bk->destroy(bk);
    }
#ifdef LLMC_EMU
    // a collective that never finishes fails after LLMC_COMM_TIMEOUT (here 0.3 s), with a message
    {
        int fd;
        double t0 = now_ms();
        pid_t p = spawn([&]() {
            setenv("EMU_NCCL_DELAY_MS", "60000", 1);
            setenv("LLMC_COMM_TIMEOUT", "0.3", 1);
            Backend *bk = backend_cuda_create(1, 0);
            Comm *c = comm_nccl_create(comm_single(), 0, 1, 0, bk);
            void *d = bk->dev_alloc(bk, 64, "x");
            bk->memzero(bk, d, 64, NULL);
            c->all_reduce_sum(c, d, 32);
            return 0;
        }, &fd);
        std::string err;
        int st = reap(p, fd, err);
        double s = (now_ms() - t0) / 1e3;
        check_true("nccl: a hung collective fails after LLMC_COMM_TIMEOUT with a message",
                   st == 1 && err.find("did not complete within") != std::string::npos && s < 10, err.c_str());
    }
    unsetenv("EMU_NCCL_DELAY_MS");
#endif
    return dev_finish("comm");
}
