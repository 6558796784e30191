// config_rules.h: the Axolotl keys that are not in config.c's key table (a note, a refusal, or
// a datasets-pipeline key each), Axolotl's other names for table keys, and the value tests
// both use.
#pragma once
#include <stddef.h>

// 1 if key has a rule or is an alias.
int rules_known(const char *key);
// The table key an alias stands for, else key.
const char *rules_alias(const char *key);
// The names of the rules then the aliases, i = 0, 1, ...; NULL past the last (suggestions).
const char *rules_name_at(size_t i);
// Applies key's rule to value (the scalar as written, or NULL for a list/mapping, nonempty
// saying whether it has items): a note, an error naming origin, or a datasets-pipeline key
// recorded for rules_check_data_keys. A value that does nothing is accepted silently.
// Returns 0 when key has no rule.
int rules_apply(const char *key, const char *value, int nonempty, const char *origin);
// One entry of Axolotl's plugins list ("axolotl.integrations.liger.LigerPlugin"): a note for
// the kernel swaps and the trackers, an error naming origin for a plugin that would change
// what is trained (a loss, an optimizer, what is frozen) or that is not known here.
void rules_plugin(const char *name, const char *origin);
// Forgets the recorded datasets-pipeline keys (a new config).
void rules_reset(void);
// A run that reads train_data shards: each recorded datasets-pipeline key is a note or an
// error (which of the two is the rule's).
void rules_check_data_keys(void);
// A value that does nothing: null/empty, false, 0 (NULL: an empty list or mapping).
int value_harmless(const char *v);
// v is one of "a|b|c".
int value_in_choices(const char *choices, const char *v);
