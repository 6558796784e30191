// export.c: see export.h.
#include "export.h"
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "checkpoint.h"
#include "util.h"

// What transformers' tokenizers and generation read beside the weights.
static const char *const BASE_FILES[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "generation_config.json"};

static char final_tmp[4096];  // removed if the run fails while writing it
static void remove_final_tmp(void) {
    if (final_tmp[0]) remove_tree(final_tmp);
}

// Copies a whole file, synced; 0 or -1 (errno set).
static int copy_file(const char *src, const char *dst) {
    size_t len;
    char *buf = read_file(src, &len);
    if (!buf) return -1;
    FILE *f = fopen(dst, "wb");
    int ok = f && fwrite(buf, 1, len, f) == len && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (f && fclose(f) != 0 && ok) ok = 0, e = errno;
    free(buf);
    errno = e;
    return ok ? 0 : -1;
}

// The tokenizer files come from tok_dir when there is one (a datasets: run's prepared tokenizer,
// with the config's special tokens, tokens and chat template, as Axolotl saves it), the rest
// from the base model.
static int copy_base_files(const char *base_dir, const char *tok_dir, const char *dir) {
    if (!base_dir || !base_dir[0]) return 0;
    char src[4096], dst[4096];
    for (size_t i = 0; i < sizeof BASE_FILES / sizeof BASE_FILES[0]; i++) {
        int tokenizer_file = strcmp(BASE_FILES[i], "generation_config.json") != 0;
        join_path(src, sizeof src, tok_dir && tokenizer_file ? tok_dir : base_dir, BASE_FILES[i]);
        if (!path_exists(src)) continue;
        join_path(dst, sizeof dst, dir, BASE_FILES[i]);
        if (copy_file(src, dst) != 0) return -1;
    }
    return 0;
}

// "auto" follows the base's weights; a random init is float32.
static const char *st_dtype(const char *save_dtype, const ModelConfig *c) {
    const char *d = strcmp(save_dtype, "auto") ? save_dtype : c->torch_dtype;
    return !strcmp(d, "bfloat16") ? "BF16" : !strcmp(d, "float16") ? "F16" : "F32";
}

static int is_model_file(const char *name) {
    int k, n;
    char tail;
    return !strcmp(name, "model.safetensors") || !strcmp(name, "model.safetensors.index.json") ||
           sscanf(name, "model-%d-of-%d.safetensor%c", &k, &n, &tail) == 3;
}

// The weights of an earlier run in dir that the new files would not replace (a single file
// where shards now go, or shards of another count) would be read together with the new ones.
static void remove_stale_model_files(const char *dir, const char *fresh_dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096], fresh[4096];
    while ((e = readdir(d))) {
        if (!is_model_file(e->d_name)) continue;
        join_path(fresh, sizeof fresh, fresh_dir, e->d_name);
        join_path(path, sizeof path, dir, e->d_name);
        if (!path_exists(fresh) && unlink(path) != 0)
            fail("%s: cannot remove a stale model file: %s", path, strerror(errno));
    }
    closedir(d);
}

// Moves every entry of tmp into dir (a subdirectory replaces its namesake whole).
static void move_into_place(const char *tmp, const char *dir) {
    remove_stale_model_files(dir, tmp);
    DIR *d = opendir(tmp);
    if (!d) fail("%s: cannot read: %s", tmp, strerror(errno));
    struct dirent *e;
    char src[4096], dst[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        join_path(src, sizeof src, tmp, e->d_name);
        join_path(dst, sizeof dst, dir, e->d_name);
        struct stat st;
        if (stat(src, &st) == 0 && S_ISDIR(st.st_mode) && remove_tree(dst) != 0)
            fail("%s: cannot replace: %s", dst, strerror(errno));
        if (rename(src, dst) != 0) fail("%s: cannot move into place: %s", dst, strerror(errno));
    }
    closedir(d);
    if (fsync_dir(dir) != 0) fail("%s: cannot sync output_dir: %s", dir, strerror(errno));
}

void export_final(const Model *m, const Config *cfg, const char *base_dir) {
    const char *output_dir = cfg->output_dir;
    char name[64], merged[4096];
    snprintf(name, sizeof name, ".final.tmp-%d", (int)getpid());
    join_path(final_tmp, sizeof final_tmp, output_dir, name);
    on_fail(remove_final_tmp);
    remove_tree(final_tmp);
    const int lora = m->tab.lora.r > 0;
    char tok[4096];
    join_path(tok, sizeof tok, cfg->prepared_dir, "tokenizer");
    const char *tok_dir = cfg->prepared_dir[0] && path_exists(tok) ? tok : NULL;
    SaveFormat fmt = {st_dtype(cfg->save_dtype, &m->cfg), (uint64_t)cfg->max_shard_size};
    int rc = mkdir_p(final_tmp);
    if (rc == 0 && !lora) rc = save_hf_model(m, final_tmp, 0, &fmt);
    if (rc == 0 && lora) rc = save_adapter(m, final_tmp, cfg->base_model);
    if (rc == 0 && m->cfg.arch != ARCH_GPT2) rc = copy_base_files(base_dir, tok_dir, final_tmp);
    if (rc == 0 && lora && cfg->merge_lora) {  // Axolotl's layout: the merged model apart
        join_path(merged, sizeof merged, final_tmp, "merged");
        rc = mkdir_p(merged);
        if (rc == 0) rc = save_hf_model(m, merged, 1, &fmt);
        if (rc == 0 && m->cfg.arch != ARCH_GPT2) rc = copy_base_files(base_dir, tok_dir, merged);
        if (rc == 0) rc = fsync_dir_files(merged);
    }
    if (rc == 0) rc = fsync_dir_files(final_tmp);
    if (rc != 0) fail("%s: writing the final model failed: %s", output_dir, strerror(errno));
    move_into_place(final_tmp, output_dir);
    remove_tree(final_tmp);
    final_tmp[0] = 0;
}
