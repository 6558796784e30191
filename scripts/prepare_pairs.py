"""Preference pairs for `rl: dpo` / `rl: ipo` / `rl: simpo` / `rl: orpo` runs, for scripts/prepare_data.py (which passes
itself in as `pd`, so that one DataError class and one tokenizer wrapper serve both files).

What a pair becomes follows Axolotl (its prompt_strategies/dpo/*.py turn a record into prompt,
chosen and rejected strings; utils/data/rl.py filters lengths, merges, deduplicates and splits)
and TRL 1.8's DPOTrainer (which tokenizes them): the eos text is appended to a completion that
does not end with it; the prompt is tokenized alone and prompt + completion jointly, both with
the tokenizer's special tokens, and the completion is what follows the prompt's token count; the
row is prompt + completion cut to sequence_len from the start (TRL's keep_start), and only the
completion's tokens are targets. Row 2k holds pair k's chosen completion, row 2k+1 its rejected
one (the paired row format in README's "Prepared datasets"). rl: simpo and rl: orpo tokenize as
TRL's CPOTrainer and ORPOTrainer do instead (tokenize_pair_cpo); orpo's datasets are Axolotl's
chat_template.argilla (ArgillaOrpo).
"""

CHATML = ("<|im_start|>system\n{system}<|im_end|>\n", "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n",
          "<|im_end|>")
LLAMA3 = ("<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>",
          "<|start_header_id|>user<|end_header_id|>\n\n{prompt}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
          "<|eot_id|>")
MARKUP = {"chatml": CHATML, "llama3": LLAMA3}
# Axolotl's functions of chatml.* and llama3.*: where the prompt and the completions are read.
FIRST_OF = object()
FORMS = {
    "default": (FIRST_OF, None),
    "argilla_chat": ("chosen[0]", "turn1"),
    "icr": ("input", None),
    "intel": ("question", None),
    "prompt_pairs": ("prompt", None),
    "ultra": ("prompt", "turn1"),
}
RL_DS_KEYS = {"path", "type", "data_files", "split", "ds_type", "name", "field_messages", "field_chosen",
              "field_rejected", "message_property_mappings", "roles", "chat_template", "chat_template_jinja"}
CHAT_ONLY_KEYS = {"field_messages", "field_chosen", "field_rejected", "message_property_mappings", "roles",
                  "chat_template", "chat_template_jinja"}
USER_DEFINED_KEYS = {"field_prompt", "field_system", "field_chosen", "field_rejected", "prompt_format",
                     "chosen_format", "rejected_format"}


def text_of(pd, rec, name, loc):
    return pd.field(rec, name, loc)


def turn_content(pd, rec, name, k, loc):
    turns = rec.get(name)
    if not isinstance(turns, list) or len(turns) <= k or not isinstance(turns[k], dict) or \
            not isinstance(turns[k].get("content"), str):
        raise pd.DataError("%s: %s[%d].content: missing (expected a list of {role, content} turns)" % (loc, name, k))
    return turns[k]["content"]


class Markup:
    """chatml.* and llama3.*: the prompt as a user turn (after a system turn when the record has a
    non-empty system), each completion followed by the end-of-turn text."""

    def __init__(self, pd, markup, form):
        self.pd, (self.sys, self.user, self.end) = pd, MARKUP[markup]
        self.prompt_key, self.completion = FORMS[form]
        self.form = form

    def __call__(self, rec, loc):
        pd = self.pd
        if self.prompt_key is FIRST_OF:
            pk = next((k for k in ("prompt", "input", "question") if k in rec), "instruction")
            ck = "chosen" if "chosen" in rec else "chosen_response"
            rk = "rejected" if "rejected" in rec else "rejected_response"
            p, c, r = text_of(pd, rec, pk, loc), text_of(pd, rec, ck, loc), text_of(pd, rec, rk, loc)
        elif self.prompt_key == "chosen[0]":
            p = turn_content(pd, rec, "chosen", 0, loc)
            c, r = turn_content(pd, rec, "chosen", 1, loc), turn_content(pd, rec, "rejected", 1, loc)
        else:
            p = text_of(pd, rec, self.prompt_key, loc)
            if self.completion == "turn1":
                c, r = turn_content(pd, rec, "chosen", 1, loc), turn_content(pd, rec, "rejected", 1, loc)
            else:
                c, r = text_of(pd, rec, "chosen", loc), text_of(pd, rec, "rejected", loc)
        system = rec.get("system") if self.form != "argilla_chat" else None
        head = self.sys.format(system=system) if isinstance(system, str) and system else ""
        return head + self.user.format(prompt=p), c + self.end, r + self.end


