// freeze.h: Axolotl's unfrozen_parameters. In a full fine-tune only the parameters whose
// Hugging Face name matches one of the patterns train; the rest stay frozen (no gradient, no
// optimizer state, no weight decay), as Axolotl's freeze_layers_except sets requires_grad.
// A pattern matches as Python's re.match does (anchored at the start, not at the end), after
// Axolotl's rewrite of every '.' not followed by '+' into a literal dot. Patterns are POSIX
// extended regexes here: Python-only syntax (\d, \w, \s, \b, (?...), lazy quantifiers) is
// refused by name. A pattern may end in Axolotl's row range ("name$[0:32000]", "[5]", "[:8]",
// "[8:]"): a tensor it matches trains, but when some of the patterns that match it carry
// ranges, only the rows inside their union do; the others get a zero gradient (Axolotl zeroes
// them in a gradient hook), so they take no share of the norm and AdamW only decays them.
#pragma once
#include <regex.h>
#include <stdint.h>

typedef struct {
    int64_t start, end;  // rows [start, end); end -1: to the last row
} RowRange;

typedef struct {
    int n;
    regex_t *re;
    RowRange *range;  // per pattern; start -1: no range
    char **text;      // per pattern, as written (for messages)
} Unfrozen;

// At most this many separate row ranges train in one tensor.
enum { UNFROZEN_MAX_RANGES = 8 };

// patterns: newline-separated (a YAML list); src names the config in errors.
void unfrozen_compile(Unfrozen *u, const char *patterns, const char *src);
// 1 if the Hugging Face parameter name matches some pattern.
int unfrozen_match(const Unfrozen *u, const char *name);
// The rows of tensor `name` (rows: its first dimension, a vector's length) that train, when the
// patterns matching it carry ranges: their union, merged and sorted, into keep (at most
// UNFROZEN_MAX_RANGES); returns how many, 0 when the whole tensor trains (or none matched).
// Fails, naming src, on a range outside the tensor, as Axolotl raises.
int unfrozen_rows(const Unfrozen *u, const char *name, int64_t rows, RowRange *keep, const char *src);
void unfrozen_free(Unfrozen *u);
