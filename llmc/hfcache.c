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

int hf_resolve(const char *id, const char *revision, char *out, size_t cap, char *why, size_t why_cap) {
    char cache[2048], repo[3072], ref[4096], rev[256] = "", snaps[4096];
    hf_cache_dir(cache, sizeof cache);
    const char *slash = strchr(id, '/');
    snprintf(repo, sizeof repo, "%s/models--%.*s--%s", cache, (int)(slash - id), id, slash + 1);
    const char *want = revision && *revision ? revision : "main";
    snprintf(ref, sizeof ref, "%s/refs/%s", repo, want);
    snprintf(snaps, sizeof snaps, "%s/snapshots", repo);
    size_t len;
    char *text = read_file(ref, &len);
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
    char snap[4608], cfgjson[4700];
    snprintf(snap, sizeof snap, "%s/%s", snaps, rev);
    snprintf(cfgjson, sizeof cfgjson, "%s/config.json", snap);
    if (rev[0] && !strchr(rev, '/') && path_exists(cfgjson)) {
        snprintf(out, cap, "%s", snap);
        return 0;
    }
    if (revision && *revision && !has_ref) {
        snprintf(why, why_cap,
                 "'%s' at revision '%s' is not in the Hugging Face cache (no %s and no %s with config.json); this "
                 "program never downloads: run `huggingface-cli download %s --revision %s` first, or give a local "
                 "model directory", id, revision, ref, snap, id, revision);
        return -1;
    }
    snprintf(why, why_cap,
             "'%s' is not a local directory and is not in the Hugging Face cache (looked for %s%s%s "
             "with config.json; the cache is $HF_HUB_CACHE, else $HF_HOME/hub, else "
             "~/.cache/huggingface/hub); this program never downloads: run "
             "`huggingface-cli download %s%s%s` first, or give a local model directory",
             id, rev[0] ? snap : ref, rev[0] ? "" : " -> snapshots/", rev[0] ? "" : "",
             id, revision && *revision ? " --revision " : "", revision && *revision ? revision : "");
    return -1;
}
