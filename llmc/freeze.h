// freeze.h: Axolotl's unfrozen_parameters. In a full fine-tune only the parameters whose
// Hugging Face name matches one of the patterns train; the rest stay frozen (no gradient, no
// optimizer state, no weight decay), as Axolotl's freeze_layers_except sets requires_grad.
// A pattern matches as Python's re.match does (anchored at the start, not at the end), after
// Axolotl's rewrite of every '.' not followed by '+' into a literal dot. Patterns are POSIX
// extended regexes here: Python-only syntax (\d, \w, \s, \b, (?...), lazy quantifiers) and
// Axolotl's row ranges ("name$[0:32000]": freezing part of a tensor) are refused by name.
#pragma once
#include <regex.h>

typedef struct {
    int n;
    regex_t *re;
} Unfrozen;

// patterns: newline-separated (a YAML list); src names the config in errors.
void unfrozen_compile(Unfrozen *u, const char *patterns, const char *src);
// 1 if the Hugging Face parameter name matches some pattern.
int unfrozen_match(const Unfrozen *u, const char *name);
void unfrozen_free(Unfrozen *u);