class UserDefined:
    """A mapping as type: Axolotl's user_defined.default (field_* names, *_format strings)."""

    def __init__(self, pd, spec, t, key):
        self.pd = pd
        for k, v in t.items():
            if k not in USER_DEFINED_KEYS:
                raise pd.DataError("%s.type.%s: not a user_defined key (%s)" % (
                    pd.where_cfg(spec, key), k, ", ".join(sorted(USER_DEFINED_KEYS))))
            if not isinstance(v, str):
                raise pd.DataError("%s.type.%s: expected a string" % (pd.where_cfg(spec, key), k))
        self.f = {k: t.get("field_" + k) or k for k in ("prompt", "system", "chosen", "rejected")}
        self.fmt = {k: t.get(k + "_format") or "{%s}" % k for k in ("prompt", "chosen", "rejected")}
        self.where = pd.where_cfg(spec, key)

    def __call__(self, rec, loc):
        pd, f = self.pd, self.f
        vals = {k: text_of(pd, rec, f[k], loc) for k in ("prompt", "chosen", "rejected")}
        try:
            kw = {"prompt": vals["prompt"]}
            if "{system}" in self.fmt["prompt"]:
                s = rec.get(f["system"])
                kw["system"] = s if isinstance(s, str) else ""
            return (self.fmt["prompt"].format(**kw), self.fmt["chosen"].format(chosen=vals["chosen"]),
                    self.fmt["rejected"].format(rejected=vals["rejected"]))
        except (KeyError, IndexError, ValueError) as e:
            raise pd.DataError("%s.type: a *_format string names a field it is not given: %s" % (self.where, e))


class KtoMarkup:
    """rl: kto's chatml.* and llama3.* (Axolotl's kto/chatml.py and kto/llama3.py): the prompt as a
    user turn, after a system turn when the record has a non-empty system, the completion followed
    by the end-of-turn text, and the record's label (true: desirable). argilla_chat takes the user
    turn and the answer from the completion's two messages."""
    FIELDS = {"argilla": "instruction", "argilla_chat": None, "intel": "question", "prompt_pairs": "prompt",
              "ultra": "prompt"}

    def __init__(self, pd, markup, form):
        self.pd, (self.sys, self.user, self.end) = pd, MARKUP[markup]
        self.form = form

    def __call__(self, rec, loc):
        pd = self.pd
        if self.form == "argilla_chat":
            p, c, system = turn_content(pd, rec, "completion", 0, loc), turn_content(pd, rec, "completion", 1, loc), None
        else:
            p, c, system = text_of(pd, rec, self.FIELDS[self.form], loc), text_of(pd, rec, "completion", loc), rec.get("system")
        label = rec.get("label")
        if not isinstance(label, bool):
            raise pd.DataError("%s: label: %s (expected true for a desirable completion, false for an undesirable one)"
                               % (loc, "missing" if label is None else "not a boolean: %r" % (label,)))
        head = self.sys.format(system=system) if isinstance(system, str) and system else ""
        return head + self.user.format(prompt=p), c + self.end, label


class Passthrough:
    """passthrough: the record's prompt, chosen and rejected strings as they are."""

    def __init__(self, pd):
        self.pd = pd

    def __call__(self, rec, loc):
        return tuple(text_of(self.pd, rec, k, loc) for k in ("prompt", "chosen", "rejected"))


def render_chat(st, msgs, gen, loc):
    """The text of msgs by st's chat template (st.template, st.kwargs, st.tok, st.pd); the
    template's own errors as one line naming the record."""
    try:
        return st.tok.t.apply_chat_template(msgs, chat_template=st.template, tokenize=False,
                                            add_generation_prompt=gen, **st.kwargs)
    except Exception as e:  # noqa: BLE001 - jinja's own errors
        raise st.pd.DataError("%s: chat template failed: %s" % (loc, (str(e).splitlines() or [type(e).__name__])[0]))


