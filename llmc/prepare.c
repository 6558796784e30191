// prepare.c: see prepare.h.
#include "prepare.h"
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "hfcache.h"
#include "util.h"

// ---- YAML -> JSON

static int is_word(const char *s, const char *const *words, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s, words[i])) return 1;
    return 0;
}

// A plain scalar typed as PyYAML (YAML 1.1) types it, which is what Axolotl reads: null,
// booleans (yes/no/on/off too), integers and floats (with '_' separators), else a string.
static cJSON *plain_scalar(const char *s) {
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL"};
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
    static const char *const no[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
    if (is_word(s, nulls, 5)) return cJSON_CreateNull();
    if (is_word(s, yes, 9)) return cJSON_CreateTrue();
    if (is_word(s, no, 9)) return cJSON_CreateFalse();
    // [-+]? digits [. digits] [e [-+] digits], '_' allowed between digits
    char num[128];
    size_t n = 0, i = 0;
    int digits = 0, ok = strlen(s) < sizeof num;
    if (ok && (s[i] == '-' || s[i] == '+')) num[n++] = s[i++];
    for (; ok && s[i]; i++) {
        char ch = s[i];
        if (ch >= '0' && ch <= '9') num[n++] = ch, digits++;
        else if (ch == '_' && i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9' && s[i + 1] >= '0' && s[i + 1] <= '9') continue;
        else if (ch == '.' || ch == 'e' || ch == 'E' || ((ch == '-' || ch == '+') && (s[i - 1] == 'e' || s[i - 1] == 'E')))
            num[n++] = ch;
        else ok = 0;
    }
    if (ok && digits) {
        num[n] = 0;
        char *end;
        errno = 0;
        double v = strtod(num, &end);
        if (!*end && !errno && isfinite(v)) return cJSON_CreateNumber(v);
    }
    return cJSON_CreateString(s);
}

static long json_values;  // values made by this conversion: aliases must not expand without bound

static cJSON *to_json(yaml_document_t *doc, yaml_node_t *node, const char *path, int depth) {
    if (depth > 64) fail("%s:%zu: nesting deeper than 64 levels", path, node->start_mark.line + 1);
    if (++json_values > 1000000)
        fail("%s:%zu: the config expands to more than a million values (aliases of aliases?)", path,
             node->start_mark.line + 1);
    if (node->type == YAML_SCALAR_NODE) {
        const char *s = (const char *)node->data.scalar.value;
        return node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? plain_scalar(s) : cJSON_CreateString(s);
    }
    if (node->type == YAML_SEQUENCE_NODE) {
        cJSON *a = cJSON_CreateArray();
        for (yaml_node_item_t *it = node->data.sequence.items.start; it < node->data.sequence.items.top; it++)
            cJSON_AddItemToArray(a, to_json(doc, yaml_document_get_node(doc, *it), path, depth + 1));
        return a;
    }
    cJSON *o = cJSON_CreateObject();
    if (node->type != YAML_MAPPING_NODE) return o;
    for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key), *v = yaml_document_get_node(doc, p->value);
        if (k->type != YAML_SCALAR_NODE) fail("%s:%zu: keys must be plain names", path, k->start_mark.line + 1);
        const char *name = (const char *)k->data.scalar.value;
        if (cJSON_GetObjectItemCaseSensitive(o, name))
            fail("%s:%zu: key '%s' appears twice", path, k->start_mark.line + 1, name);
        cJSON_AddItemToObject(o, name, to_json(doc, v, path, depth + 1));
    }
    return o;
}

void *prepare_yaml_to_json(yaml_document_t *doc, yaml_node_t *node, const char *path) {
    json_values = 0;
    return to_json(doc, node, path, 0);
}

void prepare_json_set(Config *cfg, const char *key, const char *value) {
    if (!cfg->yaml_json) cfg->yaml_json = cJSON_CreateObject();
    cJSON *o = cfg->yaml_json;
    cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    cJSON_AddItemToObject(o, key, plain_scalar(value));
}

static const cJSON *item(const Config *cfg, const char *key) {
    return cfg->yaml_json ? cJSON_GetObjectItemCaseSensitive((const cJSON *)cfg->yaml_json, key) : NULL;
}

// A value that asks for something: not null, false, "" or an empty list/mapping.
static int present(const cJSON *v) {
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if (cJSON_IsString(v)) return v->valuestring[0] != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    return 1;
}

int prepare_wants_data(const Config *cfg) {
    return present(item(cfg, "datasets")) || present(item(cfg, "pretraining_dataset"));
}

// ---- the tokenizer

// The files that make a directory a tokenizer's (any one of them).
static const char *const TOKENIZER_FILES[] = {"tokenizer.json", "tokenizer_config.json", "tokenizer.model", NULL};

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

