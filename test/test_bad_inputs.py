#!/usr/bin/python3
"""Bad-input tests for train_llama: every malformed config, shard, model directory or
checkpoint must be refused cleanly.

For each case the trainer must
  * exit non-zero, by exit() and not by a signal, within the time limit (no hang);
  * write exactly one line to stderr, starting with "error: ", that names the culprit
    (the file, key, value or tensor the case breaks);
  * not crash: no sanitizer report, no "Segmentation fault";
  * leave no half-written output: every checkpoint-N directory holds all of
    model.safetensors, config.json, optimizer.safetensors and trainer_state.json, no
    temporary checkpoint/final-model directory is left behind, and a final model in
    output_dir is either complete (model.safetensors + config.json) or absent.

Usage (from the repository root):
    /usr/bin/python3 test/test_bad_inputs.py --bin ./train_llama
    /usr/bin/python3 test/test_bad_inputs.py --bin build-asan/train_llama
Everything is created in a temporary directory; nothing in the repository is touched.
Prints "PASS <case>" or "FAIL <case>: detail" per case and "N passed, M failed" last;
exits 1 if any case failed.
"""
import argparse
import concurrent.futures
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

TIMEOUT_S = 20
SHARD_MAGIC = 20240520
CKPT_FILES = ("model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json")
CRASH_MARKERS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer",
                 "runtime error", "Segmentation fault", "core dumped", "Aborted",
                 "stack smashing", "double free", "free(): ", "malloc(): ")

# The tiny random-init model every case starts from.
MODEL = {
    "vocab_size": "256",
    "hidden_size": "16",
    "intermediate_size": "32",
    "num_hidden_layers": "1",
    "num_attention_heads": "2",
    "max_position_embeddings": "64",
}


# ---------------------------------------------------------------------------------------
# Builders: token shards, YAML configs, safetensors files.

def write_shard(path, tokens, version=1, magic=SHARD_MAGIC, ntok=None, truncate_to=None):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if ntok is None else ntok
    body = struct.pack("<%d%s" % (len(tokens), "H" if version == 1 else "I"), *tokens)
    data = struct.pack("<256i", *header) + body
    if truncate_to is not None:
        data = data[:truncate_to]
    with open(path, "wb") as f:
        f.write(data)


def yaml_text(cfg):
    """cfg: dict of key -> str (written as is) or dict (a nested block, e.g. model:)."""
    lines = []
    for k, v in cfg.items():
        if isinstance(v, dict):
            lines.append("%s:" % k)
            lines += ["  %s: %s" % (k2, v2) for k2, v2 in v.items()]
        else:
            lines.append("%s: %s" % (k, v))
    return "\n".join(lines) + "\n"


def st_read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + hlen]), raw[8 + hlen:]


def st_write(path, header, data, raw_header=None, hlen=None):
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h) if hlen is None else hlen) + h + data)


# ---------------------------------------------------------------------------------------
# Running and checking.

class Limits:
    """Resource limits for one run. Set in a preexec_fn, so such cases run after the thread
    pool is done (a fork from a threaded parent may deadlock in Python code)."""
    def __init__(self, mem_mb=None, fsize=None):
        self.mem_mb, self.fsize = mem_mb, fsize


class Env:
    def __init__(self, binary, root):
        self.bin = binary
        self.root = root
        with open(binary, "rb") as f:
            # Sanitizer builds reserve terabytes of address space: no RLIMIT_AS for them.
            self.asan = b"__asan_init" in f.read()
        self.proc_env = dict(os.environ)
        # Error paths exit() with memory still held: that is not a leak worth reporting.
        self.proc_env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
        self.proc_env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
        self.proc_env["OMP_NUM_THREADS"] = "1"
        self.proc_env["OPENBLAS_NUM_THREADS"] = "1"

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def run(self, args, cwd, limits=None):
        env, pre = self.proc_env, None
        if limits:
            env = dict(env)
            if limits.mem_mb and self.asan:
                env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + \
                    ":hard_rss_limit_mb=%d" % limits.mem_mb

            def pre():
                if limits.mem_mb and not self.asan:
                    n = limits.mem_mb << 20
                    resource.setrlimit(resource.RLIMIT_AS, (n, n))
                if limits.fsize:
                    # A write past the limit then fails with EFBIG, like a full disk.
                    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.fsize, limits.fsize))
        try:
            p = subprocess.run([self.bin] + args, cwd=cwd, env=env, preexec_fn=pre,
                               stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=TIMEOUT_S, start_new_session=True)
            return p.returncode, p.stdout.decode("utf-8", "replace"), \
                p.stderr.decode("utf-8", "replace")
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode("utf-8", "replace") if e.stderr else ""
            return None, "", err