class ChatTemplatePairs:
    """chat_template.default: the prompt messages rendered with the generation prompt; each
    completion rendered as an assistant turn after a placeholder user turn, kept from its content
    on and right-stripped (Axolotl's dpo/chat_template.py, with its message_property_mappings and
    roles)."""

    def __init__(self, pd, spec, tok, cfg, ds, key):
        self.pd, self.tok = pd, tok
        self.template = pd.chat_template_of(spec, tok, cfg, ds)
        self.kwargs = cfg.get("chat_template_kwargs") or {}
        self.fm = ds.get("field_messages") or "messages"
        self.fc = ds.get("field_chosen") or "chosen"
        self.fr = ds.get("field_rejected") or "rejected"
        mpm = ds.get("message_property_mappings") or {}
        roles = ds.get("roles") or {"user": ["user"], "assistant": ["assistant"], "system": ["system"], "tool": ["tool"]}
        where = pd.where_cfg(spec, key)
        if not isinstance(mpm, dict) or any(k not in ("role", "content") or not isinstance(v, str) for k, v in mpm.items()):
            raise pd.DataError("%s.message_property_mappings: expected {role: FIELD, content: FIELD}" % where)
        if not isinstance(roles, dict) or not all(isinstance(v, list) for v in roles.values()):
            raise pd.DataError("%s.roles: expected a mapping of role: [names in the data]" % where)
        self.rk, self.ck = mpm.get("role", "role"), mpm.get("content", "content")
        self.role_map = {src: dst for dst, srcs in roles.items() for src in srcs}

    def render(self, msgs, gen, loc):
        return render_chat(self, msgs, gen, loc)

    def turn(self, m, where):
        if not isinstance(m, dict) or not isinstance(m.get(self.rk), str) or not isinstance(m.get(self.ck), str):
            raise self.pd.DataError("%s: expected a mapping with %s and %s strings" % (where, self.rk, self.ck))
        if m[self.rk] not in self.role_map:
            raise self.pd.DataError("%s: role '%s' is not in roles (%s)" % (where, m[self.rk], ", ".join(self.role_map)))
        return {"role": self.role_map[m[self.rk]], "content": m[self.ck]}

    def completion(self, v, name, loc):
        if isinstance(v, str):
            v = {self.rk: "assistant", self.ck: v}
        elif isinstance(v, list) and v:
            v = v[-1]
        return self.turn(v, "%s: %s" % (loc, name))

    def __call__(self, rec, loc):
        pd = self.pd
        msgs = rec.get(self.fm)
        if isinstance(msgs, str):
            msgs = [{self.rk: "user", self.ck: msgs}]
        if not isinstance(msgs, list) or not msgs:
            raise pd.DataError("%s: %s: expected a non-empty list of messages (field_messages)" % (loc, self.fm))
        turns = [self.turn(m, "%s: %s[%d]" % (loc, self.fm, i)) for i, m in enumerate(msgs)]
        out = [self.render(turns, True, loc)]
        for name in (self.fc, self.fr):
            m = self.completion(rec.get(name), name, loc)
            s = self.render([{"role": "user", "content": "[[dummy_message]]"}, m], False, loc)
            out.append(s[s.find(m["content"]):].rstrip())
        return tuple(out)


class ArgillaOrpo:
    """rl: orpo's chat_template.argilla (Axolotl's orpo/chat_template.py, the format of
    argilla/ultrafeedback-binarized-preferences-cleaned): chosen and rejected are conversations of
    user/assistant pairs; the prompt is the record's system (when set), then chosen's turns but its
    last answer (the record's prompt, when given, in place of every user text), rendered by the chat
    template with the generation prompt; each completion is the rendering with its last answer
    appended, less the prompt's length in characters."""

    def __init__(self, pd, spec, tok, cfg, ds):
        self.pd, self.tok = pd, tok
        self.template = pd.chat_template_of(spec, tok, cfg, ds)
        self.kwargs = cfg.get("chat_template_kwargs") or {}

    def render(self, msgs, gen, loc):
        return render_chat(self, msgs, gen, loc)

    def conversation(self, rec, name, loc):
        conv = rec.get(name)
        if not isinstance(conv, list) or not conv or len(conv) % 2 or \
                not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in conv):
            raise self.pd.DataError("%s: %s: expected a conversation of user and assistant messages, an even number "
                                    "of them, each with a content string" % (loc, name))
        return conv

    def __call__(self, rec, loc):
        chosen, rejected = self.conversation(rec, "chosen", loc), self.conversation(rec, "rejected", loc)
        msgs = []
        if rec.get("system"):
            if not isinstance(rec["system"], str):
                raise self.pd.DataError("%s: system: expected a string" % loc)
            msgs.append({"role": "system", "content": rec["system"]})
        if "prompt" in rec and not isinstance(rec["prompt"], str):
            raise self.pd.DataError("%s: prompt: expected a string" % loc)
        turns = len(chosen) // 2
        for i in range(turns):
            msgs.append({"role": "user", "content": rec["prompt"] if "prompt" in rec else chosen[2 * i]["content"]})
            if i < turns - 1:
                msgs.append({"role": "assistant", "content": chosen[2 * i + 1]["content"]})
        prompt = self.render(msgs, True, loc)
        return (prompt,) + tuple(self.render(msgs + [{"role": "assistant", "content": c[-1]["content"]}], False, loc)
                                 [len(prompt):] for c in (chosen, rejected))


