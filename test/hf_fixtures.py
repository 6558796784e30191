"""Small Hugging Face fixtures for the data tests: byte-level BPE tokenizers shaped like the
families' (special tokens, BOS rule, chat template), tiny random models, a local hub cache
(models--org--name/refs/main -> snapshots/<rev>/), and small datasets in Axolotl's formats.

Everything is made here from scratch; nothing is downloaded. The chat templates are written for
these tests (the same turn layout as the families' published templates).
"""
import json
import os

import numpy as np

import llama_ref as R

WORDS = ("the a one two three four five red blue green cat dog bird tree house river city book song "
         "runs sings reads writes sees finds makes gives takes quick slow small large old new happy sad "
         "answer question explain list name write story short poem tell me about why how what when where "
         "is are was were be do does not and or but with for from to of in on at by").split()

# family kind: special tokens (first: the ones the template needs), bos, eos, pad, template
KINDS = {
    # Llama 3: <|begin_of_text|> added in front; turns end with <|eot_id|>; eos <|end_of_text|>.
    "llama3": {
        "specials": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                     "<|eot_id|>"],
        "bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "pad": None,
        "template": ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
                     "'<|end_header_id|>\n\n' + (m['content'] | trim) + '<|eot_id|>' }}{% endfor %}"
                     "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
                     "{% endif %}"),
    },
    # Llama 2 / Mistral: <s> in front, </s> at the end; no chat template.
    "llama2": {"specials": ["<unk>", "<s>", "</s>"], "bos": "<s>", "eos": "</s>", "pad": None, "unk": "<unk>",
               "template": None},
    # Qwen2.5 base: no BOS; eos and pad <|endoftext|>; chatml turns end with <|im_end|>.
    "qwen2": {"specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "bos": None, "eos": "<|endoftext|>",
              "pad": "<|endoftext|>",
              "template": ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
                           "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
                           "{{ '<|im_start|>assistant\n' }}{% endif %}")},
    # Gemma 3: <bos> in front, eos <eos>, pad <pad>; turns <start_of_turn> .. <end_of_turn>. No
    # template of its own here: tests name chat_template: gemma3, as Axolotl's examples do.
    "gemma3": {"specials": ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], "bos": "<bos>",
               "eos": "<eos>", "pad": "<pad>", "template": None},
}
# Phi-3 (mini instruct): <s> in front, eos <|endoftext|>; turns tagged <|system|>, <|user|>,
# <|assistant|>, each closed by <|end|>. No template here: tests name chat_template: phi_3.
KINDS["phi3"] = {"specials": ["<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"],
                 "bos": "<s>", "eos": "<|endoftext|>", "pad": "<|endoftext|>", "unk": "<unk>", "template": None}
KINDS["gemma2"] = KINDS["gemma3"]  # Gemma 2's tokenizer has the same special tokens (chat_template: gemma)
KINDS["gemma"] = KINDS["gemma3"]  # and Gemma 1's


