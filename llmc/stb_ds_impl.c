// The one translation unit that holds stb_ds's implementation. Its growth goes through a
// checked realloc, so an absurd size ends in a clear error instead of a NULL dereference.
#include <stdlib.h>
#include "util.h"
static void *checked_realloc(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q && n) fail("out of host memory growing a table to %zu bytes", n);
    return q;
}
#define STBDS_REALLOC(c, p, n) checked_realloc(p, n)
#define STBDS_FREE(c, p) free(p)
#define STB_DS_IMPLEMENTATION
#include "stb_ds.h"