class BradleyTerryChat:
    """reward_model's bradley_terry.chat_template (Axolotl's bradley_terry/chat_template.py, the
    format of argilla/distilabel-intel-orca-dpo-pairs): the record's system (when set), its input as
    the user turn and chosen / rejected as the assistant's answer; each conversation rendered by the
    chat template and tokenized whole (apply_chat_template), as its chat_template strategy does.
    Returns (chosen ids, rejected ids), not yet cut to sequence_len."""

    def __init__(self, pd, spec, tok, cfg, ds):
        self.pd = pd
        self.ct = pd.ChatTemplate(tok, cfg, ds, spec=spec)

    def __call__(self, rec, loc):
        pd = self.pd
        system = rec.get("system")
        if system is not None and not isinstance(system, str):
            raise pd.DataError("%s: system: expected a string" % loc)
        for k in ("input", "chosen", "rejected"):
            if not isinstance(rec.get(k), str):
                raise pd.DataError("%s: %s: expected a string (bradley_terry.chat_template reads system, input, "
                                   "chosen and rejected)" % (loc, k))
        keep = system and not self.ct.drop_system  # drop_system_message: as Axolotl's prompter drops it
        head = ([{"role": "system", "content": system}] if keep else []) + [{"role": "user", "content": rec["input"]}]
        try:
            return tuple(self.ct.render(head + [{"role": "assistant", "content": rec[k]}]) for k in ("chosen", "rejected"))
        except pd.DataError as e:
            raise pd.DataError("%s: %s" % (loc, e))


def score_position(ids, pad):
    """Where a sequence classifier reads a row's score (transformers' ...ForSequenceClassification):
    the last token that is not the pad token (its config's pad_token_id, which TRL sets to the
    tokenizer's), 0 when there is none."""
    return max([j for j, x in enumerate(ids) if x != pad] or [0])