def output_problems(out_dir):
    """Half-written output under a case's output_dir (inputs the case broke on purpose,
    such as a checkpoint without its optimizer file, live outside it)."""
    bad = []
    for dirpath, dirnames, filenames in os.walk(out_dir):
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if re.fullmatch(r"checkpoint-\d+", d):
                missing = [f for f in CKPT_FILES if not os.path.isfile(os.path.join(full, f))]
                if missing:
                    bad.append("%s lacks %s" % (full, ", ".join(missing)))
            if re.fullmatch(r"\.(checkpoint-\d+|final)\.tmp-\d+", d):
                bad.append("temporary directory left behind: %s" % full)
        if "metrics.jsonl" in filenames:  # an output_dir: a final model must be whole
            have = [f for f in ("model.safetensors", "config.json") if f in filenames]
            if len(have) == 1:
                bad.append("%s has only %s of the final model" % (dirpath, have[0]))
    return bad


def check_error(rc, stderr, culprits, case_dir):
    """'' if the run is a clean refusal naming every culprit, else what is wrong."""
    if rc is None:
        return "hung: no exit within %d s" % TIMEOUT_S
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = str(-rc)
        return "killed by signal %s" % name
    if rc == 0:
        return "exit code 0, expected an error"
    crash = [m for m in CRASH_MARKERS if m in stderr]
    if crash:
        return "crash report (%s) in stderr" % ", ".join(crash)
    lines = [l for l in stderr.splitlines() if l.strip()]
    if len(lines) != 1:
        return "expected one stderr line, got %d" % len(lines)
    if not lines[0].startswith("error: "):
        return "stderr line does not start with 'error: '"
    # Each culprit must appear; a tuple means any one of its strings will do.
    missing = [c for c in culprits
               if not any(x in lines[0] for x in (c if isinstance(c, tuple) else (c,)))]
    if missing:
        return "error line does not name %s" % " and ".join(
            " or ".join(repr(x) for x in (c if isinstance(c, tuple) else (c,))) for c in missing)
    half = output_problems(os.path.join(case_dir, "out"))
    if half:
        return "half-written output: " + "; ".join(half)
    return ""


# ---------------------------------------------------------------------------------------
# Cases. Each is (name, setup): setup(env, case_dir) writes what the case needs under
# case_dir (the run's cwd; its output_dir is case_dir/out) and returns (argv, culprits) or
# (argv, culprits, Limits). Cases with Limits must be listed in LIMITED.

def base_cfg(env, case_dir, **over):
    cfg = {"model": dict(MODEL), "train_data": env.path("train.bin"), "sequence_len": "8",
           "micro_batch_size": "2", "max_steps": "1", "num_threads": "1",
           "output_dir": os.path.join(case_dir, "out")}
    cfg.update(over)
    return cfg


def cfg_file(case_dir, cfg, name="cfg.yaml"):
    p = os.path.join(case_dir, name)
    with open(p, "w") as f:
        f.write(cfg if isinstance(cfg, str) else yaml_text(cfg))
    return p


def with_model(**changes):
    m = dict(MODEL)
    for k, v in changes.items():
        if v is None:
            m.pop(k, None)
        else:
            m[k] = v
    return m


def yaml_case(culprits, **over):
    """A config that is the working one with some keys replaced (None: dropped)."""
    def setup(env, d):
        cfg = base_cfg(env, d)
        for k, v in over.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        return ["-c", cfg_file(d, cfg)], culprits
    return setup


def raw_yaml_case(text_fn, culprits_fn, name="cfg.yaml"):
    def setup(env, d):
        p = cfg_file(d, text_fn(env, d), name)
        return ["-c", p], culprits_fn(p)
    return setup


def cli_case(argv_fn, culprits):
    def setup(env, d):
        return argv_fn(env, d), culprits
    return setup


def good_args(env, d, *extra):
    return ["-c", cfg_file(d, base_cfg(env, d))] + list(extra)


def shard_case(shard_kwargs, culprits_fn, key="train_data", extra=None):
    def setup(env, d):
        p = os.path.join(d, "shard.bin")
        write_shard(p, **shard_kwargs)
        cfg = base_cfg(env, d, **{key: p})
        cfg.update(extra or {})
        return ["-c", cfg_file(d, cfg)], culprits_fn(p)
    return setup


def hf_case(mutate, culprits_fn, **over):
    """A copy of the valid model directory, changed by mutate(model_dir)."""
    def setup(env, d):
        mdir = os.path.join(d, "hf_model")
        shutil.copytree(env.path("hf_model"), mdir)
        mutate(mdir)
        cfg = base_cfg(env, d, base_model=mdir)
        del cfg["model"]
        cfg.update(over)
        return ["-c", cfg_file(d, cfg)], culprits_fn(mdir)
    return setup


def edit_config_json(fn):
    def mutate(mdir):
        p = os.path.join(mdir, "config.json")
        with open(p) as f:
            c = json.load(f)
        fn(c)
        with open(p, "w") as f:
            json.dump(c, f)
    return mutate