def corpus():
    rng = np.random.default_rng(0)
    out = []
    for _ in range(400):
        n = int(rng.integers(3, 12))
        out.append(" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=n)) + ".")
    out += ["### Instruction:\n", "### Input:\n", "### Response:\n", "Below is an instruction that describes a "
            "task, paired with an input that provides further context. Write a response that appropriately "
            "completes the request.", "user\n\n", "assistant\n\n", "system\n"] * 20
    return out


def make_tokenizer(d, kind="llama3", vocab_size=1000):
    """A byte-level BPE tokenizer in Hugging Face layout in d; returns its size (ids 0..n-1)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    k = KINDS[kind]
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=k["specials"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator(corpus(), trainer)
    if k["bos"]:
        bid = t.token_to_id(k["bos"])
        t.post_processor = processors.TemplateProcessing(single="%s $A" % k["bos"], pair="%s $A %s $B" % (
            k["bos"], k["bos"]), special_tokens=[(k["bos"], bid)])
    else:
        t.post_processor = processors.ByteLevel(trim_offsets=False)
    os.makedirs(d, exist_ok=True)
    t.save(os.path.join(d, "tokenizer.json"))
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": k["bos"], "eos_token": k["eos"],
          "pad_token": k["pad"], "model_max_length": 131072, "clean_up_tokenization_spaces": False}
    if k.get("unk"):
        tc["unk_token"] = k["unk"]
    if k["template"]:
        tc["chat_template"] = k["template"]
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=1)
    return t.get_vocab_size()


def hub_dir(hf_home, repo_id, rev="0123456789abcdef0123456789abcdef01234567"):
    """models--org--name/snapshots/<rev> under $HF_HOME/hub, with refs/main naming rev."""
    org, name = repo_id.split("/")
    repo = os.path.join(hf_home, "hub", "models--%s--%s" % (org, name))
    snap = os.path.join(repo, "snapshots", rev)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(rev)
    return snap


FAMILY_OF = {"llama3": "llama", "llama2": "mistral", "qwen2": "qwen2", "gemma": "gemma", "gemma2": "gemma2",
             "gemma3": "gemma3_text", "phi3": "phi3"}


def make_model(d, kind="llama3", vocab_size=1024, seed=0, multimodal=False, family=None, **shape):
    """A tiny random model of the kind's family (or family: a model_type) with its tokenizer, in d
    (HF layout); multimodal (gemma3): as Gemma3ForConditionalGeneration files (the 4B/12B/27B
    checkpoints)."""
    n = make_tokenizer(d, kind)
    assert n <= vocab_size, (n, vocab_size)
    mt = family or FAMILY_OF[kind]
    extra = {}
    if mt == "mistral":
        extra["sliding_window"] = 4096
    if mt == "qwen2":
        extra.update(attention_bias=True, use_sliding_window=False, sliding_window=4096, max_window_layers=2)
    if mt == "phi3":
        extra["pad_token_id"] = 3  # <|endoftext|> in the phi3 tokenizer (Phi3Config's default 32000 is past this vocab)
    if mt == "gemma3_text":
        extra.update(head_dim=16, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                     query_pre_attn_scalar=16, sliding_window=512, sliding_window_pattern=2, pad_token_id=0)
    if mt == "gemma2":  # the hub configs' caps (Gemma2Config's defaults)
        extra.update(head_dim=16, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                     query_pre_attn_scalar=16, sliding_window=512, attn_logit_softcapping=50.0,
                     final_logit_softcapping=30.0, pad_token_id=0, tie_word_embeddings=True)
    if mt == "gemma":  # as the hub's Gemma 1 configs: the legacy hidden_act beside hidden_activation
        extra.update(head_dim=16, hidden_act="gelu", hidden_activation="gelu_pytorch_tanh", pad_token_id=0,
                     tie_word_embeddings=True)
    dims = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=8192)
    dims.update(shape)
    cfg = R.make_config(vocab_size=vocab_size, model_type=mt, **dims, **extra)
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    k = KINDS[kind]
    cfg["bos_token_id"] = tk.token_to_id(k["bos"]) if k["bos"] else None
    cfg["eos_token_id"] = tk.token_to_id(k["eos"])
    w = R.init_weights(cfg, seed=seed)
    if multimodal:
        return R.save_hf_dir_gemma3_multimodal(d, dict(cfg, rope_theta=1000000.0, rms_norm_eps=1e-6), w), w
    R.save_hf_dir(d, cfg, w)
    return cfg, w


def sentence(rng, lo, hi):
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=int(rng.integers(lo, hi + 1))))


def alpaca_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"instruction": sentence(rng, 3, 8), "input": sentence(rng, 2, 6) if i % 3 else "",
             "output": sentence(rng, 3, 10)} for i in range(n)]


def text_rows(n, seed=0, lo=5, hi=60):
    rng = np.random.default_rng(seed)
    return [{"text": sentence(rng, lo, hi)} for _ in range(n)]


def sharegpt_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        conv = [{"from": "system", "value": "you are a " + sentence(rng, 1, 3)}] if i % 2 else []
        for _ in range(int(rng.integers(1, 3))):
            conv += [{"from": "human", "value": sentence(rng, 2, 7)}, {"from": "gpt", "value": sentence(rng, 2, 9)}]
        out.append({"conversations": conv})
    return out


def messages_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        msgs = [{"role": "system", "content": "be " + sentence(rng, 1, 2)}] if i % 3 == 0 else []
        for _ in range(int(rng.integers(1, 3))):
            msgs += [{"role": "user", "content": sentence(rng, 2, 6)},
                     {"role": "assistant", "content": sentence(rng, 2, 8)}]
        out.append({"messages": msgs})
    return out


def preference_rows(n, seed=0):
    """Preference pairs in the shape of Axolotl's DPO examples: a conversation (system, user), a
    chosen and a rejected assistant turn."""
    rng = np.random.default_rng(seed)
    return [{"conversation": [{"role": "system", "content": "You answer briefly."},
                              {"role": "user", "content": sentence(rng, 4, 12)}],
             "chosen": {"role": "assistant", "content": sentence(rng, 3, 15)},
             "rejected": {"role": "assistant", "content": sentence(rng, 3, 15)}} for _ in range(n)]


def bradley_terry_rows(n, seed=0):
    """Reward-model pairs in the shape of argilla/distilabel-intel-orca-dpo-pairs (Axolotl's
    bradley_terry.chat_template): a system prompt (empty in some), an input, a chosen and a
    rejected answer, and fields the strategy does not read (a rating pair, a status)."""
    rng = np.random.default_rng(seed)
    return [{"system": "" if i % 3 else "You are an AI assistant. " + sentence(rng, 2, 6), "input": sentence(rng, 4, 12),
             "chosen": sentence(rng, 3, 15), "rejected": sentence(rng, 3, 15), "rating": [9.0, 6.5],
             "status": "tie" if i % 7 == 0 else "unchanged"} for i in range(n)]


def stepwise_rows(n, seed=0):
    """Process-supervision records in the shape of trl-lib/math_shepherd (Axolotl's
    stepwise_supervised): a prompt, the solution's steps and a boolean label per step."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(2, 6))
        out.append({"prompt": sentence(rng, 5, 12) + "?", "completions": ["Step %d: " % (j + 1) + sentence(rng, 3, 9)
                                                                          for j in range(k)],
                    "labels": [bool(rng.integers(0, 4)) for _ in range(k)]})
    return out


def argilla_rows(n, seed=0):
    """Preference records in the shape of argilla/ultrafeedback-binarized-preferences-cleaned
    (Axolotl's chat_template.argilla, for rl: orpo): the prompt, and chosen and rejected
    conversations of a user turn and an assistant turn."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        q = sentence(rng, 4, 12)
        out.append({"prompt": q, "chosen": [{"role": "user", "content": q}, {"role": "assistant", "content": sentence(rng, 3, 15)}],
                    "rejected": [{"role": "user", "content": q}, {"role": "assistant", "content": sentence(rng, 3, 15)}]})
    return out


def kto_rows(n, seed=0):
    """Unpaired, labelled records in the shape of argilla/ultrafeedback-binarized-preferences-cleaned-kto
    (Axolotl's llama3.ultra for rl: kto): prompt, completion, label (a mix), some with a system."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        r = {"prompt": sentence(rng, 4, 12), "completion": sentence(rng, 3, 15), "label": bool(i % 3)}
        if i % 4 == 0:
            r["system"] = sentence(rng, 2, 5)
        out.append(r)
    return out


def write_jsonl(path, rows):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