def strategy_of(pd, spec, tok, cfg, ds, key):
    t = ds.get("type")
    if cfg.get("reward_model"):  # Axolotl's reward model strategies: bradley_terry.chat_template
        if t != "bradley_terry.chat_template":
            raise pd.DataError("%s.type: reward_model reads type bradley_terry.chat_template (system, input, chosen, "
                               "rejected), not %r" % (pd.where_cfg(spec, key), t))
        for k in ds:
            if k not in ("path", "type", "data_files", "split", "ds_type", "name", "chat_template",
                         "chat_template_jinja", "drop_system_message"):
                raise pd.DataError("%s.%s: not read for bradley_terry.chat_template datasets here (it builds its "
                                   "messages from system, input, chosen and rejected)" % (pd.where_cfg(spec, key), k))
        return BradleyTerryChat(pd, spec, tok, cfg, ds)
    if cfg.get("rl") == "kto":  # Axolotl's kto strategies: chatml.* and llama3.* of five forms
        base, _, form = t.partition(".") if isinstance(t, str) else ("", "", "")
        if base not in MARKUP or form not in KtoMarkup.FIELDS:
            raise pd.DataError("%s.type: rl: kto reads chatml.{%s} or llama3.{...} (Axolotl's KTO formats), not %r"
                               % (pd.where_cfg(spec, key), ", ".join(KtoMarkup.FIELDS), t))
        for k in ds:
            if k not in ("path", "type", "data_files", "split", "ds_type", "name"):
                raise pd.DataError("%s.%s: not read for rl: kto datasets" % (pd.where_cfg(spec, key), k))
        return KtoMarkup(pd, base, form)
    if cfg.get("rl") == "orpo":  # Axolotl's orpo strategies: chat_template.argilla is the one that reads pairs
        if t != "chat_template.argilla":
            raise pd.DataError("%s.type: rl: orpo reads type chat_template.argilla (Axolotl's ORPO format: chosen and "
                               "rejected conversations), not '%s'" % (pd.where_cfg(spec, key), t))
        for k in ds:
            if k not in ("path", "type", "data_files", "split", "ds_type", "name"):  # Axolotl's transform reads the
                raise pd.DataError("%s.%s: not read for rl: orpo datasets (the config's chat_template is)"  # config's
                                   % (pd.where_cfg(spec, key), k))  # chat_template only
        return ArgillaOrpo(pd, spec, tok, cfg, {})
    if isinstance(t, dict):
        return UserDefined(pd, spec, t, key)
    names = "chatml.{%s}, llama3.{...}, chat_template.default, passthrough, or a user_defined mapping" % \
            ", ".join(FORMS)
    if not isinstance(t, str) or not t:
        raise pd.DataError("%s.type: missing (%s)" % (pd.where_cfg(spec, key), names))
    for k in ds:
        if k not in RL_DS_KEYS:
            raise pd.DataError("%s.%s: not read for rl datasets (they take %s)" % (
                pd.where_cfg(spec, key), k, ", ".join(sorted(RL_DS_KEYS))))
    base, _, form = t.partition(".")
    form = form or "default"
    for k in ds:
        if k in CHAT_ONLY_KEYS and base != "chat_template":
            raise pd.DataError("%s.%s: only type chat_template.default reads it" % (pd.where_cfg(spec, key), k))
    if base in MARKUP and form in FORMS:
        return Markup(pd, base, form)
    if base == "chat_template" and form == "default":
        return ChatTemplatePairs(pd, spec, tok, cfg, ds, key)
    if base == "passthrough" and form == "default":
        return Passthrough(pd)
    raise pd.DataError("%s.type: '%s' is not a preference format here (%s)" % (pd.where_cfg(spec, key), t, names))


def plain_len(tok, text):
    return len(tok.encode(text, special=False))


def fits(tok, strings, T):
    """Axolotl's length filter: prompt + each completion, counted without special tokens."""
    p = plain_len(tok, strings[0])
    return p + plain_len(tok, strings[1]) <= T and p + plain_len(tok, strings[2]) <= T, p


def truncated(tok, strings, T, p):
    """excess_length_strategy: truncate, as Axolotl's, of a pair that does not fit (p: its
    prompt's length without special tokens): each completion's tokens (no special tokens) cut to
    what sequence_len leaves after the prompt and decoded back to text; None when the prompt alone
    fills it or the decoded text still does not fit."""
    room = T - p
    if room <= 0:
        return None
    out = [strings[0]]
    for text in strings[1:]:
        ids = tok.encode(text, special=False)
        out.append(tok.t.decode(ids[:room], skip_special_tokens=False) if len(ids) > room else text)
    return tuple(out) if fits(tok, out, T)[0] else None


def tokenize_pair(pd, tok, strings, T):
    """TRL's tokenization of (prompt, chosen, rejected): (ids, labels) for chosen and rejected,
    cut to T tokens from the start."""
    prompt = strings[0]
    eos = tok.t.eos_token
    p_ids = tok.encode(prompt)
    rows = []
    for c in strings[1:]:
        if eos and not c.endswith(eos):
            c = c + eos
        comp = tok.encode(prompt + c)[len(p_ids):]
        rows.append(((p_ids + comp)[:T], ([pd.IGNORE] * len(p_ids) + comp)[:T]))
    return rows


def cpo_answer(tok, prompt, answer):
    """TRL's build_tokenized_answer: prompt + answer tokenized without special tokens; the answer
    starts at the prompt's own token count, one earlier when the joint tokenization merged the
    prompt's last token. Returns (prompt ids, answer ids), both from the joint tokenization."""
    full, alone = tok.encode(prompt + answer, special=False), tok.encode(prompt, special=False)
    start = len(alone) if alone == full[:len(alone)] else len(alone) - 1
    return full[:start], full[start:]