def edit_tensors(fn):
    """fn(header) edits the parsed safetensors header in place."""
    def mutate(mdir):
        p = os.path.join(mdir, "model.safetensors")
        h, data = st_read(p)
        fn(h)
        st_write(p, h, data)
    return mutate


def write_raw(name, content):
    def mutate(mdir):
        with open(os.path.join(mdir, name), "wb") as f:
            f.write(content)
    return mutate


def header_too_long(mdir):
    p = os.path.join(mdir, "model.safetensors")
    h, data = st_read(p)
    st_write(p, h, data, hlen=os.path.getsize(p) + 1000)


def header_not_json(mdir):
    p = os.path.join(mdir, "model.safetensors")
    _, data = st_read(p)
    st_write(p, None, data, raw_header=b"this is not json {")


def set_entry(tensor, **kv):
    def fn(h):
        h[tensor].update(kv)
    return fn


def offsets_out_of_range(h):
    end = max(e["data_offsets"][1] for k, e in h.items() if k != "__metadata__")
    h["model.norm.weight"]["data_offsets"] = [end + 64, end + 128]


def drop_tensor(mdir):
    """model.norm.weight removed whole: header entry and bytes (a valid file without it)."""
    p = os.path.join(mdir, "model.safetensors")
    h, data = st_read(p)
    b, e = h.pop("model.norm.weight")["data_offsets"]
    for k, ent in h.items():
        if k != "__metadata__" and ent["data_offsets"][0] >= e:
            ent["data_offsets"] = [x - (e - b) for x in ent["data_offsets"]]
    st_write(p, h, data[:b] + data[e:])