void prepare_resolve_tokenizer(Config *cfg) {
    const char *src = cfg->path[0] ? cfg->path : "config";
    const cJSON *tc = item(cfg, "tokenizer_config");
    char dir[2048], why[4096];
    const char *key;
    if (present(tc)) {
        key = "tokenizer_config";
        if (!cJSON_IsString(tc)) fail("%s: tokenizer_config expects a directory or a hub id", src);
        const char *v = tc->valuestring;
        if (is_dir(v)) snprintf(dir, sizeof dir, "%s", v);
        else if (!path_exists(v) && hf_is_hub_id(v)) {
            // a tokenizer-only repository has no config.json: the snapshot needs tokenizer files
            if (hf_resolve_files(v, cfg->revision_of_model, TOKENIZER_FILES, "tokenizer files (tokenizer.json, "
                                 "tokenizer_config.json or tokenizer.model)", dir, sizeof dir, why, sizeof why))
                fail("%s: tokenizer_config: %s", src, why);
        } else {
            fail("%s: tokenizer_config: '%s' is not a directory (a Hugging Face tokenizer directory or hub id)", src, v);
        }
    } else if (cfg->base_model[0]) {
        key = "base_model";
        if (!is_dir(cfg->base_model))
            fail("%s: datasets: need a tokenizer, and base_model '%s' is not a Hugging Face directory; set "
                 "tokenizer_config (a tokenizer directory or hub id)", src, cfg->base_model);
        snprintf(dir, sizeof dir, "%s", cfg->base_model);
    } else {
        fail("%s: datasets: need a tokenizer: set tokenizer_config (a Hugging Face tokenizer directory or hub "
             "id) or base_model (a model directory with its tokenizer)", src);
    }
    if (!hf_dir_holds_any(dir, TOKENIZER_FILES))
        fail("%s: %s: %s has no tokenizer (tokenizer.json, tokenizer_config.json or tokenizer.model); set "
             "tokenizer_config to a directory that has one", src, key, dir);
    char abs[PATH_MAX];
    if (!realpath(dir, abs)) fail("%s: %s: %s: %s", src, key, dir, strerror(errno));
    size_t n = strlen(abs);
    if (n >= sizeof cfg->tokenizer_dir) fail("%s: %s: path too long", src, key);
    memcpy(cfg->tokenizer_dir, abs, n + 1);
}

// ---- running the script

// scripts/prepare_data.py: $LLMC_SCRIPTS_DIR, else the repository above the binary (binaries
// live at the repository root and in build directories below it).
static void find_script(char *out, size_t cap) {
    const char *d = getenv("LLMC_SCRIPTS_DIR");
    if (d && *d) {
        join_path(out, cap, d, "prepare_data.py");
        if (!path_exists(out)) fail("$LLMC_SCRIPTS_DIR is %s, which has no prepare_data.py", d);
        return;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) fail("cannot find this program's path (/proc/self/exe) to find scripts/prepare_data.py; set "
                     "$LLMC_SCRIPTS_DIR to the repository's scripts directory");
    exe[n] = 0;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", exe);
    for (int up = 0; up < 4; up++) {
        char *slash = strrchr(dir, '/');
        if (!slash) break;
        *slash = 0;
        snprintf(out, cap, "%s/scripts/prepare_data.py", dir[0] ? dir : "");
        if (path_exists(out)) return;
    }
    fail("cannot find scripts/prepare_data.py in the directories above %s; set $LLMC_SCRIPTS_DIR to the "
         "repository's scripts directory", exe);
}

static char tmp_dir[PATH_MAX], tmp_spec[PATH_MAX + 16], tmp_result[PATH_MAX + 16];

static void remove_tmp(void) {
    if (!tmp_dir[0]) return;
    unlink(tmp_spec);
    unlink(tmp_result);
    rmdir(tmp_dir);
    tmp_dir[0] = 0;
}

static void abs_path(char *out, size_t cap, const char *p) {
    if (p[0] == '/') {
        snprintf(out, cap, "%s", p);
        return;
    }
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) fail("cannot read the current directory: %s", strerror(errno));
    if ((size_t)snprintf(out, cap, "%s/%s", cwd, p) >= cap) fail("%s/%s: path too long", cwd, p);
}