def tokenize_pair_cpo(pd, tok, strings, T, loc):
    """rl: simpo and orpo: TRL's CPOTrainer.tokenize_row (the older tokenization its experimental trainers
    keep): no special tokens from the tokenizer; a BOS id put before a prompt that does not start
    with it, an EOS id after an answer that does not end with it; when prompt + the longer answer
    exceed sequence_len, each answer is cut to sequence_len minus the longer answer's length (TRL's
    own rule, Python slicing included)."""
    prompt, chosen, rejected = strings
    (cp, ca), (rp, ra) = cpo_answer(tok, prompt, chosen), cpo_answer(tok, prompt, rejected)
    if sum(a != b for a, b in zip(cp, rp)) > 1 or abs(len(cp) - len(rp)) > 1:
        raise pd.DataError("%s: the prompt tokenizes differently before the chosen and the rejected completion (TRL "
                           "allows its last token only)" % loc)
    out = []
    for p, a in ((cp, ca), (rp, ra)):
        if tok.bos is not None and (not p or p[0] != tok.bos):
            p = [tok.bos] + p
        if tok.eos is not None and (not a or a[-1] != tok.eos):
            a = a + [tok.eos]
        out.append([p, a])
    longer = max(len(out[0][1]), len(out[1][1]))
    rows = []
    for p, a in out:
        if len(p) + longer > T:
            a = a[:T - longer]
        if len(p) + len(a) > T:
            raise pd.DataError("%s: the prompt (%d tokens) leaves no room in sequence_len %d" % (loc, len(p), T))
        rows.append((p + a, [pd.IGNORE] * len(p) + a))
    return rows


def load_pairs(pd, spec, tok, cfg, entries, key, counts):
    """All pairs of a datasets/test_datasets list, each dataset's long pairs dropped as Axolotl's
    excess_length_strategy says: [(chosen (ids, labels), rejected (ids, labels), 'file:line')]."""
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        raise pd.DataError("%s: expected a list of datasets (path, type, ...)" % pd.where_cfg(spec, key))
    T, how = cfg["sequence_len"], (cfg.get("excess_length_strategy") or "drop")
    kto = cfg.get("rl") == "kto"
    if how not in ("drop", "truncate", "raise"):
        raise pd.DataError("%s: '%s' is not one of drop, truncate, raise" % (pd.where_cfg(spec, "excess_length_strategy"), how))
    out, dropped, first = [], 0, None
    for i, ds in enumerate(entries):
        k = "%s[%d]" % (key, i)
        if not isinstance(ds, dict):
            raise pd.DataError("%s: expected a mapping with path and type" % pd.where_cfg(spec, k))
        strat = strategy_of(pd, spec, tok, cfg, ds, k)
        mine = []
        for f, kind in pd.data_files_of(spec, ds, k):
            for line, rec in pd.apply_split(spec, pd.read_records(f, kind), ds.get("split"), k):
                loc = "%s:%d" % (f, line)
                if not isinstance(rec, dict):
                    raise pd.DataError("%s: expected a JSON object per record" % loc)
                if cfg.get("reward_model"):  # whole conversations, cut to sequence_len (Axolotl's BT strategy)
                    c, r = (ids[:T] for ids in strat(rec, loc))
                    mine.append(((c, score_position(c, tok.pad)), (r, score_position(r, tok.pad)), loc))
                    continue
                strings = strat(rec, loc)
                label = None
                if kto:  # (prompt, completion, label): the length rules below see the completion twice
                    label, strings = strings[2], (strings[0], strings[1], strings[1])
                for what, text in zip(("prompt", "completion", "completion") if kto else ("prompt", "chosen", "rejected"),
                                      strings):
                    if not text:  # Axolotl's length filter raises on an empty one
                        raise pd.DataError("%s: the %s text is empty (Axolotl requires a prompt, a chosen and a "
                                           "rejected text, or for kto a prompt and a completion)" % (loc, what))
                ok, plen = fits(tok, strings, T)
                if not ok and how == "raise":
                    raise pd.DataError("%s: prompt + completion is longer than sequence_len %d (counted without "
                                       "special tokens, as Axolotl does; excess_length_strategy: raise)" % (loc, T))
                if not ok:
                    strings = truncated(tok, strings, T, plen) if how == "truncate" else None
                    if strings is None:
                        dropped += 1
                        first = first or loc
                        continue
                if kto:
                    pc = kto_ids(tok, strings[0], strings[1])
                    if len(pc[0]) >= T:
                        raise pd.DataError("%s: no completion token is left in sequence_len %d to train on" % (loc, T))
                    mine.append((pc, label, loc))
                    continue
                if cfg.get("rl") in ("simpo", "orpo"):  # TRL's CPOTrainer and ORPOTrainer tokenize alike
                    c, r = tokenize_pair_cpo(pd, tok, strings, T, loc)
                else:
                    c, r = tokenize_pair(pd, tok, strings, T)
                for ids, labels in (c, r):
                    if all(x == pd.IGNORE for x in labels[1:]):
                        raise pd.DataError("%s: no completion token is left in sequence_len %d to train on" % (loc, T))
                mine.append((c, r, loc))
        if cfg.get("shuffle_before_merging_datasets"):
            mine = [mine[j] for j in pd.permutation(len(mine), int(spec["seed"]))]
        out += mine
        counts.append({"key": k, "path": ds.get("path"), "type": ds.get("type"), "samples": len(mine)})
    return out, dropped, first