def sharded_missing(mdir):
    h, _ = st_read(os.path.join(mdir, "model.safetensors"))
    os.remove(os.path.join(mdir, "model.safetensors"))
    names = [k for k in h if k != "__metadata__"]
    wm = {n: "model-0000%d-of-00002.safetensors" % (1 + i % 2) for i, n in enumerate(names)}
    with open(os.path.join(mdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)


def raw_header_edit(fn):
    """fn(header_text, data) -> (header_text, data): edits the raw JSON header and data."""
    def mutate(mdir):
        p = os.path.join(mdir, "model.safetensors")
        h, data = st_read(p)
        text, data = fn(json.dumps(h), data)
        st_write(p, None, data, raw_header=text.encode())
    return mutate


def duplicate_metadata(text, data):
    return '{"__metadata__": {"a": "b"}, ' + text[1:], data


def duplicate_tensor(text, data):
    h = json.loads(text)
    entry = json.dumps(h["model.norm.weight"])
    return text[:-1] + ', "model.norm.weight": ' + entry + "}", data


def overlapping_offsets(h):
    """The last tensor in the data points at an earlier tensor of the same size."""
    ents = sorted((e["data_offsets"], k) for k, e in h.items() if k != "__metadata__")
    (lb, le), last = ents[-1]
    twin = next(k for (b, e), k in ents[:-1] if e - b == le - lb)
    h[last]["data_offsets"] = list(h[twin]["data_offsets"])


def hole_at_start(text, data):
    h = json.loads(text)
    for k, e in h.items():
        if k != "__metadata__":
            e["data_offsets"] = [e["data_offsets"][0] + 8, e["data_offsets"][1] + 8]
    return json.dumps(h), b"\0" * 8 + data


def nul_in_name(text, data):
    return text.replace('"model.norm.weight"', '"model.norm.weight\\u0000x"'), data


def edit_config_text(fn):
    def mutate(mdir):
        p = os.path.join(mdir, "config.json")
        with open(p) as f:
            t = f.read()
        with open(p, "w") as f:
            f.write(fn(t))
    return mutate


def config_set_raw(key, raw):
    """Replaces key's value in config.json by a raw JSON token (e.g. 1e999)."""
    def fn(t):
        c = json.loads(t)
        c[key] = "@@"
        return json.dumps(c).replace('"@@"', raw)
    return fn


def nan_weight(mdir):
    p = os.path.join(mdir, "model.safetensors")
    h, data = st_read(p)
    b = h["model.norm.weight"]["data_offsets"][0]
    data = data[:b + 4] + struct.pack("<f", float("nan")) + data[b + 8:]
    st_write(p, h, data)


def sharded_duplicate_key(mdir):
    h, _ = st_read(os.path.join(mdir, "model.safetensors"))
    names = [k for k in h if k != "__metadata__"]
    wm = ", ".join('"%s": "model.safetensors"' % n for n in names)
    with open(os.path.join(mdir, "model.safetensors.index.json"), "w") as f:
        f.write('{"weight_map": {%s, "%s": "model.safetensors"}}' % (wm, names[0]))
    os.rename(os.path.join(mdir, "model.safetensors"), os.path.join(mdir, "shard.safetensors"))
    with open(os.path.join(mdir, "model.safetensors.index.json")) as f:
        t = f.read().replace('"model.safetensors"', '"shard.safetensors"')
    with open(os.path.join(mdir, "model.safetensors.index.json"), "w") as f:
        f.write(t)


def state_text(fn):
    def mutate(ck):
        p = os.path.join(ck, "trainer_state.json")
        with open(p) as f:
            t = f.read()
        with open(p, "w") as f:
            f.write(fn(t))
    return mutate


def adapter_dup_key(env, d):
    a = os.path.join(d, "adapter")
    os.makedirs(a)
    with open(os.path.join(a, "adapter_config.json"), "w") as f:
        f.write('{"peft_type": "LORA", "r": 2, "lora_alpha": 4, "r": 8, '
                '"target_modules": ["q_proj", "v_proj"]}')
    cfg = base_cfg(env, d, adapter="lora", lora_r="2", lora_alpha="4",
                   lora_target_modules="[q_proj, v_proj]", lora_model_dir=a)
    return ["-c", cfg_file(d, cfg)], [os.path.join(a, "adapter_config.json"), "'r'"]


def resume_case(mutate, culprits_fn):
    """Resume from a copy of the valid run's checkpoint-1, changed by mutate(ckpt_dir)."""
    def setup(env, d):
        ck = os.path.join(d, "ckpt", "checkpoint-1")
        shutil.copytree(env.path("good_out", "checkpoint-1"), ck)
        mutate(ck)
        cfg = base_cfg(env, d, resume_from_checkpoint=ck, max_steps="2")
        return ["-c", cfg_file(d, cfg)], culprits_fn(ck)
    return setup


def corrupt_state(ck):
    with open(os.path.join(ck, "trainer_state.json"), "w") as f:
        f.write('{"step": 1, "data_epoch": ')


def fifo_shard(env, d):
    p = os.path.join(d, "shard.fifo")
    os.mkfifo(p)
    return ["-c", cfg_file(d, base_cfg(env, d, train_data=p))], [p]


def fifo_safetensors(mdir):
    os.remove(os.path.join(mdir, "model.safetensors"))
    os.mkfifo(os.path.join(mdir, "model.safetensors"))


def too_many_layers(env, d):
    # ~1.3e10 parameters. Building the parameter table alone exhausts memory, so the run is
    # capped (2 GiB address space, or the sanitizer's RSS limit) to stay harmless.
    cfg = base_cfg(env, d, model=with_model(num_hidden_layers="5000000"))
    return ["-c", cfg_file(d, cfg)], [("num_hidden_layers", "5000000", "parameters", "memory")], \
        Limits(mem_mb=2048 if not env.asan else 1500)


def disk_full(env, d):
    # Files are capped at 30 KB: metrics.jsonl fits, the 44 KB model.safetensors does not,
    # so the first checkpoint fails midway and must leave nothing half-written behind.
    return ["-c", cfg_file(d, base_cfg(env, d))], ["checkpoint-1"], Limits(fsize=30000)


def output_is_file(env, d):
    f = os.path.join(d, "file.txt")
    with open(f, "w") as fh:
        fh.write("a regular file\n")
    return ["-c", cfg_file(d, base_cfg(env, d, output_dir=f))], ["file.txt"]


def not_writable(env, d):
    f = os.path.join(d, "file.txt")
    with open(f, "w") as fh:
        fh.write("a regular file\n")
    return ["-c", cfg_file(d, base_cfg(env, d, output_dir=os.path.join(f, "out")))], ["file.txt"]


CASES = [
    # ---- command line
    ("cli_no_config", cli_case(lambda e, d: [], ["-c"])),
    ("cli_config_missing", cli_case(lambda e, d: ["-c", os.path.join(d, "nope.yaml")], ["nope.yaml"])),
    ("cli_unknown_flag", cli_case(lambda e, d: good_args(e, d, "--frobnicate"), ["--frobnicate"])),
    ("cli_set_without_equals", cli_case(lambda e, d: good_args(e, d, "--set", "learning_rate"),
                                        ["learning_rate"])),
    ("cli_set_unknown_key", cli_case(lambda e, d: good_args(e, d, "--set", "learnig_rate=0.1"),
                                     ["learnig_rate", "learning_rate"])),
    ("cli_set_no_argument", cli_case(lambda e, d: good_args(e, d, "--set"), ["--set"])),
    ("cli_config_is_directory", cli_case(lambda e, d: ["-c", d], [])),
    ("cli_set_bad_value", cli_case(lambda e, d: good_args(e, d, "--set", "max_steps=ten"),
                                   ["max_steps", "ten"])),
    # ---- YAML
    ("yaml_syntax", raw_yaml_case(
        lambda e, d: "max_steps: 1\nlearning_rate: 3e-4: 5\n", lambda p: [p + ":2"], "bad_syntax.yaml")),
    ("yaml_top_level_list", raw_yaml_case(lambda e, d: "- max_steps\n- 1\n", lambda p: [p])),
    ("yaml_rope_scaling_dynamic", raw_yaml_case(
        lambda e, d: yaml_text(base_cfg(e, d)) + "rope_scaling:\n  rope_type: dynamic\n  factor: 2.0\n",
        lambda p: [p, "dynamic"])),
    ("yaml_rope_scaling_list", raw_yaml_case(
        lambda e, d: yaml_text(base_cfg(e, d)) + "rope_scaling:\n  rope_type: yarn\n  factor: [1, 2]\n",
        lambda p: [p, "rope_scaling.factor", "single values"])),
    ("yaml_rope_scaling_scalar", raw_yaml_case(
        lambda e, d: yaml_text(base_cfg(e, d)) + "rope_scaling: yarn\n", lambda p: [p, "rope_scaling", "mapping"])),
    ("yaml_empty_file", raw_yaml_case(lambda e, d: "", lambda p: ["base_model"])),
    ("yaml_unknown_key_suggests", yaml_case(["learnig_rate", "learning_rate"], learnig_rate="1e-3")),
    ("yaml_unknown_model_key_suggests", yaml_case(
        ["hidden_sise", "hidden_size"], model=with_model(hidden_sise="16"))),
    ("yaml_learning_rate_abc", yaml_case(["learning_rate", "abc"], learning_rate="abc")),
    ("yaml_learning_rate_nan", yaml_case(["learning_rate", "nan"], learning_rate="nan")),
    ("yaml_max_steps_float", yaml_case(["max_steps", "1.5"], max_steps="1.5")),
    ("yaml_max_steps_overflow", yaml_case(["max_steps"], max_steps="99999999999999999999")),
    ("yaml_shuffle_maybe", yaml_case(["shuffle", "maybe"], shuffle="maybe")),
    ("yaml_value_is_list", yaml_case(["learning_rate"], learning_rate="[1, 2]")),
    ("yaml_int_key_empty_string", yaml_case(["max_steps"], max_steps='""')),
    ("yaml_model_not_mapping", yaml_case(["model"], model="16")),
    ("yaml_micro_batch_zero", yaml_case(["micro_batch_size", "0"], micro_batch_size="0")),
    ("yaml_adam_beta2_range", yaml_case(["adam_beta2", "1.5"], adam_beta2="1.5")),
    ("yaml_negative_warmup", yaml_case(["warmup_steps", "-5"], warmup_steps="-5")),
    ("yaml_lr_scheduler_bogus", yaml_case(["lr_scheduler", "bogus"], lr_scheduler="bogus")),
    ("yaml_device_bogus", yaml_case(["device", "tpu"], device="tpu")),
    ("yaml_duplicate_key", raw_yaml_case(
        lambda e, d: yaml_text(base_cfg(e, d)) + "max_steps: 2\n", lambda p: ["max_steps", p])),
    ("yaml_duplicate_model_key", raw_yaml_case(
        lambda e, d: yaml_text(base_cfg(e, d, model=dict(MODEL, **{"hidden_size": "16\n  hidden_size: 32"}))),
        lambda p: ["hidden_size", p])),
    ("yaml_base_model_and_model_block", yaml_case(["base_model"], base_model="/nonexistent/model")),
    ("yaml_no_model", yaml_case(["base_model", "model"], model=None)),
    ("yaml_missing_train_data", yaml_case(["train_data"], train_data=None)),
    ("yaml_model_missing_hidden_size", yaml_case(["hidden_size"], model=with_model(hidden_size=None))),
    ("yaml_heads_not_dividing", yaml_case(
        ["num_key_value_heads"], model=with_model(num_attention_heads="4", num_key_value_heads="3"))),
    ("yaml_hidden_not_multiple_of_heads", yaml_case(
        ["num_attention_heads"], model=with_model(num_attention_heads="3"))),
    ("yaml_odd_head_dim", yaml_case(["head_dim"], model=with_model(hidden_size="6"))),
    ("yaml_odd_head_dim_explicit", yaml_case(["head_dim"], model=with_model(head_dim="3"))),
    ("yaml_too_many_layers", too_many_layers),
    ("yaml_two_documents", raw_yaml_case(
        lambda e, d: yaml_text(base_cfg(e, d)) + "---\nmax_steps: 5\n", lambda p: [p, "document"])),
    ("yaml_adam_epsilon_zero", yaml_case(["adam_epsilon"], adam_epsilon="0")),
    ("yaml_adam_epsilon_underflows", yaml_case(["adam_epsilon"], adam_epsilon="1e-50")),
    ("yaml_adam_beta2_rounds_to_one", yaml_case(["adam_beta2", "float32"], adam_beta2="0.999999999")),
    ("yaml_adam_beta1_one", yaml_case(["adam_beta1"], adam_beta1="1")),
    ("yaml_max_pos_zero", yaml_case(
        ["max_position_embeddings"], model=with_model(max_position_embeddings="0"))),
    # ---- token shards
    ("data_glob_no_match", lambda e, d: (
        ["-c", cfg_file(d, base_cfg(e, d, train_data=os.path.join(d, "nothing_*.bin")))],
        ["nothing_*.bin"])),
    ("data_is_directory", lambda e, d: (
        ["-c", cfg_file(d, base_cfg(e, d, train_data=d))], [d])),
    ("data_is_fifo", fifo_shard),
    ("data_bad_magic", shard_case(dict(tokens=list(range(64)), magic=12345), lambda p: [p, "magic"])),
    ("data_bad_version", shard_case(dict(tokens=list(range(64)), version=3), lambda p: [p, "version"])),
    ("data_truncated_body", shard_case(dict(tokens=list(range(64)), ntok=1000), lambda p: [p])),
    ("data_shorter_than_header", shard_case(
        dict(tokens=list(range(64)), truncate_to=100), lambda p: [p])),
    ("data_negative_count", shard_case(dict(tokens=list(range(64)), ntok=-1), lambda p: [p])),
    ("data_too_few_tokens", shard_case(dict(tokens=list(range(10))), lambda p: ["train_data", p])),
    ("data_token_out_of_vocab", shard_case(
        dict(tokens=[300] * 64, version=2), lambda p: [p, "300"])),
    ("data_token_out_of_vocab_u16", shard_case(
        dict(tokens=[65535] * 64, version=1), lambda p: [p, "65535"])),
    ("data_val_bad_magic", shard_case(
        dict(tokens=list(range(64)), magic=7), lambda p: [p, "magic"], key="val_data")),
    ("data_eval_steps_without_val", yaml_case(["eval_steps", "val_data"], eval_steps="1")),
    # ---- Hugging Face model directory
    ("hf_dir_missing", lambda e, d: (
        ["-c", cfg_file(d, {k: v for k, v in base_cfg(e, d, base_model=os.path.join(d, "no_model")).items()
                            if k != "model"})], ["no_model"])),
    ("hf_config_malformed", hf_case(write_raw("config.json", b'{"hidden_size": 16,'),
                                    lambda m: [os.path.join(m, "config.json")])),
    ("hf_config_not_object", hf_case(write_raw("config.json", b"[1, 2]"),
                                     lambda m: [os.path.join(m, "config.json")])),
    ("hf_config_missing_hidden_size", hf_case(edit_config_json(lambda c: c.pop("hidden_size")),
                                              lambda m: ["config.json", "hidden_size"])),
    ("hf_config_hidden_size_string", hf_case(edit_config_json(lambda c: c.update(hidden_size="16")),
                                             lambda m: ["config.json", "hidden_size"])),
    ("hf_rope_yarn_factor", hf_case(edit_config_json(
        lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 0})),
        lambda m: ["config.json", "rope_scaling.factor"])),
    ("hf_rope_yarn_key", hf_case(edit_config_json(
        lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0, "low_freq_factor": 1.0})),
        lambda m: ["config.json", "low_freq_factor", "yarn"])),
    ("hf_rope_dynamic", hf_case(edit_config_json(
        lambda c: c.update(rope_scaling={"rope_type": "dynamic", "factor": 4.0})),
        lambda m: ["config.json", "dynamic"])),
    ("hf_rope_linear_factor", hf_case(edit_config_json(
        lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": -2.0})),
        lambda m: ["config.json", "linear", "factor"])),
    ("hf_config_kv_heads_not_dividing", hf_case(
        edit_config_json(lambda c: c.update(num_key_value_heads=3)),
        lambda m: ["config.json", "num_key_value_heads"])),
    ("hf_max_pos_zero", hf_case(
        edit_config_json(lambda c: c.update(max_position_embeddings=0)),
        lambda m: ["config.json", "max_position_embeddings"])),
    ("st_header_longer_than_file", hf_case(header_too_long, lambda m: ["model.safetensors"])),
    ("st_header_not_json", hf_case(header_not_json, lambda m: ["model.safetensors"])),
    ("st_shorter_than_8_bytes", hf_case(write_raw("model.safetensors", b"\x01\x00"),
                                        lambda m: ["model.safetensors"])),
    ("st_data_offsets_out_of_range", hf_case(
        edit_tensors(offsets_out_of_range), lambda m: ["model.safetensors", "model.norm.weight"])),
    ("st_data_offsets_size_mismatch", hf_case(
        edit_tensors(lambda h: h["model.norm.weight"].update(data_offsets=[0, 4])),
        lambda m: ["model.safetensors", "model.norm.weight"])),
    ("st_wrong_shape", hf_case(
        edit_tensors(set_entry("model.layers.0.mlp.gate_proj.weight", shape=[16, 32])),
        lambda m: ["model.layers.0.mlp.gate_proj.weight"])),
    ("st_missing_tensor", hf_case(drop_tensor, lambda m: ["model.norm.weight"])),
    ("st_unsupported_dtype", hf_case(
        edit_tensors(set_entry("model.norm.weight", dtype="I32")),
        lambda m: ["model.norm.weight", "I32"])),
    ("st_unknown_dtype", hf_case(
        edit_tensors(set_entry("model.norm.weight", dtype="F31")),
        lambda m: ["model.norm.weight", "F31"])),
    ("st_is_fifo", hf_case(fifo_safetensors, lambda m: ["model.safetensors"])),
    ("st_duplicate_metadata", hf_case(
        raw_header_edit(duplicate_metadata), lambda m: ["model.safetensors", "__metadata__", "twice"])),
    ("st_duplicate_tensor", hf_case(
        raw_header_edit(duplicate_tensor), lambda m: ["model.safetensors", "model.norm.weight", "twice"])),
    ("st_offsets_overlap", hf_case(
        edit_tensors(overlapping_offsets), lambda m: ["model.safetensors", "overlap"])),
    ("st_offsets_hole", hf_case(
        raw_header_edit(hole_at_start), lambda m: ["model.safetensors", "belong to no tensor"])),
    ("st_trailing_bytes", hf_case(
        raw_header_edit(lambda t, d: (t, d + b"\0" * 16)), lambda m: ["model.safetensors", "trailing"])),
    ("st_nul_in_name", hf_case(
        raw_header_edit(nul_in_name), lambda m: ["model.safetensors", "NUL"])),
    ("st_header_trailing_garbage", hf_case(
        raw_header_edit(lambda t, d: (t + "xyz", d)), lambda m: ["model.safetensors", "trailing"])),
    ("st_nan_weight", hf_case(nan_weight, lambda m: ["model.norm.weight", "nan"])),
    ("st_index_duplicate_key", hf_case(
        sharded_duplicate_key, lambda m: ["model.safetensors.index.json", "twice"])),
    ("hf_config_duplicate_key", hf_case(
        edit_config_text(lambda t: '{"hidden_size": 16, ' + t.lstrip()[1:]),
        lambda m: [os.path.join(m, "config.json"), "hidden_size", "twice"])),
    ("hf_config_trailing_garbage", hf_case(
        edit_config_text(lambda t: t + "\n{}"), lambda m: [os.path.join(m, "config.json"), "trailing"])),
    ("hf_rope_theta_inf", hf_case(
        edit_config_text(config_set_raw("rope_theta", "1e999")), lambda m: ["config.json", "rope_theta"])),
    ("hf_rope_theta_negative", hf_case(
        edit_config_json(lambda c: c.update(rope_theta=-1.0)), lambda m: ["config.json", "rope_theta"])),
    ("hf_rms_norm_eps_zero", hf_case(
        edit_config_json(lambda c: c.update(rms_norm_eps=0)), lambda m: ["config.json", "rms_norm_eps"])),
    ("hf_rms_norm_eps_overflows_float", hf_case(
        edit_config_json(lambda c: c.update(rms_norm_eps=1e300)), lambda m: ["config.json", "rms_norm_eps"])),
    ("hf_rope_llama3_inf_factor", hf_case(
        edit_config_text(config_set_raw("rope_scaling", '{"rope_type": "llama3", "factor": 1e999, '
                                        '"low_freq_factor": 1.0, "high_freq_factor": 4.0, '
                                        '"original_max_position_embeddings": 64}')),
        lambda m: ["config.json", "llama3"])),
    ("adapter_config_duplicate_key", adapter_dup_key),
    ("hf_model_type_unsupported", hf_case(
        edit_config_json(lambda c: c.update(model_type="olmo")),
        lambda m: ["config.json", "'olmo'", "llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3_text"])),
    ("hf_architecture_unsupported", hf_case(
        edit_config_json(lambda c: c.update(architectures=["OlmoForCausalLM"])),
        lambda m: ["config.json", "OlmoForCausalLM", "Qwen3ForCausalLM, Phi3ForCausalLM"])),
    ("hf_layer_types_unsupported_pattern", hf_case(
        edit_config_json(lambda c: c.update(model_type="qwen2", use_sliding_window=True, sliding_window=4,
                                            max_window_layers=0,
                                            layer_types=["full_attention"] * c["num_hidden_layers"])),
        lambda m: ["config.json", "layer_types[0]", "max_window_layers"])),
    ("hf_sliding_window_not_int", hf_case(
        edit_config_json(lambda c: c.update(model_type="mistral", sliding_window="big")),
        lambda m: ["config.json", "sliding_window"])),
    ("st_index_missing_shard", hf_case(
        sharded_missing, lambda m: ["model-00001-of-00002.safetensors"])),
    ("st_index_malformed", hf_case(
        lambda m: (os.remove(os.path.join(m, "model.safetensors")),
                   write_raw("model.safetensors.index.json", b"{not json")(m)),
        lambda m: ["model.safetensors.index.json"])),
    # ---- resume
    ("resume_missing_dir", lambda e, d: (
        ["-c", cfg_file(d, base_cfg(e, d, resume_from_checkpoint=os.path.join(d, "no_ckpt")))],
        ["no_ckpt"])),
    ("resume_corrupt_trainer_state", resume_case(
        corrupt_state, lambda ck: [os.path.join(ck, "trainer_state.json")])),
    ("resume_state_duplicate_key", resume_case(
        state_text(lambda t: '{"step": 7, ' + t.lstrip()[1:]),
        lambda ck: [os.path.join(ck, "trainer_state.json"), "step", "twice"])),
    ("resume_state_trailing_garbage", resume_case(
        state_text(lambda t: t + "garbage"), lambda ck: [os.path.join(ck, "trainer_state.json"), "trailing"])),
    ("resume_missing_optimizer", resume_case(
        lambda ck: os.remove(os.path.join(ck, "optimizer.safetensors")),
        lambda ck: ["optimizer.safetensors"])),
    ("resume_shape_mismatch", resume_case(
        edit_config_json(lambda c: c.update(intermediate_size=64)), lambda ck: [ck])),
    # ---- output
    ("output_dir_not_writable", not_writable),
    ("output_dir_is_file", output_is_file),
    ("output_disk_full_at_checkpoint", disk_full),
]
LIMITED = {"yaml_too_many_layers", "output_disk_full_at_checkpoint"}  # run serially


