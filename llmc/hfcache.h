// hfcache.h: a Hugging Face hub id (ORG/NAME) resolved in the local hub cache, never the network.
// The cache is $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub; a model lives in models--ORG--NAME/, refs/REVISION holds the commit
// of a branch or tag and snapshots/COMMIT/ the files (symlinks into blobs/).
#pragma once
#include <stddef.h>

// True for a string shaped like a hub id: ORG/NAME, one slash, no leading '/', '.', '~'.
int hf_is_hub_id(const char *s);
// The hub cache directory the rules above pick.
void hf_cache_dir(char *out, size_t cap);
// Resolves id at revision (NULL or "": main) to its snapshot directory. 0 on success; otherwise
// -1 with a one-line reason (where it looked, how to download) in why.
int hf_resolve(const char *id, const char *revision, char *out, size_t cap, char *why, size_t why_cap);
// True when dir holds one of the files named in need (NULL-terminated).
int hf_dir_holds_any(const char *dir, const char *const *need);
// The same for a snapshot that holds any of the files in need (NULL-terminated; `what` names
// them in the reason): refs/REVISION's commit, else the revision as a commit, else (no
// revision, no refs/main: a cache copied by hand) the only snapshot there is.
int hf_resolve_files(const char *id, const char *revision, const char *const *need, const char *what, char *out,
                     size_t cap, char *why, size_t why_cap);