def kto_ids(tok, prompt, completion):
    """TRL's KTOTrainer tokenization: the eos text appended to a completion that lacks it; the prompt
    tokenized with the tokenizer's special tokens, prompt + completion jointly; the completion is
    what follows the prompt's count. Returns (prompt ids, completion ids)."""
    eos = tok.t.eos_token
    if eos and not completion.endswith(eos):
        completion = completion + eos
    p = tok.encode(prompt)
    return p, tok.encode(prompt + completion)[len(p):]


def kto_rows(pd, examples, B, T):
    """rl: kto's rows: per example its sequence, then its KL sequence (the prompt with the
    completion of the example before it in its batch of B, the batch's first taking the last's:
    TRL's KL dataset, batches of per_device_train_batch_size in order), each cut to T from the
    start with targets on the completion; and the labels (1: desirable)."""
    rows, labels = [], []
    for b0 in range(0, len(examples), B):
        group = examples[b0:b0 + B]
        kl = [group[-1][0][1]] + [g[0][1] for g in group[:-1]]
        for ((p, c), label, loc), k in zip(group, kl):
            for comp in (c, k):
                rows.append(((p + comp)[:T], ([pd.IGNORE] * len(p) + comp)[:T], loc))
            labels.append(1 if label else 0)
    return rows, labels


def write_labels(path, labels):
    """labels.bin beside the rows: 256 int32 header (magic 20241202, version 1, count), then the
    labels as int32 (1 desirable, 0 undesirable), one per example (two rows)."""
    from array import array
    head = array("i", [20241202, 1, len(labels)] + [0] * 253)
    body = array("i", labels)
    with open(path, "wb") as f:
        head.tofile(f)
        body.tofile(f)


def rows_of(pairs):
    """The flat sample list write_rows takes: chosen then rejected for each pair."""
    out = []
    for c, r, loc in pairs:
        out.append((c[0], c[1], loc))
        out.append((r[0], r[1], loc))
    return out