# ---------------------------------------------------------------------------------------

def prepare(env):
    """Shared fixtures: a token shard and a valid model directory from one real run."""
    write_shard(env.path("train.bin"), [i % 256 for i in range(1024)])
    d = env.path("good")
    os.makedirs(d)
    cfg = base_cfg(env, d, output_dir=env.path("good_out"))
    rc, out, err = env.run(["-c", cfg_file(d, cfg)], d)
    if rc != 0:
        return "the valid config did not train (exit code %s, stderr %r)" % (rc, err[-1200:])
    # The checker must reject a successful run, or every PASS below means nothing.
    if not check_error(rc, err, ["train_data"], d):
        return "the checker accepted a successful run as an error"
    need = [env.path("good_out", f) for f in ("model.safetensors", "config.json")] + \
        [env.path("good_out", "checkpoint-1", f) for f in CKPT_FILES]
    missing = [p for p in need if not os.path.isfile(p)]
    if missing:
        return "the valid run did not write %s" % ", ".join(missing)
    os.makedirs(env.path("hf_model"))
    for f in ("model.safetensors", "config.json"):
        shutil.copy(env.path("good_out", f), env.path("hf_model", f))
    return ""


def run_case(env, name, setup):
    d = env.path("cases", name)
    os.makedirs(d)
    try:
        argv, culprits, *limits = setup(env, d)
    except Exception as e:  # a bug in the test itself
        return "setup raised %r" % e, None, ""
    rc, _, err = env.run(argv, d, *limits)
    return check_error(rc, err, culprits, d), rc, err


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="./train_llama", help="trainer binary")
    ap.add_argument("-k", default="", help="run only cases whose name contains this")
    ap.add_argument("-j", type=int, default=min(8, os.cpu_count() or 1), help="parallel runs")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("-v", action="store_true", help="show the error line of passing cases")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    if not os.access(binary, os.X_OK):
        sys.exit("no executable trainer at %s" % binary)

    root = tempfile.mkdtemp(prefix="test_bad_inputs.")
    env = Env(binary, root)
    try:
        problem = prepare(env)
        if problem:
            print("FAIL setup: %s" % problem)
            print("0 passed, 1 failed")
            sys.exit(1)
        cases = [(n, s) for n, s in CASES if args.k in n]
        plain = [(n, s) for n, s in cases if n not in LIMITED]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:
            futs = [pool.submit(run_case, env, n, s) for n, s in plain]
            results = {n: f.result() for (n, _), f in zip(plain, futs)}
        for n, s in cases:
            if n in LIMITED:
                results[n] = run_case(env, n, s)
        npass = nfail = 0
        for name, _ in cases:
            problem, rc, err = results[name]
            if problem:
                nfail += 1
                shown = err if len(err) <= 1200 else err[:1200] + "..."
                print("FAIL %s: %s (exit code %s, stderr %r)" % (name, problem, rc, shown))
            else:
                npass += 1
                print("PASS %s" % name + ("  [%s]" % err.strip() if args.v else ""))
    finally:
        if args.keep:
            print("kept %s" % root)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print("%d passed, %d failed" % (npass, nfail))
    sys.exit(1 if nfail else 0)


if __name__ == "__main__":
    main()
