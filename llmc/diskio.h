// diskio.h: the disk tier's I/O thread. Jobs (write a buffer to a file, read a file into a
// buffer and delete it) run in FIFO order on one thread, so the training thread only waits
// when it needs the result. Files live in a private directory that is removed at exit or on
// failure; a later run removes directories left by runs that were killed.
#pragma once
#include <pthread.h>
#include <stddef.h>
#include "backend.h"

typedef struct DiskIO DiskIO;
typedef struct {
    int kind;            // internal
    char path[4200];
    void *buf;
    size_t bytes;
    volatile int done;   // set by the I/O thread under the lock
    int err;             // errno of a failure, 0 if fine
} DiskJob;

// Creates "llmc-offload-<pid>-XXXXXX" under parent ("" = $TMPDIR or /tmp) after removing
// such directories whose owner pid is dead. Disk bytes are counted in mem->disk_*.
// The directory is flock'ed while the run lives.
DiskIO *diskio_create(const char *parent, MemStats *mem);
// Removes "llmc-offload-<pid>-*" directories under parent left by killed runs (a run that
// does not use the disk tier calls it too, for its activation_offloading_dir).
void diskio_clean_debris(const char *parent);
void diskio_destroy(DiskIO *io);  // joins the thread and removes the directory
const char *diskio_dir(const DiskIO *io);
void diskio_write(DiskIO *io, DiskJob *job, const char *name, const void *buf, size_t bytes);
void diskio_read(DiskIO *io, DiskJob *job, const char *name, void *buf, size_t bytes);
// Waits for the job; a failed job stops the run with a message naming the file.
void diskio_wait(DiskIO *io, DiskJob *job);
