// json.c: see json.h.
#include "json.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"

static int line_of(const char *text, const char *at) {
    int line = 1;
    for (const char *p = text; p < at; p++) line += *p == '\n';
    return line;
}

// "\u0000" inside a string: cJSON decodes it into a NUL that silently cuts the string short.
static const char *find_nul_escape(const char *text, size_t len) {
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (!in_str) {
            in_str = c == '"';
        } else if (c == '"') {
            in_str = 0;
        } else if (c == '\\' && i + 1 < len) {
            if (text[i + 1] == 'u' && i + 5 < len && !memcmp(text + i + 2, "0000", 4))
                return text + i;
            i++;  // the escaped character cannot end the string
        }
    }
    return NULL;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// The first key that appears twice in any object of the tree, or NULL. Sorting the keys of
// each object keeps this O(n log n) for headers with a hundred thousand tensors.
static const char *find_duplicate_key(const cJSON *node, const char **owner) {
    if (cJSON_IsObject(node)) {
        int n = 0;
        for (const cJSON *c = node->child; c; c = c->next) n++;
        if (n > 1) {
            const char **keys = xmalloc(sizeof *keys * (size_t)n);
            int k = 0;
            for (const cJSON *c = node->child; c; c = c->next) keys[k++] = c->string;
            qsort(keys, (size_t)n, sizeof *keys, cmp_str_ptr);
            const char *dup = NULL;
            for (int i = 1; i < n && !dup; i++)
                if (!strcmp(keys[i - 1], keys[i])) dup = keys[i];
            free(keys);
            if (dup) {
                *owner = node->string;
                return dup;
            }
        }
    }
    if (cJSON_IsObject(node) || cJSON_IsArray(node))
        for (const cJSON *c = node->child; c; c = c->next) {
            const char *dup = find_duplicate_key(c, owner);
            if (dup) return dup;
        }
    return NULL;
}

cJSON *json_parse_strict(const char *text, size_t len, char *why, size_t cap) {
    const char *nul = find_nul_escape(text, len);
    if (nul) {
        snprintf(why, cap, "a string holds a NUL character (\\u0000) at line %d", line_of(text, nul));
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        snprintf(why, cap, "not valid JSON (line %d)", end ? line_of(text, end) : 1);
        return NULL;
    }
    for (const char *p = end; p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            snprintf(why, cap, "trailing data after the JSON document (line %d)", line_of(text, p));
            cJSON_Delete(root);
            return NULL;
        }
    const char *owner = NULL, *dup = find_duplicate_key(root, &owner);
    if (dup) {
        if (owner) snprintf(why, cap, "key '%s' appears twice in '%s'", dup, owner);
        else snprintf(why, cap, "key '%s' appears twice", dup);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

cJSON *json_read_file(const char *path) {
    size_t len;
    char *text = read_file(path, &len);
    if (!text) fail("%s: cannot read: %s", path, strerror(errno));
    char why[512];
    cJSON *root = json_parse_strict(text, len, why, sizeof why);
    free(text);
    if (!root) fail("%s: %s", path, why);
    return root;
}
