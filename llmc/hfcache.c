// hfcache.c: see hfcache.h.
#include "hfcache.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"

int hf_is_hub_id(const char *s) {
    if (!s || !*s || strchr("/.~", s[0])) return 0;
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || !slash[1] || strchr(slash + 1, '/')) return 0;
    for (const char *p = s; *p; p++)
        if (!(p == slash || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (*p >= '0' && *p <= '9') || strchr("-_.", *p)))
            return 0;
    return 1;
}

void hf_cache_dir(char *out, size_t cap) {
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v) snprintf(out, cap, "%s", v);
    else if ((v = getenv("HF_HOME")) && *v) snprintf(out, cap, "%s/hub", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v) snprintf(out, cap, "%s/huggingface/hub", v);
    else snprintf(out, cap, "%s/.cache/huggingface/hub", (v = getenv("HOME")) && *v ? v : ".");
}

// The single snapshot of a repo without refs/ (a cache copied by hand), or "".
static void only_snapshot(const char *snaps, char *rev, size_t cap) {
    rev[0] = 0;
    DIR *d = opendir(snaps);
    if (!d) return;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.' && n++ == 0) snprintf(rev, cap, "%s", e->d_name);
    closedir(d);
    if (n != 1) rev[0] = 0;
}

int hf_dir_holds_any(const char *dir, const char *const *need) {
    for (; *need; need++) {
        char p[4096];
        join_path(p, sizeof p, dir, *need);
        if (path_exists(p)) return 1;
    }
    return 0;
}

// A snapshot name that stays inside snapshots/: no '/', not "." or "..".
static int snapshot_name_ok(const char *rev) {
    return rev[0] && !strchr(rev, '/') && strcmp(rev, ".") && strcmp(rev, "..");
}

int hf_resolve_files(const char *id, const char *revision, const char *const *need, const char *what, char *out,
                     size_t cap, char *why, size_t why_cap) {
    char cache[2048], repo[3072], ref[4096], rev[256] = "", snaps[4096];
    hf_cache_dir(cache, sizeof cache);
    const char *slash = strchr(id, '/');
    snprintf(repo, sizeof repo, "%s/models--%.*s--%s", cache, (int)(slash - id), id, slash + 1);
    const char *want = revision && *revision ? revision : "main";
    snprintf(ref, sizeof ref, "%s/refs/%s", repo, want);
    snprintf(snaps, sizeof snaps, "%s/snapshots", repo);
    // refs/REVISION names the commit of a branch or tag (refs/pr/1 too: a nested path); a
    // revision with ".." in it is not looked up (config.c refuses one for base_model).
    char *text = strstr(want, "..") ? NULL : read_file(ref, NULL);
    const int has_ref = text != NULL;
    if (text) {
        size_t n = strcspn(text, " \t\r\n");
        snprintf(rev, sizeof rev, "%.*s", (int)(n < sizeof rev ? n : sizeof rev - 1), text);
        free(text);
    } else if (revision && *revision) {
        snprintf(rev, sizeof rev, "%s", revision);  // a commit hash names its snapshot directly
    } else {
        only_snapshot(snaps, rev, sizeof rev);
    }
    char snap[4608];
    snprintf(snap, sizeof snap, "%s/%s", snaps, rev);
    if (snapshot_name_ok(rev) && hf_dir_holds_any(snap, need)) {
        if ((size_t)snprintf(out, cap, "%s", snap) < cap) return 0;
        snprintf(why, why_cap, "'%s': the cache path %s is longer than %zu bytes", id, snap, cap - 1);
        return -1;
    }
    if (revision && *revision && !has_ref) {
        snprintf(why, why_cap,
                 "'%s' at revision '%s' is not in the Hugging Face cache (no %s and no %s with %s); this "
                 "program never downloads: run `huggingface-cli download %s --revision %s` first, or give a local "
                 "directory", id, revision, ref, snap, what, id, revision);
        return -1;
    }
    snprintf(why, why_cap,
             "'%s' is not a local directory and is not in the Hugging Face cache (looked for %s%s "
             "with %s; the cache is $HF_HUB_CACHE, else $HF_HOME/hub, else "
             "~/.cache/huggingface/hub); this program never downloads: run "
             "`huggingface-cli download %s%s%s` first, or give a local directory",
             id, rev[0] ? snap : ref, rev[0] ? "" : " -> snapshots/", what,
             id, revision && *revision ? " --revision " : "", revision && *revision ? revision : "");
    return -1;
}

int hf_resolve(const char *id, const char *revision, char *out, size_t cap, char *why, size_t why_cap) {
    static const char *const need[] = {"config.json", NULL};
    return hf_resolve_files(id, revision, need, "config.json", out, cap, why, why_cap);
}