static cJSON *make_spec(const Config *cfg, int vocab) {
    const char *src = cfg->path[0] ? cfg->path : "config";
    char cpath[PATH_MAX], cdir[PATH_MAX], root[PATH_MAX + 64];
    if (!cfg->path[0] || !realpath(cfg->path, cpath)) abs_path(cpath, sizeof cpath, cfg->path[0] ? cfg->path : ".");
    snprintf(cdir, sizeof cdir, "%s", cpath);
    char *slash = strrchr(cdir, '/');
    if (slash && slash != cdir) *slash = 0;
    const cJSON *pp = item(cfg, "dataset_prepared_path");
    if (present(pp) && !cJSON_IsString(pp))
        fail("%s: dataset_prepared_path expects a directory", src);
    abs_path(root, sizeof root, present(pp) ? pp->valuestring : "last_run_prepared");
    cJSON *s = cJSON_CreateObject();
    cJSON_AddNumberToObject(s, "spec_version", 1);
    cJSON_AddStringToObject(s, "config_path", cpath);
    cJSON_AddStringToObject(s, "config_dir", cdir);
    cJSON_AddStringToObject(s, "tokenizer_dir", cfg->tokenizer_dir);
    cJSON_AddNumberToObject(s, "sequence_len", cfg->sequence_len);
    cJSON_AddNumberToObject(s, "seed", (double)cfg->seed);
    cJSON_AddStringToObject(s, "prepared_root", root);
    cJSON_AddNumberToObject(s, "vocab_size", vocab);
    cJSON_AddStringToObject(s, "adapter", cfg->adapter);
    cJSON_AddStringToObject(s, "lora_modules_to_save", cfg->lora_modules_to_save);
    cJSON_AddItemToObject(s, "config", cJSON_Duplicate((const cJSON *)cfg->yaml_json, 1));
    // rl: kto's KL sequences take completions from the same batch of micro_batch_size examples (a
    // rank's; micro_batch_size counts rows by now, two an example)
    if (!strcmp(cfg->rl, "kto")) cJSON_AddNumberToObject(s, "kto_batch", cfg->micro_batch_size / 2);
    return s;
}

// Runs the script; returns its exit status (0: the directory is in out).
static void run_script(const Config *cfg, int vocab, char *out, size_t cap) {
    char script[PATH_MAX + 32];
    find_script(script, sizeof script);
    const char *py = getenv("LLMC_PYTHON");
    if (!py || !*py) py = "python3";
    const char *tmp = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/llmc-prepare-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(tmp_dir)) {
        int e = errno;
        tmp_dir[0] = 0;
        fail("cannot create a temporary directory for the data spec: %s", strerror(e));
    }
    on_fail(remove_tmp);
    snprintf(tmp_spec, sizeof tmp_spec, "%s/spec.json", tmp_dir);
    snprintf(tmp_result, sizeof tmp_result, "%s/result.txt", tmp_dir);
    cJSON *spec = make_spec(cfg, vocab);
    char *text = cJSON_Print(spec);
    cJSON_Delete(spec);
    FILE *f = text ? fopen(tmp_spec, "w") : NULL;
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) fail("%s: cannot write the data spec: %s", tmp_spec, strerror(errno));
    free(text);
    char *argv[] = {(char *)py, script, "--spec", tmp_spec, "--result", tmp_result, NULL};
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) fail("cannot start %s: fork: %s", script, strerror(errno));
    if (pid == 0) {
        // The hub libraries must never reach for the network (they retry for ~20 s per file).
        setenv("HF_HUB_OFFLINE", "1", 1);
        setenv("TRANSFORMERS_OFFLINE", "1", 1);
        setenv("HF_DATASETS_OFFLINE", "1", 1);
        setenv("TRANSFORMERS_VERBOSITY", "error", 0);  // not its advice about missing frameworks
        execvp(py, argv);
        dprintf(2, "error: cannot run %s: %s (set $LLMC_PYTHON to a Python 3 with the packages of "
                   "scripts/install_deps.sh)\n", py, strerror(errno));
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) fail("waiting for %s: %s", script, strerror(errno));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        remove_tmp();
        fflush(stdout);
        if (WIFEXITED(st))
            fprintf(stderr, "error: data preparation failed (%s exited with status %d)\n", script, code);
        else
            fprintf(stderr, "error: data preparation failed (%s was killed by %s)\n", script, strsignal(WTERMSIG(st)));
        fflush(stderr);
        exit(code);
    }
    size_t len;
    char *res = read_file(tmp_result, &len);
    if (!res) fail("%s exited 0 but wrote no result file (%s)", script, tmp_result);
    size_t n = strcspn(res, "\r\n");
    res[n] = 0;
    char train[PATH_MAX + 16];
    snprintf(train, sizeof train, "%s/train.bin", res);
    if (res[0] != '/' || n >= cap || !path_exists(train))
        fail("%s reported the prepared directory '%s', which has no train.bin", script, res);
    snprintf(out, cap, "%s", res);
    free(res);
    remove_tmp();
}

void prepare_data(Config *cfg, int vocab, Comm *comm) {
    char dir[sizeof cfg->prepared_dir] = "";
    // The other ranks wait while rank 0 tokenizes, which for a large dataset takes far longer
    // than a collective: unless a limit was given, as long as torch.distributed's default
    // (1800 s, what Axolotl's ranks wait for its preprocessing) instead of the 300 s default.
    const double limit = comm->timeout_s;
    if (!cfg->ddp_timeout && !getenv("LLMC_COMM_TIMEOUT") && comm->timeout_s < 1800) comm->timeout_s = 1800;
    if (comm->rank == 0) run_script(cfg, vocab, dir, sizeof dir);
    comm->broadcast(comm, dir, sizeof dir, 0);
    comm->timeout_s = limit;
    snprintf(cfg->prepared_dir, sizeof cfg->prepared_dir, "%s", dir);
}