def prepare(pd, spec, cfg, tok, out_dir, h):
    """prepare_data.prepare for an rl run: train.bin (and eval.bin) of paired rows; the meta."""
    import os
    T, seed = cfg["sequence_len"], int(spec["seed"])
    rl = "reward" if cfg.get("reward_model") else cfg.get("rl")
    if cfg.get("sample_packing") or cfg.get("eval_sample_packing"):
        if rl == "reward":
            raise pd.DataError("%s: sample_packing does not work with reward_model: each row is one sequence whose "
                               "last token gives its score" % pd.where_cfg(spec, "sample_packing"))
        raise pd.DataError("%s: sample_packing does not work with rl: %s (Axolotl refuses it too): each pair's "
                           "completions are one sample a row" % (pd.where_cfg(spec, "sample_packing"), rl))
    if cfg.get("pretraining_dataset"):
        raise pd.DataError("%s: rl: %s trains on preference pairs from datasets:, not pretraining_dataset"
                           % (pd.where_cfg(spec, "pretraining_dataset"), rl))
    if pd.shard_on(cfg):
        print("note: dataset_shard_num has no effect with rl (as in Axolotl, whose preference datasets are not sharded)")
    counts = []
    train, dropped, first = load_pairs(pd, spec, tok, cfg, cfg.get("datasets"), "datasets", counts)
    evals, edrop, efirst = load_pairs(pd, spec, tok, cfg, cfg["test_datasets"], "test_datasets", counts) \
        if cfg.get("test_datasets") else ([], 0, None)
    if rl == "kto":
        pd.check_ids(spec, tok, ((p + c, loc) for (p, c), label, loc in train + evals))
    else:
        pd.check_ids(spec, tok, ((row[0], loc) for c, r, loc in train + evals for row in (c, r)))
    # Axolotl's order for preference data: each dataset filtered, the merge shuffled by seed,
    # deduplication, then the validation split off the end.
    if cfg.get("shuffle_merged_datasets", True) is not False:
        train = [train[j] for j in pd.permutation(len(train), seed)]
        evals = [evals[j] for j in pd.permutation(len(evals), seed)]
    dups = 0
    if cfg.get("dataset_exact_deduplication"):
        key_of = (lambda p: (tuple(p[0][0]), tuple(p[0][1]), p[1])) if rl == "kto" else \
            (lambda p: (tuple(p[0][0]), tuple(p[1][0])))  # noqa: E731 - both completions' tokens (kto: the example)
        train, d1 = pd.dedup(train, key_of)
        evals, d2 = pd.dedup(evals, key_of)
        dups = d1 + d2
    train, evals = pd.split_val(spec, cfg, train, evals, "pairs")
    if not train:
        raise pd.DataError("%s: no training pairs left (%d longer than sequence_len %d)" % (
            pd.where_cfg(spec, "datasets"), dropped, T))
    os.makedirs(out_dir, exist_ok=True)
    pd.save_tokenizer(spec, tok, cfg, out_dir)
    flags = pd.ROWS_FLAG_PAIRED
    if rl == "kto":
        B = int(spec.get("kto_batch") or 0)
        if B < 2:
            raise pd.DataError("%s: rl: kto needs micro_batch_size 2 or more (TRL refuses 1: the KL term would be the "
                               "reward itself)" % pd.where_cfg(spec, "micro_batch_size"))
        tr, tl = kto_rows(pd, train, B, T)
        ev, el = kto_rows(pd, evals, B, T)
        write_labels(os.path.join(out_dir, "train_labels.bin"), tl)
        if evals:
            write_labels(os.path.join(out_dir, "eval_labels.bin"), el)
    else:
        tr, ev = rows_of(train), rows_of(evals)
    marks = {}
    if rl == "reward":  # each row's one target marks where its score is read
        flags |= pd.ROWS_FLAG_SCORED
        marks = {"train": [r[1] for r in tr], "eval": [r[1] for r in ev]}
        tr = [(r[0], None, r[2]) for r in tr]
        ev = [(r[0], None, r[2]) for r in ev]
    tr_rows, tr_tgt, _ = pd.write_rows(os.path.join(out_dir, "train.bin"), tr, T, False, tok.pad, flags=flags,
                                       marks=marks.get("train"))
    ev_rows = ev_tgt = 0
    if evals:
        ev_rows, ev_tgt, _ = pd.write_rows(os.path.join(out_dir, "eval.bin"), ev, T, False, tok.pad, flags=flags,
                                           marks=marks.get("eval"))
    if dups:
        print("data: dataset_exact_deduplication removed %d duplicate pairs" % dups)
    if dropped + edrop:
        print("data: dropped %d pairs longer than sequence_len %d (the first: %s); excess_length_strategy: truncate "
              "cuts their completions instead" % (dropped + edrop, T, first or efirst))
    return {"format_version": pd.FORMAT_VERSION, "hash": h, "train_rows": tr_rows, "eval_rows": ev_rows,
            "train_samples": len(train), "eval_samples": len(evals), "train_target_tokens": tr_tgt,
            "eval_target_tokens": ev_tgt, "dropped_long": dropped + edrop, "duplicates_removed": dups,
            "dataset_shard": None, "first_dropped": first or efirst, "sequence_len": T, "packed": False,
            "eval_packed": False, "paired": True, "rl": rl, "kto_batch": spec.get("kto_batch") if rl == "kto" else None, "tokenizer_dir": spec["tokenizer_dir"],
            "pad_token_id": tok.pad, "datasets": counts, "needs_embeddings": tok.needs_embeddings}
