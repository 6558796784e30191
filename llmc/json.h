// json.h: strict JSON reading for untrusted files (config.json, safetensors headers,
// adapter_config.json, trainer_state.json, index files).
//
// cJSON alone accepts things a careful reader must not: a duplicate key (later lookups see
// only the first copy, so two readers of one file can disagree, and the safetensors reader
// once overflowed a buffer on a second "__metadata__"), text after the document, and "\u0000"
// inside a string (the C string then ends early, so two different names can compare equal).
#pragma once
#include <stddef.h>
#include <cjson/cJSON.h>

// Parses len bytes as one JSON value followed only by whitespace. Returns NULL and writes a
// one-line reason (with the line number, or the duplicated key) into why.
cJSON *json_parse_strict(const char *text, size_t len, char *why, size_t cap);
// Reads and strictly parses a whole file; fails with "PATH: reason" on any problem.
cJSON *json_read_file(const char *path);
