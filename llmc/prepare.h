// prepare.h: Axolotl `datasets:` runs. The trainer stays C: scripts/prepare_data.py (Python,
// the model's own Hugging Face tokenizer and chat template) turns the dataset files into rows
// (rows.h) in a cache directory; this file hands it the configuration and reads the answer.
//
// The contract (DESIGN.md, "Prepared datasets"): the trainer writes a spec (JSON: the whole
// YAML config converted to JSON, with --set overrides, plus the resolved tokenizer directory,
// sequence_len, seed, the cache root and the model's vocab_size) and runs
//   $LLMC_PYTHON scripts/prepare_data.py --spec SPEC.json --result RESULT.txt
// with fork/exec (no shell) and HF_HUB_OFFLINE=1. The script decides whether its cache is
// current (a hash of the data keys, the tokenizer files, the dataset files and sequence_len),
// prints one line saying what it did and writes the prepared directory into RESULT.txt. A
// failure is its one "error: FILE:LINE: ..." line plus one line from here; the trainer exits
// with the script's status. Under MPI only rank 0 prepares; the others receive the directory.
#pragma once
#include <stddef.h>
#include <yaml.h>
#include "comm.h"
#include "config.h"

// The YAML node as JSON (cJSON *): plain scalars typed as YAML 1.1 readers type them (null,
// booleans including yes/no/on/off, numbers with 1_000 separators), quoted scalars as strings.
// Fails naming path:line on a duplicate key, a non-scalar key or nesting deeper than 64.
void *prepare_yaml_to_json(yaml_document_t *doc, yaml_node_t *node, const char *path);
// --set key=value: the config's JSON gets key (top level) = value typed as a plain YAML scalar.
void prepare_json_set(Config *cfg, const char *key, const char *value);
// True when the config asks for prepared data: a non-empty datasets: or pretraining_dataset:.
int prepare_wants_data(const Config *cfg);
// Resolves the tokenizer directory (tokenizer_config, a directory or hub id, else base_model)
// into cfg->tokenizer_dir; fails naming the key when there is none.
void prepare_resolve_tokenizer(Config *cfg);
// Runs the script (rank 0) and sets cfg->prepared_dir on every rank. vocab: the model's.
void prepare_data(Config *cfg, int vocab, Comm *comm);
