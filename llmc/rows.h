// rows.h: prepared rows (train.bin / eval.bin written by scripts/prepare_data.py) and their
// batch loader. The format is the contract in DESIGN.md ("Prepared datasets"):
//
//   header: 256 int32, little endian
//     [0] magic 20241124  [1] version 1  [2] T (row length = sequence_len)  [3] nrows
//     [4] flags (bit 0: packed, bit 1: paired)  [5] max token id + 1  [6] ndocs  [7..8] target count (uint64)
//   then nrows rows of 3*T int32: tokens[T], targets[T], doc_start[T]
//
// targets[t] is the id to predict at t (tokens[t+1] of the same document) or -1 (not trained);
// doc_start[t] is the in-row index of the first token of t's document (positions restart there
// and attention stays inside it). The loader checks every row it reads (ids against the
// vocabulary, targets against the next token of the same document, the document map), and
// the whole file once at open, so a bad file ends the run before training with one line
// naming the file and the row.
//
// Paired rows (preference training, preference.h) come in pairs: row 2k the prompt and chosen
// completion, row 2k+1 the same prompt and the rejected one, each with at least one target; the
// loader serves, shuffles and counts whole pairs (its units) and a micro-batch of B pairs is 2B
// rows.
//
// Batches: a loader serves micro-batches of B rows (B = world x micro_batch_size: every rank
// reads the global micro-batch and trains on its part, as with token shards). An epoch is
// steps_per_epoch = ceil(nrows / (B x accum)) optimizer steps; the slots of the last step that
// no row fills are empty rows (every target -1: they add nothing to the loss or the
// gradients). Shuffled, the rows of each epoch are visited in a seeded random order that
// depends only on (seed, epoch), so a resumed run (epoch, next slot) rebuilds it exactly.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define ROWS_MAGIC 20241124
#define ROWS_VERSION 1
#define ROWS_FLAG_PACKED 1
#define ROWS_FLAG_PAIRED 2
// A reward model's rows (with PAIRED): each row's one target is the token at the position where
// the score is read (the last non-pad token), not the next token.
#define ROWS_FLAG_SCORED 4
// A token classifier's rows (a process reward model's): a target is the class (0 or 1) of the
// token at its own position, not the next token.
#define ROWS_FLAG_LABELS 8

typedef struct {
    char *path;
    uint64_t size, dev, ino;  // identity of the file opened (checked before each read)
    int fd;
    int T, packed, vocab;
    size_t nrows;
    int unit;                  // rows served together: 1, or 2 for preference pairs (chosen, rejected)
    int scored;                // ROWS_FLAG_SCORED: one target a row, where a reward model reads its score
    int labels;                // ROWS_FLAG_LABELS: targets are token classes (0 or 1) at their positions
    size_t nunits;             // nrows / unit
    uint64_t ndocs, ntargets;  // from the header, checked against the rows at open
    int max_id1;               // header [5]
    int B, accum, shuffle;     // B: units (rows or pairs) per micro-batch
    uint64_t seed;
    size_t served;             // units of each epoch's order that are read: nunits, or whole micro-batches (drop_last)
    size_t slots;              // unit slots one epoch has: steps_per_epoch x B x accum >= served
    // position: epoch and the index of the next slot in that epoch
    uint64_t epoch;
    size_t next;
    size_t *order;             // the epoch's unit order (a permutation of 0..nunits-1)
    int32_t *buf;              // one row: 3*T int32
    size_t *ids;               // the rows rows_next served last (B x unit; nrows for an empty row)
} RowLoader;

// Opens and checks path (every row is read once). B rows per micro-batch, accum micro-batches
// per optimizer step. T must be the run's sequence_len; ids must be < vocab. what names the
// file's role in messages ("train rows"). Fails with one line on any problem.
void rows_open(RowLoader *rl, const char *path, int B, int accum, int T, int vocab, int shuffle,
               uint64_t seed, const char *what);
// dataloader_drop_last: each epoch serves whole micro-batches only (the first nrows - nrows % B
// rows of its order), as a PyTorch DataLoader with drop_last; fails when that is none. Call
// right after rows_open.
void rows_drop_last(RowLoader *rl);
// Optimizer steps in one epoch.
size_t rows_steps_per_epoch(const RowLoader *rl);
// Next micro-batch: tokens, targets, doc_start, each [B*T]. Past the epoch's rows: empty rows.
void rows_next(RowLoader *rl, int32_t *tokens, int32_t *targets, int32_t *doc_start);
// Reads row r (no shuffle, no epoch) into the three arrays [T] each; r >= nrows: an empty row.
void rows_read(RowLoader *rl, size_t r, int32_t *tokens, int32_t *targets, int32_t *doc_start);
// Position for checkpoints (fails when next is past the epoch: the data changed).
void rows_seek(RowLoader *rl, uint64_t epoch, size_t next);
void rows_close(RowLoader *rl);
