#!/usr/bin/python3
"""Axolotl config compatibility (issue 18, config part): every Axolotl key is implemented,
accepted with a one-line note, or refused with a message saying what to use instead; unknown
keys are listed together with near-spelling suggestions only; YAML type tolerance (500_000,
bf16: auto, fsdp lists); num_epochs/warmup_ratio/cosine_min_lr_ratio/eval and save cadence/
save_total_limit/early stopping/auto resume; base_model as a hub id in a local HF cache; and the
example configs in configs/axolotl/ run to completion on token shards.

    /usr/bin/python3 test/test_axolotl_config.py --bin build/train_llama
Prints "PASS <case>" / "FAIL <case>: why"; exits 1 if any case failed.
"""
import argparse
import concurrent.futures
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = {"vocab_size": 256, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 2, "max_position_embeddings": 64}
HUB_ID = "NousResearch/Llama-3.2-1B"  # the id the example configs name; a tiny model here


def write_shard(path, n, seed):
    rng = random.Random(seed)
    toks = [rng.randrange(256) for _ in range(n)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
        f.write(struct.pack("<%dH" % n, *toks))


def yaml_text(cfg):
    out = []
    for k, v in cfg.items():
        if isinstance(v, dict):
            out.append("%s:" % k)
            out += ["  %s: %s" % (a, b) for a, b in v.items()]
        elif v is None:
            out.append("%s:" % k)
        else:
            out.append("%s: %s" % (k, v))
    return "\n".join(out) + "\n"


class Env:
    def __init__(self, binary, root):
        self.bin, self.root = binary, root
        self.env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", LLMC_DEVICE="cpu")
        # 2000 tokens: 31 windows of 2 x 32 (+1) per epoch
        write_shard(os.path.join(root, "train.bin"), 2000, 1)
        write_shard(os.path.join(root, "val.bin"), 600, 2)

    def path(self, *p):
        return os.path.join(self.root, *p)

    def base(self, name, **over):
        cfg = {"model": dict(MODEL), "train_data": self.path("train.bin"), "sequence_len": 32,
               "micro_batch_size": 2, "max_steps": 2, "num_threads": 1,
               "output_dir": self.path(name, "out")}
        for k, v in over.items():
            if v == "DROP":
                cfg.pop(k, None)
            else:
                cfg[k] = v
        return cfg

    def run(self, name, cfg, *sets, env=None):
        """--set for each of sets, except "--plan", which is passed as it is."""
        d = self.path(name)
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "cfg.yaml")
        with open(p, "w") as f:
            f.write(cfg if isinstance(cfg, str) else yaml_text(cfg))
        args = [self.bin, "-c", p]
        for s in sets:
            args += [s] if s == "--plan" else ["--set", s]
        r = subprocess.run(args, cwd=d, env=dict(self.env, **(env or {})), capture_output=True,
                           text=True, timeout=120)
        return r.returncode, r.stdout, r.stderr

    def metrics(self, name):
        rows = []
        with open(self.path(name, "out", "metrics.jsonl")) as f:
            for line in f:
                rows.append(json.loads(line))
        return rows


class Fail(Exception):
    pass


def check(cond, why):
    if not cond:
        raise Fail(why)


def ok_run(rc, out, err):
    check(rc == 0, "exit %d: %s" % (rc, (err.strip().splitlines() or ["(no stderr)"])[-1]))


def one_error(rc, err, *needles, absent=()):
    check(rc not in (0, None) and rc > 0, "expected an error exit, got %s" % rc)
    lines = [l for l in err.splitlines() if l.strip()]
    check(len(lines) == 1 and lines[0].startswith("error: "), "expected one 'error:' line, got %r" % err[-400:])
    for n in needles:
        check(n in lines[0], "error line lacks %r: %s" % (n, lines[0]))
    for n in absent:
        check(n not in lines[0], "error line has %r: %s" % (n, lines[0]))
    return lines[0]


def train_steps(rows):
    return [r["step"] for r in rows if "loss" in r]


# ---------------------------------------------------------------------------------------------
# Cases: each takes env and raises Fail.

def unknown_keys_listed_together(e):
    cfg = e.base("unknown", learnig_rate="1e-3", completely_unrelated_thing=1, bf17="true", hiden_size=3)
    rc, out, err = e.run("unknown", cfg)
    line = one_error(rc, err, "4 unknown keys", "'learnig_rate'", "did you mean 'learning_rate'?",
                     "'completely_unrelated_thing'", "'bf17'", "did you mean 'bf16'?",
                     "did you mean 'model.hidden_size'?", "cfg.yaml")
    m = re.search(r"'completely_unrelated_thing' \(line \d+\)", line)
    check(m, "a far-off key got a suggestion: " + line)
    check("max_steps" not in line and "seed" not in line, "misleading suggestion: " + line)


def single_unknown_key_names_line(e):
    rc, out, err = e.run("unknown1", e.base("unknown1", zzz_qqq=1))
    line = one_error(rc, err, "unknown key 'zzz_qqq'", "cfg.yaml:")
    check("did you mean" not in line, "a far-off key got a suggestion: " + line)


def set_unknown_key_no_far_suggestion(e):
    rc, out, err = e.run("setunk", e.base("setunk"), "datasetz=1")
    one_error(rc, err, "'datasetz'", "did you mean 'datasets'?")
    rc, out, err = e.run("setunk2", e.base("setunk2"), "xyzzy=1")
    one_error(rc, err, "'xyzzy'", absent=("did you mean",))


def notes_for_no_effect_keys(e):
    cfg = e.base("notes", wandb_project="p", wandb_entity=None, mlflow_experiment_name="x",
                 flash_attention="true", sdp_attention="false", tf32="true", strict="false",
                 trust_remote_code="true", model_type="LlamaForCausalLM", tokenizer_type="AutoTokenizer",
                 liger_rms_norm="true", lora_mlp_kernel="true", attn_implementation="flash_attention_2",
                 hub_model_id="me/model", ddp_bucket_cap_mb=25, dataloader_num_workers=4,
                 torch_compile="true", group_by_length="false",
                 tokenizer_config="some/tokenizer", use_otel_metrics="true", otel_metrics_port=8000,
                 use_ray="true", ray_run_name="r")
    text = yaml_text(cfg) + "plugins:\n  - axolotl.integrations.liger.LigerPlugin\n" + \
        "gradient_checkpointing_kwargs:\n  use_reentrant: true\nspecial_tokens:\n  pad_token: <pad>\n"
    rc, out, err = e.run("notes", text)
    ok_run(rc, out, err)
    for k in ("wandb_project", "mlflow_experiment_name", "flash_attention", "tf32", "trust_remote_code",
              "model_type", "liger_rms_norm", "lora_mlp_kernel", "attn_implementation", "hub_model_id",
              "ddp_bucket_cap_mb", "dataloader_num_workers", "torch_compile",
              "gradient_checkpointing_kwargs", "special_tokens", "tokenizer_config", "use_otel_metrics",
              "otel_metrics_port", "use_ray", "ray_run_name"):
        check(re.search(r"^note: %s has no effect here: \S" % k, out, re.M), "no note for " + k)
    check(re.search(r"^note: plugin axolotl.integrations.liger.LigerPlugin has no effect here: \S", out, re.M),
          "no note for the Liger plugin")
    for k in ("wandb_entity", "sdp_attention", "strict", "group_by_length"):  # null/false: silent
        check("note: %s " % k not in out, "a note for %s, whose value does nothing" % k)


def plugins_by_kind(e):
    """Axolotl's plugins list: the kernel swaps and the trackers are notes; a plugin that changes
    the loss, the optimizer or what trains is refused by name and line, as is one not known."""
    base = yaml_text(e.base("plug_ok"))
    text = base + ("plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"
                   "  - axolotl.integrations.liger.LigerPlugin\n  - axolotl.integrations.swanlab.SwanLabPlugin\n"
                   "use_swanlab: true\nswanlab_project: p\n")
    rc, out, err = e.run("plug_ok", text)
    ok_run(rc, out, err)
    for name in ("cut_cross_entropy.CutCrossEntropyPlugin", "liger.LigerPlugin", "swanlab.SwanLabPlugin"):
        check("note: plugin axolotl.integrations.%s has no effect here" % name in out, "no note for " + name)
    for k in ("use_swanlab", "swanlab_project"):
        check("note: %s has no effect here: experiment tracking" % k in out, "no note for " + k)
    for i, (plugin, needles) in enumerate((
            ("axolotl.integrations.diffusion.DiffusionPlugin", ("masked-denoising", "next-token")),
            ("axolotl.integrations.kd.KDPlugin", ("knowledge distillation",)),
            ("axolotl.integrations.spectrum.SpectrumPlugin", ("unfrozen_parameters",)),
            ("axolotl.integrations.grokfast.GrokfastPlugin", ("Grokfast",)),
            ("my_company.plugins.Special", ("not one this program knows",)))):
        name = "plug%d" % i
        text = yaml_text(e.base(name)) + "plugins:\n  - axolotl.integrations.liger.LigerPlugin\n  - %s\n" % plugin
        line = text.count("\n")  # the second item's line
        rc, out, err = e.run(name, text)
        one_error(rc, err, "cfg.yaml:%d:" % line, "plugin '%s' is not supported" % plugin, *needles)
    rc, out, err = e.run("plug_map", base + "plugins:\n  - {name: x}\n")
    one_error(rc, err, "'plugins' expects a list of plugin names")
    rc, out, err = e.run("plug_one", base + "plugins: axolotl.integrations.diffusion.DiffusionPlugin\n")
    one_error(rc, err, "'plugins' expects a list of plugin names")
    rc, out, err = e.run("plug_none", base + "plugins:\n")
    ok_run(rc, out, err)


def refused_keys(e):
    cases = [({"gptq": "true"}, ["gptq", "load_in_4bit"]),
             ({"load_in_8bit": "true"}, ["load_in_8bit", "adapter: lora"]),
             ({"relora_steps": 100}, ["relora_steps", "adapter: lora"]),
             ({"rl": "grpo"}, ["rl: grpo is not implemented"]),
             ({"fp16": "true"}, ["fp16", "bf16"]),
             ({"optimizer": "lion_8bit"}, ["lion_8bit", "adamw_torch"]),
             ({"lr_scheduler_kwargs": "{a: 1}"}, ["lr_scheduler_kwargs"]),
             ({"sequence_parallel_degree": 2}, ["sequence_parallel_degree 2 needs exactly 2 ranks"]),
             ({"use_ray": "true", "ray_num_workers": 4}, ["ray_num_workers", "mpirun -np N"])]
    for i, (over, needles) in enumerate(cases):
        rc, out, err = e.run("refuse%d" % i, e.base("refuse%d" % i, **over))
        one_error(rc, err, *needles)
    # harmless values of refused keys pass silently
    rc, out, err = e.run("refuse_ok", e.base("refuse_ok", load_in_8bit="false", gptq="false", deepspeed=None,
                                             relora_steps=None, sequence_parallel_degree=1, rl=None,
                                             ray_num_workers=1))
    ok_run(rc, out, err)


def datasets_keys_refused(e):
    text = yaml_text(e.base("ds")) + "datasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\n"
    rc, out, err = e.run("ds", text)
    one_error(rc, err, "datasets", "train_data", "not both", "cfg.yaml")
    for i, (k, v) in enumerate([("train_on_inputs", "false"), ("sample_packing", "true"),
                                ("val_set_size", "0.05"), ("chat_template", "chatml"),
                                ("dataset_prepared_path", "last_run_prepared"), ("dataset_shard_num", "4")]):
        rc, out, err = e.run("ds%d" % i, e.base("ds%d" % i, **{k: v}))
        one_error(rc, err, k, "datasets pipeline", "train_data")
    rc, out, err = e.run("ds_ok", e.base("ds_ok", train_on_inputs="true", sample_packing="false",
                                         val_set_size="0.0", eval_sample_packing="false",
                                         dataset_prepared_path=None, chat_template=None,
                                         pad_to_sequence_len="true"))
    ok_run(rc, out, err)


def type_tolerance(e):
    rc, out, err = e.run("under", e.base("under", max_steps="1_0", learning_rate="1_0e-4"))
    ok_run(rc, out, err)
    check(train_steps(e.metrics("under"))[-1] == 10, "max_steps 1_0 did not run 10 steps")
    rc, out, err = e.run("under2", e.base("under2", sequence_len="500_000"))
    one_error(rc, err, "500000")  # read as an int, then too long for the tiny model
    # null keeps the default, like Axolotl's "lora_r:" lines
    rc, out, err = e.run("nulls", e.base("nulls", lora_r=None, adapter=None, lr_scheduler=None,
                                         weight_decay=None, output_dir=None))
    ok_run(rc, out, err)
    check(os.path.isdir(e.path("nulls", "out")), "output_dir: (null) did not keep the default 'out'")


def precision_keys(e):
    for i, (bf, fp) in enumerate([("auto", "false"), ("true", None), ("false", "false"), ("full", None)]):
        over = {"bf16": bf}
        if fp:
            over["fp16"] = fp
        rc, out, err = e.run("prec%d" % i, e.base("prec%d" % i, **over))
        ok_run(rc, out, err)
    rc, out, err = e.run("prec_conflict", e.base("prec_conflict", bf16="true", dtype="float32"))
    one_error(rc, err, "bf16", "dtype")
    rc, out, err = e.run("prec_conflict2", e.base("prec_conflict2", bf16="false", dtype="bfloat16"))
    one_error(rc, err, "bf16", "dtype")
    rc, out, err = e.run("prec_ok", e.base("prec_ok", bf16="false", dtype="float32", bfloat16="false"))
    ok_run(rc, out, err)


def fsdp_forms(e):
    text = yaml_text(e.base("fsdp")) + "fsdp:\n  - full_shard\n  - auto_wrap\nfsdp_config:\n" \
        "  fsdp_offload_params: false\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n" \
        "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n  fsdp_state_dict_type: FULL_STATE_DICT\n" \
        "  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_use_orig_params: false\n"
    rc, out, err = e.run("fsdp", text)
    ok_run(rc, out, err)
    check("note: fsdp: auto_wrap" in out, "no note for auto_wrap")
    rc, out, err = e.run("fsdp_str", e.base("fsdp_str", fsdp="full_shard auto_wrap"))
    ok_run(rc, out, err)
    rc, out, err = e.run("fsdp_sgo", e.base("fsdp_sgo", fsdp="[shard_grad_op]"))
    one_error(rc, err, "shard_grad_op", "zero_stage")
    # A full fine-tune's parameters in host memory: ZeRO-3 with its pieces of the weights and
    # their gradients on the host and the update there (test_sharding's offload_params_* check
    # the memory and the bits); the same losses as the fsdp run above.
    fsdp_losses = [r["loss"] for r in e.metrics("fsdp") if "loss" in r]
    for name, extra in (("fsdp_off", "fsdp:\n  - full_shard\n  - offload\n"),
                        ("fsdp_cfg_off", "fsdp_config:\n  fsdp_offload_params: true\n")):
        rc, out, err = e.run(name, yaml_text(e.base(name)) + extra)
        ok_run(rc, out, err)
        check("the full fine-tune runs as zero_stage 3" in out and "in host memory" in out and
              "offload_optimizer: true (set by it" in out, "%s: no note: %s" % (name, out[:600]))
        check(re.search(r"host [1-9][0-9.]* [KM]iB", out), "%s: nothing in host memory: %s" % (name, out[-300:]))
        got = [r["loss"] for r in e.metrics(name) if "loss" in r]
        check(got == fsdp_losses, "%s: losses %s differ from the fsdp run's %s" % (name, got, fsdp_losses))
    rc, out, err = e.run("fsdp_off_z1", yaml_text(e.base("fsdp_off_z1", zero_stage=1)) +
                         "fsdp_config:\n  fsdp_offload_params: true\n")
    one_error(rc, err, "fsdp_offload_params: true", "zero_stage 1", "zero_stage: 3")
    rc, out, err = e.run("fsdp_off_noopt", yaml_text(e.base("fsdp_off_noopt", offload_optimizer="false")) +
                         "fsdp:\n  - full_shard\n  - offload\n")
    one_error(rc, err, "fsdp: offload", "offload_optimizer: false")
    rc, out, err = e.run("op_clash", yaml_text(e.base("op_clash", offload_params="false")) +
                         "fsdp_config:\n  fsdp_offload_params: true\n")
    one_error(rc, err, "fsdp_offload_params: true", "offload_params: false")
    # In an adapter run, parameters in host memory are the frozen base streamed from the host
    # (layer_offloading) and the adapters' optimizer state there (offload_optimizer): the
    # same losses as the run without, host memory in use.
    lora = dict(adapter="lora", lora_r=4, lora_alpha=8, lora_target_linear="true", max_steps=3)
    rc, out, err = e.run("fsdp_lora", e.base("fsdp_lora", **lora))
    ok_run(rc, out, err)
    plain = [r["loss"] for r in e.metrics("fsdp_lora") if "loss" in r]
    for name, extra in (("fsdp_lora_cfg", "fsdp:\n  - full_shard\n  - auto_wrap\nfsdp_config:\n  fsdp_offload_params: true\n"),
                        ("fsdp_lora_list", "fsdp:\n  - full_shard\n  - offload\n")):
        rc, out, err = e.run(name, yaml_text(e.base(name, **lora)) + extra)
        ok_run(rc, out, err)
        check("runs as layer_offloading: true" in out and "offload_optimizer: true" in out, "%s: no note: %s" % (name, out[:500]))
        check(re.search(r"host [1-9][0-9.]* [KM]iB", out), "%s: nothing in host memory: %s" % (name, out[-300:]))
        got = [r["loss"] for r in e.metrics(name) if "loss" in r]
        check(got == plain, "%s: losses %s differ from the plain adapter run's %s" % (name, got, plain))
    rc, out, err = e.run("fsdp_lora_clash", yaml_text(e.base("fsdp_lora_clash", layer_offloading="false", **lora)) +
                         "fsdp_config:\n  fsdp_offload_params: true\n")
    one_error(rc, err, "fsdp_offload_params: true means layer_offloading: true", "layer_offloading: false")
    rc, out, err = e.run("fsdp_cfg_unk", yaml_text(e.base("fsdp_cfg_unk")) + "fsdp_config:\n  fsdp_frobnicate: 1\n")
    one_error(rc, err, "fsdp_config.fsdp_frobnicate")


def bnb_config(e):
    """bnb_config_kwargs: Axolotl's defaults (nf4, double quantization) are what the NF4 base
    here is; other quantization choices are refused by name, compute_dtype gets a note."""
    ok = "bnb_config_kwargs:\n  llm_int8_has_fp16_weight: false\n  bnb_4bit_quant_type: nf4\n" \
         "  bnb_4bit_use_double_quant: true\n  bnb_4bit_quant_storage: bfloat16\n"
    rc, out, err = e.run("bnb_ok", yaml_text(e.base("bnb_ok")) + ok)
    ok_run(rc, out, err)
    check("bnb_config_kwargs" not in out, "a note for Axolotl's default bnb_config_kwargs: " + out[:300])
    for i, (line, needles) in enumerate((("bnb_4bit_quant_type: fp4", ("bnb_4bit_quant_type", "fp4", "nf4")),
                                         ("bnb_4bit_use_double_quant: false", ("bnb_4bit_use_double_quant", "false")),
                                         ("llm_int8_skip_modules: [lm_head]", ("llm_int8_skip_modules",)),
                                         ("bnb_4bit_frobnicate: 1", ("bnb_config_kwargs.bnb_4bit_frobnicate",)))):
        rc, out, err = e.run("bnb%d" % i, yaml_text(e.base("bnb%d" % i)) + "bnb_config_kwargs:\n  %s\n" % line)
        one_error(rc, err, *needles)
    rc, out, err = e.run("bnb_cd", yaml_text(e.base("bnb_cd")) + "bnb_config_kwargs:\n  bnb_4bit_compute_dtype: float32\n")
    ok_run(rc, out, err)
    check("note: bnb_config_kwargs: bnb_4bit_compute_dtype float32 has no effect here" in out, "no compute_dtype note")


def optimizer_family(e):
    for i, name in enumerate(["adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_bnb_8bit",
                              "paged_adamw_8bit", "paged_adamw_32bit", "adamw_torch_8bit", "adamw_torch_4bit",
                              "ao_adamw_8bit", "ao_adamw_4bit"]):
        # 4 steps: an 8-bit optimizer's first update uses its moments before they are quantized
        rc, out, err = e.run("opt%d" % i, e.base("opt%d" % i, optimizer=name, max_steps=4))
        ok_run(rc, out, err)
        bits = "4" if "4bit" in name else "8"
        if name in ("adamw_torch_8bit", "adamw_torch_4bit"):  # torchao's AdamW8bit/4bit (test_adamw8.py)
            check(re.search(r"^note: optimizer %s runs as torchao's AdamW%sbit" % (name, bits), out, re.M),
                  "no torchao %s-bit note for %s" % (bits, name))
        elif name in ("adamw_bnb_8bit", "paged_adamw_8bit"):  # bitsandbytes' 8-bit AdamW (test_adamw8.py)
            check(re.search(r"^note: optimizer %s runs as bitsandbytes' blockwise 8-bit AdamW" % name, out, re.M),
                  "no 8-bit AdamW note for " + name)
            check(("paged" in name) == bool(re.search(r"^note: optimizer %s .*paged" % name, out, re.M)),
                  "the paged part of the note for " + name)
        elif "bit" in name and "32bit" not in name:
            check(re.search(r"^note: optimizer %s .*%s-bit optimizer states are not implemented" % (name, bits),
                            out, re.M), "no %s-bit note for %s" % (bits, name))
        elif "paged" in name:
            check(re.search(r"^note: optimizer %s .*paged" % name, out, re.M), "no paged note for " + name)
        else:
            check("note: optimizer" not in out, "a note for " + name)
    # the same float AdamW: identical losses (bitsandbytes' 8-bit one: the same first loss, then its own)
    l0 = [r["loss"] for r in e.metrics("opt0") if "loss" in r]
    l3 = [r["loss"] for r in e.metrics("opt3") if "loss" in r]
    check(l0[0] == l3[0] and l0[1:] != l3[1:], "adamw_bnb_8bit trained as adamw_torch, or from another start: "
          "%s vs %s" % (l3, l0))
    l6 = [r["loss"] for r in e.metrics("opt6") if "loss" in r]
    check(l0[0] == l6[0] and l6[1:] != l0[1:], "adamw_torch_8bit trained as adamw_torch: %s" % l6)
    l7 = [r["loss"] for r in e.metrics("opt7") if "loss" in r]
    check(l0[0] == l7[0] and l7[1:] != l0[1:], "adamw_torch_4bit trained as adamw_torch: %s" % l7)
    l8 = [r["loss"] for r in e.metrics("opt8") if "loss" in r]
    check(l0 == l8, "ao_adamw_8bit (float AdamW behind a note) trained differently from adamw_torch")


def checkpointing_offload(e):
    """Axolotl's older gradient_checkpointing: offload / offload_disk are checkpointing with
    activation_offloading true / disk: the same memory mode line and the same losses."""
    runs = {}
    for name, over in (("gc_plain", {"gradient_checkpointing": "true", "activation_offloading": "true"}),
                       ("gc_off", {"gradient_checkpointing": "offload"}),
                       ("gc_disk_plain", {"gradient_checkpointing": "true", "activation_offloading": "disk"}),
                       ("gc_disk", {"gradient_checkpointing": "offload_disk"})):
        rc, out, err = e.run(name, e.base(name, max_steps=3, **over))
        ok_run(rc, out, err)
        mode = re.search(r"^\| memory mode +(.*?) *\|$", out, re.M)
        check(mode, "%s: no memory mode line" % name)
        runs[name] = (mode.group(1), [r["loss"] for r in e.metrics(name) if "loss" in r], out)
    for a, b, ao in (("gc_plain", "gc_off", "true"), ("gc_disk_plain", "gc_disk", "disk")):
        check(runs[a][0] == runs[b][0], "%s ran as '%s', %s as '%s'" % (b, runs[b][0], a, runs[a][0]))
        check(runs[a][1] == runs[b][1] and len(runs[a][1]) == 3, "%s: losses differ from %s" % (b, a))
        check("note: gradient_checkpointing: %s runs as gradient_checkpointing: true with activation_offloading: %s"
              % (b == "gc_off" and "offload" or "offload_disk", ao) in runs[b][2], "%s: no note" % b)
    check("on disk" in runs["gc_disk"][0] and "on disk" not in runs["gc_off"][0], "tiers: %s / %s" % (
        runs["gc_off"][0], runs["gc_disk"][0]))
    rc, out, err = e.run("gc_clash", e.base("gc_clash", gradient_checkpointing="offload",
                                            activation_offloading="disk"))
    one_error(rc, err, "gradient_checkpointing: offload", "activation_offloading: true", "disk")


def epochs_and_steps(e):
    # 31 windows per epoch; accumulation 2 -> 15.5 steps per epoch; 2 epochs -> 31 steps
    rc, out, err = e.run("ep2", e.base("ep2", max_steps="DROP", num_epochs=2, gradient_accumulation_steps=2))
    ok_run(rc, out, err)
    check("2 epochs x 15.5 steps per epoch = 31 steps" in out, "no plan line: " + out[:600])
    check(train_steps(e.metrics("ep2"))[-1] == 31, "did not run 31 steps")
    rc, out, err = e.run("ep_default", e.base("ep_default", max_steps="DROP"))
    ok_run(rc, out, err)
    check("num_epochs not set: training 1 epoch" in out and "1 epochs x 31 steps per epoch = 31 steps" in out,
          "no default-epoch lines: " + out[:600])
    check(train_steps(e.metrics("ep_default"))[-1] == 31, "default did not run one epoch")
    rc, out, err = e.run("ep_max", e.base("ep_max", num_epochs=3, max_steps=5))
    ok_run(rc, out, err)
    check("max_steps overrides num_epochs" in out and train_steps(e.metrics("ep_max"))[-1] == 5,
          "max_steps did not override num_epochs")


def lr_schedule(e):
    rc, out, err = e.run("lr", e.base("lr", max_steps=20, warmup_ratio=0.15, cosine_min_lr_ratio=0.1,
                                      learning_rate=0.001, lr_scheduler="cosine"))
    ok_run(rc, out, err)
    check("warmup_ratio 0.15: 3 warmup steps" in out, "warmup_ratio not resolved: " + out[:500])
    lrs = [r["lr"] for r in e.metrics("lr") if "loss" in r]
    w, total, base, ratio = 3, 20, 0.001, 0.1
    for s, got in enumerate(lrs):
        if s < w:
            want = base * s / w
        else:
            prog = (s - w) / (total - w)
            want = base * (ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * prog)))
        check(abs(got - want) <= 1e-9 + 1e-6 * want, "lr at step %d: %g, want %g" % (s, got, want))
    check(min(lrs[w:]) >= base * ratio - 1e-12, "cosine went below the floor")
    # Axolotl's trainer builder: neither key -> int(0.03 x steps) capped at 100; int() of the
    # ratio's product (0.29 x 100 is 28.999... in doubles: 28, as in Python); its 1 -> 2 is noted.
    for name, over, want_w, line in (
            ("lr_default", dict(max_steps=70), 2, "warmup: 2 steps (neither warmup_steps nor warmup_ratio given"),
            ("lr_default_small", dict(max_steps=20), 0, None),
            ("lr_ratio_floor", dict(max_steps=100, warmup_ratio=0.29), 28, "warmup_ratio 0.29: 28 warmup steps"),
            ("lr_one", dict(max_steps=6, warmup_steps=1), 1, "note: a warmup of 1 step: Axolotl's trainer builder turns 1 into 2"),
            ("lr_ratio_one", dict(max_steps=10, warmup_ratio=0.1), 1, "note: a warmup of 1 step: Axolotl"),
            ("lr_zero", dict(max_steps=70, warmup_steps=0), 0, None)):
        cfg = e.base(name, learning_rate=0.001, lr_scheduler="constant_with_warmup", sequence_len=8, micro_batch_size=1,
                     **over)
        rc, out, err = e.run(name, cfg)
        ok_run(rc, out, err)
        lrs = [r["lr"] for r in e.metrics(name) if "loss" in r][:5]
        want = [0.001 * min(1.0, st / want_w) if want_w else 0.001 for st in range(len(lrs))]
        check(all(abs(a - b) <= 1e-12 for a, b in zip(lrs, want)) and (line is None or line in out)
              and (line is not None or "warmup:" not in out),
              "%s: lr %s, want a %d-step warmup %s; out: %s" % (name, lrs, want_w, want, out[:300]))
    # lr_scheduler constant is Hugging Face's get_constant_schedule (and llm.c's): no warmup at all,
    # said when warmup_steps asks for one; constant_with_warmup (above) has it.
    for name, over, line in (("lr_const", dict(warmup_steps=3), "note: lr_scheduler constant has no warmup"),
                             ("lr_const_default", {}, None)):
        rc, out, err = e.run(name, e.base(name, learning_rate=0.001, lr_scheduler="constant", max_steps=70,
                                          sequence_len=8, micro_batch_size=1, **over))
        ok_run(rc, out, err)
        lrs = [r["lr"] for r in e.metrics(name) if "loss" in r][:4]
        check(lrs == [0.001] * 4 and (line in out if line else "warmup:" not in out and "note: lr_sched" not in out),
              "%s: lr %s, want 0.001 from the first step; out: %s" % (name, lrs, out[:300]))
    rc, out, err = e.run("lr_both", e.base("lr_both", warmup_ratio=0.1, warmup_steps=2))
    one_error(rc, err, "warmup_steps", "warmup_ratio")
    rc, out, err = e.run("lr_lin", e.base("lr_lin", cosine_min_lr_ratio=0.1, lr_scheduler="linear"))
    one_error(rc, err, "cosine_min_lr_ratio", "cosine")
    # lr_quadratic_warmup: Axolotl's get_cosine_schedule_with_quadratic_warmup, (s / w)^2 then a
    # cosine to 0 (a cosine_min_lr_ratio beside it is dropped, with a note, as Axolotl warns)
    rc, out, err = e.run("lr_quad", e.base("lr_quad", max_steps=12, warmup_steps=5, learning_rate=0.001,
                                           lr_scheduler="cosine", lr_quadratic_warmup="true", cosine_min_lr_ratio=0.1))
    ok_run(rc, out, err)
    check("note: lr_quadratic_warmup: the cosine decays to 0, not to cosine_min_lr_ratio 0.1" in out,
          "no note for the dropped minimum: " + out[:400])
    lrs = [r["lr"] for r in e.metrics("lr_quad") if "loss" in r]
    w, total, base = 5, 12, 0.001
    for s, got in enumerate(lrs):
        want = base * (s / w) ** 2 if s < w else base * max(0.0, 0.5 * (1 + math.cos(math.pi * (s - w) / (total - w))))
        check(abs(got - want) <= 1e-12 + 1e-6 * want, "quadratic warmup: lr at step %d: %g, want %g" % (s, got, want))
    rc, out, err = e.run("lr_quad_lin", e.base("lr_quad_lin", lr_scheduler="linear", lr_quadratic_warmup="true"))
    ok_run(rc, out, err)
    check("note: lr_quadratic_warmup has no effect with lr_scheduler linear" in out, "no note for linear")


def eval_cadence(e):
    val = e.path("val.bin")
    rc, out, err = e.run("ev_frac", e.base("ev_frac", max_steps=8, val_data=val, eval_steps=0.25, eval_batches=1))
    ok_run(rc, out, err)
    ev = [r["step"] for r in e.metrics("ev_frac") if "val_loss" in r]
    check(ev == [2, 4, 6, 8], "eval_steps 0.25 of 8 evaluated at %s" % ev)
    # val_data without eval_steps: every epoch (31 steps) and at the end
    rc, out, err = e.run("ev_epoch", e.base("ev_epoch", max_steps="DROP", num_epochs=1.5, val_data=val,
                                            eval_batches=1))
    ok_run(rc, out, err)
    check("val_data without eval_steps: evaluating every epoch (every 31 steps)" in out, "no eval note: " + out[:700])
    ev = [r["step"] for r in e.metrics("ev_epoch") if "val_loss" in r]
    check(ev == [31, 47], "per-epoch evaluation at %s" % ev)
    rc, out, err = e.run("ev_per", e.base("ev_per", max_steps="DROP", val_data=val, evals_per_epoch=3,
                                          eval_batches=1))
    ok_run(rc, out, err)
    ev = [r["step"] for r in e.metrics("ev_per") if "val_loss" in r]
    check(ev == [10, 20, 30, 31], "evals_per_epoch 3 evaluated at %s" % ev)
    rc, out, err = e.run("ev_no", e.base("ev_no", val_data=val, eval_strategy="no"))
    ok_run(rc, out, err)
    check(not [r for r in e.metrics("ev_no") if "val_loss" in r], "eval_strategy: no evaluated")
    rc, out, err = e.run("ev_both", e.base("ev_both", val_data=val, eval_steps=2, evals_per_epoch=2))
    one_error(rc, err, "eval_steps", "evals_per_epoch")


def save_cadence_and_limit(e):
    rc, out, err = e.run("sv", e.base("sv", max_steps="DROP", num_epochs=2, saves_per_epoch=2,
                                      save_total_limit=2))
    ok_run(rc, out, err)
    ck = sorted(int(d.split("-")[1]) for d in os.listdir(e.path("sv", "out")) if d.startswith("checkpoint-"))
    check(ck == [60, 62], "checkpoints left: %s (want the last two: 60, 62)" % ck)
    saved = [int(x) for x in re.findall(r"saved .*checkpoint-(\d+)", out)]
    check(saved == [15, 30, 45, 60, 62], "saves_per_epoch 2 saved at %s" % saved)
    check("removed" in out, "no removal message")
    rc, out, err = e.run("sv1", e.base("sv1", max_steps=6, save_steps=0.5, save_total_limit=1))
    ok_run(rc, out, err)
    ck = [d for d in os.listdir(e.path("sv1", "out")) if d.startswith("checkpoint-")]
    check(ck == ["checkpoint-6"], "save_total_limit 1 left %s" % ck)


def early_stopping(e):
    val = e.path("val.bin")
    rc, out, err = e.run("es", e.base("es", max_steps=20, val_data=val, eval_steps=1, eval_batches=1,
                                      learning_rate=0, early_stopping_patience=2))
    ok_run(rc, out, err)
    check("early stopping at step 3" in out, "no early stop at step 3: " + out[-600:])
    check(train_steps(e.metrics("es"))[-1] == 3, "trained past the early stop")
    check(os.path.isfile(e.path("es", "out", "model.safetensors")), "no final model after early stopping")
    rc, out, err = e.run("es_noval", e.base("es_noval", early_stopping_patience=2))
    one_error(rc, err, "early_stopping_patience", "val_data")


def loss_watchdog(e):
    """Axolotl's loss watchdog: loss_watchdog_patience (default 3) steps in a row with a training
    loss above loss_watchdog_threshold stop the run, with a checkpoint and the final model."""
    for name, extra, stop in (("wd2", dict(loss_watchdog_threshold=0.01, loss_watchdog_patience=2), 2),
                              ("wd3", dict(loss_watchdog_threshold=0.01), 3),
                              ("wd_high", dict(loss_watchdog_threshold=100), None)):
        rc, out, err = e.run(name, e.base(name, max_steps=8, **extra))
        ok_run(rc, out, err)
        steps = train_steps(e.metrics(name))
        if stop:
            check("loss watchdog: loss above loss_watchdog_threshold 0.01 for %d steps in a row" % stop in out and
                  steps[-1] == stop, "%s: no watchdog stop at step %d (last step %s): %s" % (name, stop, steps[-1], out[-400:]))
            check(os.path.isfile(e.path(name, "out", "model.safetensors")) and
                  os.path.isdir(e.path(name, "out", "checkpoint-%d" % stop)),
                  "%s: no checkpoint-%d and final model after the watchdog stop" % (name, stop))
        else:
            check(steps[-1] == 8 and "loss watchdog" not in out, "%s: stopped below the threshold" % name)


def auto_resume(e):
    rc, out, err = e.run("ar", e.base("ar", max_steps=2, auto_resume_from_checkpoints="true"))
    ok_run(rc, out, err)
    check("found no checkpoint" in out, "first run did not look for a checkpoint")
    rc, out, err = e.run("ar", e.base("ar", max_steps=4, auto_resume_from_checkpoints="true"))
    ok_run(rc, out, err)
    check("resumed from" in out and "checkpoint-2" in out, "did not resume: " + out[-500:])


def make_hf_cache(e):
    """A tiny random model (a 1-step train_llama run) saved under HUB_ID in an HF cache layout."""
    rc, out, err = e.run("seed_model", e.base("seed_model", max_steps=1))
    ok_run(rc, out, err)
    src = e.path("seed_model", "out")
    hub = e.path("hf_home", "hub")
    repo = os.path.join(hub, "models--" + HUB_ID.replace("/", "--"))
    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = os.path.join(repo, "snapshots", rev)
    os.makedirs(snap)
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(os.path.join(repo, "refs"))
    for i, name in enumerate(["config.json", "model.safetensors"]):
        blob = os.path.join(repo, "blobs", "blob%d" % i)
        shutil.copy(os.path.join(src, name), blob)
        os.symlink(os.path.join("..", "..", "blobs", "blob%d" % i), os.path.join(snap, name))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(rev)
    return snap


def hub_id(e, snap):
    env = {"HF_HOME": e.path("hf_home"), "HF_HUB_CACHE": ""}
    rc, out, err = e.run("hub", e.base("hub", model="DROP", base_model=HUB_ID), env=env)
    ok_run(rc, out, err)
    check("base_model %s: %s (Hugging Face cache)" % (HUB_ID, snap) in out, "no resolution line: " + out[:400])
    env2 = {"HF_HUB_CACHE": e.path("hf_home", "hub")}
    rc, out, err = e.run("hub2", e.base("hub2", model="DROP", base_model=HUB_ID), env=env2)
    ok_run(rc, out, err)
    # A cache copied by hand without refs/: the repository's only snapshot.
    hub = os.path.dirname(os.path.dirname(os.path.dirname(snap)))
    copied = os.path.join(hub, "models--acme--copied", "snapshots", "abc123")
    os.makedirs(copied)
    for name in ("config.json", "model.safetensors"):
        os.symlink(os.path.realpath(os.path.join(snap, name)), os.path.join(copied, name))
    rc, out, err = e.run("hub_copied", e.base("hub_copied", model="DROP", base_model="acme/copied", max_steps=1), env=env)
    ok_run(rc, out, err)
    check("base_model acme/copied: %s (Hugging Face cache)" % copied in out, "no only-snapshot resolution: " + out[:400])
    rc, out, err = e.run("hub_missing", e.base("hub_missing", model="DROP", base_model="nobody/no-such-model"),
                         env=env)
    one_error(rc, err, "nobody/no-such-model", "models--nobody--no-such-model",
              "huggingface-cli download nobody/no-such-model")
    # revision_of_model (alias model_revision): a tag through refs/, or a commit's snapshot.
    repo = os.path.dirname(os.path.dirname(snap))
    rev2 = "fedcba9876543210fedcba9876543210fedcba98"
    snap2 = os.path.join(repo, "snapshots", rev2)
    os.makedirs(snap2)
    cj = json.load(open(os.path.join(snap, "config.json")))
    cj["rope_theta"] = 123456.0
    with open(os.path.join(repo, "blobs", "blob_v2"), "w") as f:
        json.dump(cj, f)
    os.symlink(os.path.join("..", "..", "blobs", "blob_v2"), os.path.join(snap2, "config.json"))
    os.symlink(os.path.join(snap, "model.safetensors"), os.path.join(snap2, "model.safetensors"))
    with open(os.path.join(repo, "refs", "v2"), "w") as f:
        f.write(rev2 + "\n")
    for name, over in (("hub_tag", dict(revision_of_model="v2")), ("hub_commit", dict(model_revision=rev2))):
        rc, out, err = e.run(name, e.base(name, model="DROP", base_model=HUB_ID, max_steps=1, **over), env=env)
        ok_run(rc, out, err)
        r = over.get("revision_of_model") or over.get("model_revision")
        check("base_model %s at revision %s: %s (Hugging Face cache)" % (HUB_ID, r, snap2) in out,
              "%s: not resolved to the revision's snapshot: %s" % (name, out[:400]))
        saved = json.load(open(e.path(name, "out", "config.json")))
        check(saved.get("rope_theta") == 123456.0, "%s: trained from another snapshot's config.json" % name)
    rc, out, err = e.run("hub_norev", e.base("hub_norev", model="DROP", base_model=HUB_ID, revision_of_model="v9"),
                         env=env)
    one_error(rc, err, "refs/v9", "--revision v9")
    rc, out, err = e.run("hub_badrev", e.base("hub_badrev", model="DROP", base_model=HUB_ID,
                                              revision_of_model="../../x"), env=env)
    one_error(rc, err, "revision_of_model '../../x'", "no '..'")
    rc, out, err = e.run("hub_localrev", e.base("hub_localrev", model="DROP", base_model=snap, revision_of_model="v2",
                                                max_steps=1), env=env)
    ok_run(rc, out, err)
    check("note: revision_of_model (v2) has no effect here" in out, "no note for a local base_model's revision")


def example_configs(e, snap):
    """configs/axolotl/*.yaml as written, with paths and sizes pointed at the tiny fixtures."""
    env = {"HF_HOME": e.path("hf_home"), "HF_HUB_CACHE": ""}
    for name in sorted(os.listdir(os.path.join(ROOT, "configs", "axolotl"))):
        if not name.endswith(".yaml"):
            continue
        case = "ex_" + name[:-5]
        sets = ["train_data=" + e.path("train.bin"), "val_data=" + e.path("val.bin"),
                "output_dir=" + e.path(case, "out"), "sequence_len=32", "micro_batch_size=2",
                "gradient_accumulation_steps=2", "eval_batches=1", "num_threads=1", "warmup_steps=0"]
        if "lora" in name:
            sets.append("lora_r=4")
        with open(os.path.join(ROOT, "configs", "axolotl", name)) as f:
            text = f.read()
        ds = re.search(r"^deepspeed: (\S+)", text, re.M)  # beside the config, which e.run copies away
        if ds:
            sets.append("deepspeed=" + os.path.join(ROOT, "configs", "axolotl", ds.group(1)))
        rc, out, err = e.run(case, text, *sets, env=env)
        ok_run(rc, out, err)
        check(os.path.isfile(e.path(case, "out", "metrics.jsonl")), name + ": no metrics")
        if name == "llama-3-qlora-fsdp.yaml":
            for needle in ("fsdp_offload_params: true runs as layer_offloading: true",
                           "model_config sets rope_theta on", "model_config.use_cache has no effect"):
                check(needle in out, "%s: output lacks %r" % (name, needle))
            check(re.search(r"host [1-9][0-9.]* [KM]iB", out), name + ": nothing in host memory")
            check(json.load(open(e.path(case, "out", "adapter_config.json"))) is not None, name + ": no adapter")
        if name == "llama-3-fft-offload.yaml":
            check("offload_param: the full fine-tune runs as zero_stage 3 with its pieces" in out,
                  "%s: no offload_params note" % name)
            check("| state        ZeRO-3 over 1 rank; on host: weights+grads, AdamW+master" in out,
                  "%s: the config box does not show the state in host memory" % name)
            check(os.path.isfile(e.path(case, "out", "model.safetensors")), name + ": no model")
        if name == "llama-3-lora.yaml":
            for needle in ("note: wandb_project has no effect here", "note: flash_attention has no effect here",
                           "note: optimizer adamw_bnb_8bit", "note: bf16: auto",
                           "2 epochs x 15.5 steps per epoch = 31 steps",
                           "base_model %s: %s" % (HUB_ID, snap)):
                check(needle in out, "%s: output lacks %r" % (name, needle))
            ck = sorted(d for d in os.listdir(e.path(case, "out")) if d.startswith("checkpoint-"))
            check(len(ck) <= 2 and "checkpoint-31" in ck, "%s: checkpoints %s" % (name, ck))
            check(os.path.isfile(e.path(case, "out", "adapter_model.safetensors")), name + ": no adapter")
            ev = [r["step"] for r in e.metrics(case) if "val_loss" in r]
            check(ev == [8, 16, 24, 31], "%s: evaluated at %s" % (name, ev))


def reinit_weights(e):
    """reinit_weights: base_model's architecture (config.json) with transformers' random init:
    N(0, initializer_range) matrices, norms 1, the padding row 0; its weights are not read."""
    rc, out, err = e.run("reinit_src", e.base("reinit_src", max_steps=1))
    ok_run(rc, out, err)
    src = e.path("reinit_src", "out")
    cj = json.load(open(os.path.join(src, "config.json")))
    cj.update(initializer_range=0.05, pad_token_id=3)
    json.dump(cj, open(os.path.join(src, "config.json"), "w"))
    rc, out, err = e.run("reinit", e.base("reinit", model="DROP", base_model=src, reinit_weights="true",
                                          learning_rate=0.0, max_steps=1))
    ok_run(rc, out, err)
    check("note: reinit_weights: %s's weights are not read; random init N(0, 0.05)" % src in out, "no note: " + out[:300])
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "test"))
    import llama_ref as R
    w = R.read_safetensors(os.path.join(e.path("reinit", "out"), "model.safetensors"))
    base = R.read_safetensors(os.path.join(src, "model.safetensors"))
    mats = np.concatenate([np.asarray(v, np.float64).ravel() for k, v in w.items() if np.asarray(v).ndim == 2])
    emb = np.asarray(w["model.embed_tokens.weight"])
    std = float(np.std(mats))
    check(abs(std / 0.05 - 1) < 0.08, "matrices' std %.4f, expected initializer_range 0.05" % std)
    check(not np.any(emb[3]), "the padding row (pad_token_id 3) is not zero")
    norms = [k for k, v in w.items() if np.asarray(v).ndim == 1 and "norm" in k]
    check(norms and all(np.all(np.asarray(w[k]) == 1) for k in norms), "norm weights are not all 1")
    check(all(not np.array_equal(np.asarray(w[k]), np.asarray(base[k])) for k in w if np.asarray(w[k]).ndim == 2),
          "a matrix equals the base model's")
    check(json.load(open(e.path("reinit", "out", "config.json")))["initializer_range"] == 0.05,
          "the saved config.json lost initializer_range")
    rc, out, err = e.run("reinit_block", e.base("reinit_block", reinit_weights="true"))
    one_error(rc, err, "reinit_weights", "base_model")


def unfrozen_parameters(e):
    """unfrozen_parameters trains the matching tensors only (checked against the PyTorch
    reference in test_torch_ref k); what it cannot do is refused in one line."""
    rc, out, err = e.run("unf_all", e.base("unf_all"))
    ok_run(rc, out, err)
    total = int(re.search(r"\(trainable (\d+)\)", out).group(1))
    rc, out, err = e.run("unf", yaml_text(e.base("unf")) + "unfrozen_parameters:\n  - model.layers.0.mlp.+\n"
                         "  - \"^model.norm.weight$\"\n")
    ok_run(rc, out, err)
    m = MODEL
    want = 3 * m["hidden_size"] * m["intermediate_size"] + m["hidden_size"]
    got = int(re.search(r"\(trainable (\d+)\)", out).group(1))
    check(got == want and got < total, "trainable %d, expected %d of %d" % (got, want, total))
    # Axolotl's row ranges (the numbers are checked against PyTorch in test_torch_ref l): a range
    # outside the tensor, or one that ends before it starts, is refused as Axolotl raises.
    for i, (pats, needles) in enumerate(((["model.embed_tokens.weight$[:300]"], ("rows [0, 300)", "256 rows")),
                                         (["model.norm.weight[9:3]"], ("end must be greater",)),
                                         (["model.layers.\\d+.mlp"], ("\\d", "Python")),
                                         (["(?:model).norm"], ("(?",)),
                                         (["nothing.matches"], ("matches none",)),
                                         (["model.layers.1++"], ("quantifier on a quantifier",)),
                                         (["(m)(o)\\1"], ("backreference",)),
                                         (["((((((((((model))))))))).norm"], ("nested more than 8",)),
                                         (["(model.layers.[0-9]{200}){100}"], ("4096 copies",)))):
        text = yaml_text(e.base("unf_bad%d" % i)) + "unfrozen_parameters:\n" + "".join(
            "  - '%s'\n" % p for p in pats)
        rc, out, err = e.run("unf_bad%d" % i, text)
        one_error(rc, err, "unfrozen_parameters", *needles)
    rc, out, err = e.run("unf_lora", yaml_text(e.base("unf_lora", adapter="lora", lora_target_linear="true")) +
                         "unfrozen_parameters: [model.norm]\n")
    one_error(rc, err, "unfrozen_parameters", "adapter: lora")


def deepspeed_files(e):
    """deepspeed: a DeepSpeed JSON file (the keys of Axolotl's deepspeed_configs/) onto
    zero_stage and offload_optimizer; the rest refused or noted by name."""
    def ds(name, d):
        path = e.path("ds_" + name + ".json")
        with open(path, "w") as f:
            json.dump(d, f)
        return path
    auto = {"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto", "loss_scale": 0},
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False}
    rc, out, err = e.run("ds_plain", e.base("ds_plain"))
    ok_run(rc, out, err)
    plain = [r["loss"] for r in e.metrics("ds_plain") if "loss" in r]
    for stage, extra, want in ((1, {"overlap_comm": True}, "runs as zero_stage 1"),
                               (2, {"offload_optimizer": {"device": "cpu", "pin_memory": True}},
                                "ZeRO stage 2 runs as zero_stage 1 (the same numbers"),
                               (3, {"stage3_prefetch_bucket_size": "auto", "sub_group_size": 0},
                                "runs as zero_stage 3")):
        name = "ds_z%d" % stage
        path = ds(name, dict(auto, zero_optimization=dict({"stage": stage}, **extra)))
        rc, out, err = e.run(name, e.base(name, deepspeed=path))
        ok_run(rc, out, err)
        check(want in out, "%s: no mapping note: %s" % (name, out[:400]))
        check(re.search(r"^note: deepspeed .*(overlap_comm|stage3_prefetch_bucket_size|pin_memory).* have no "
                        r"effect here", out, re.M), "%s: no note for the tuning keys" % name)
        got = [r["loss"] for r in e.metrics(name) if "loss" in r]
        check(got == plain, "%s: losses %s differ from the plain run's %s" % (name, got, plain))
        if stage == 2:
            check("with offload_optimizer: true" in out and re.search(r"host [1-9][0-9.]* [KM]iB", out),
                  "stage 2: the optimizer state did not go to the host: " + out[-300:])
    name = "ds_param"
    lora = dict(adapter="lora", lora_r=4, lora_alpha=8, lora_target_linear="true")
    rc, out, err = e.run("ds_lora", e.base("ds_lora", **lora))
    ok_run(rc, out, err)
    path = ds(name, dict(auto, zero_optimization={"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True},
                                                  "offload_optimizer": {"device": "cpu"}}))
    rc, out, err = e.run(name, e.base(name, deepspeed=path, **lora))
    ok_run(rc, out, err)
    check("offload_param runs as layer_offloading: true" in out, "offload_param: no note: " + out[:500])
    check([r["loss"] for r in e.metrics(name) if "loss" in r] == [r["loss"] for r in e.metrics("ds_lora") if "loss" in r],
          "offload_param: the losses differ from the plain adapter run's")
    # A full fine-tune: ZeRO-3 with the weights' pieces in host memory; without
    # offload_optimizer in the file the update moves to the host too (noted)
    name = "ds_param_full"
    path = ds(name, dict(auto, zero_optimization={"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True}}))
    rc, out, err = e.run(name, e.base(name, deepspeed=path))
    ok_run(rc, out, err)
    check("offload_param: the full fine-tune runs as zero_stage 3 with its pieces" in out and
          "offload_optimizer: true (set by it" in out, "offload_param (full): no note: " + out[:600])
    check([r["loss"] for r in e.metrics(name) if "loss" in r] == plain,
          "offload_param (full): the losses differ from the plain run's")
    bad = ((dict(auto, zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}}),
            ("offload_param", "zero_stage 1", "zero_stage: 3")),
           (dict(auto, zero_optimization={"stage": 3, "offload_param": {"device": "nvme"}}), ("offload_param.device nvme",)),
           (dict(auto, zero_optimization={"stage": 1, "offload_optimizer": {"device": "nvme"}}), ("nvme",)),
           (dict(auto, bf16={"enabled": False}), ("bf16.enabled false", "bfloat16")),
           (dict(auto, fp16={"enabled": True}), ("fp16.enabled",)),
           (dict(auto, gradient_clipping=0.5), ("gradient_clipping 0.5", "max_grad_norm")),
           (dict(auto, train_micro_batch_size_per_gpu=4), ("train_micro_batch_size_per_gpu 4",)),
           (dict(auto, optimizer={"type": "AdamW"}), ("optimizer", "lr_scheduler")),
           (dict(auto, zero_optimization={"stage": 3, "frobnicate": 1}), ("zero_optimization.frobnicate",)),
           (dict(auto, frobnicate=1), ("frobnicate",)))
    for i, (d, needles) in enumerate(bad):
        name = "ds_bad%d" % i
        rc, out, err = e.run(name, e.base(name, deepspeed=ds(name, d)))
        one_error(rc, err, *needles)
    rc, out, err = e.run("ds_clash", e.base("ds_clash", deepspeed=ds("clash", dict(auto, zero_optimization={"stage": 3})),
                                            zero_stage=1))
    one_error(rc, err, "ZeRO stage 3", "zero_stage is 1")
    rc, out, err = e.run("ds_missing", e.base("ds_missing", deepspeed="deepspeed_configs/zero9.json"))
    one_error(rc, err, "deepspeed", "zero9.json", "not a file")


def curriculum_sampling(e):
    """curriculum_sampling: true (Axolotl's sequential sampler) is shuffle: false."""
    rc, out, err = e.run("cs_off", e.base("cs_off", shuffle="false", max_steps=4))
    ok_run(rc, out, err)
    rc, out, err = e.run("cs", e.base("cs", curriculum_sampling="true", max_steps=4))
    ok_run(rc, out, err)
    check("note: curriculum_sampling: true runs as shuffle: false" in out, "no note: " + out[:300])
    rc2, out2, err2 = e.run("cs_on", e.base("cs_on", max_steps=4))
    ok_run(rc2, out2, err2)
    a, b, c = ([r["loss"] for r in e.metrics(n) if "loss" in r] for n in ("cs", "cs_off", "cs_on"))
    check(a == b and a != c, "curriculum_sampling %s, shuffle false %s, shuffled %s" % (a, b, c))


def modules_to_save_refusals(e):
    """lora_modules_to_save (checked against the PyTorch reference in test_lora_ref): what it
    cannot do is refused in one line."""
    lora = dict(adapter="lora", lora_target_linear="true")
    rc, out, err = e.run("mts_ok", e.base("mts_ok", lora_modules_to_save="[embed_tokens, lm_head]", **lora))
    ok_run(rc, out, err)
    m = MODEL
    lora_n = int(re.search(r"\(trainable (\d+)\)", out).group(1))
    rc, out, err = e.run("mts_none", e.base("mts_none", **lora))
    ok_run(rc, out, err)
    base_n = int(re.search(r"\(trainable (\d+)\)", out).group(1))
    check(lora_n - base_n == 2 * m["vocab_size"] * m["hidden_size"], "trainable %d vs %d" % (lora_n, base_n))
    tied = dict(MODEL, tie_word_embeddings="true")
    for i, (over, needles) in enumerate(((dict(lora_modules_to_save="[norm]", **lora), ("'norm'", "embed_tokens")),
                                         (dict(lora_modules_to_save="[lm_head]", model=tied, **lora), ("ties",)),
                                         (dict(lora_modules_to_save="[lm_head]"), ("adapter",)))):
        rc, out, err = e.run("mts_bad%d" % i, e.base("mts_bad%d" % i, **over))
        one_error(rc, err, "lora_modules_to_save", *needles)


def model_config_overrides(e):
    """model_config (Axolotl's overrides_of_model_config): keys set on base_model's config before
    the model is built train exactly as the same keys written into config.json, and the saved
    config.json has them; keys without effect are noted; shape keys, keys transformers derives,
    unknown keys and a second rope_scaling are refused."""
    rc, out, err = e.run("mc_src", e.base("mc_src", max_steps=1))
    ok_run(rc, out, err)
    src = e.path("mc_src", "out")
    edit = e.path("mc_edit_model")
    shutil.copytree(src, edit)
    over = {"rope_theta": 500000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    cj = json.load(open(os.path.join(edit, "config.json")))
    cj.update(over)
    json.dump(cj, open(os.path.join(edit, "config.json"), "w"))

    def cfg_text(name, base, extra=""):
        c = e.base(name, model="DROP", base_model=base, max_steps=3)
        return yaml_text(c) + extra

    block = ("model_config:\n  rope_theta: 500000.0\n  rms_norm_eps: 1.0e-6\n  max_position_embeddings: 128\n"
             "  rope_scaling:\n    rope_type: linear\n    factor: 2.0\n  use_cache: false\n")
    rc, out, err = e.run("mc_over", cfg_text("mc_over", src, block))
    ok_run(rc, out, err)
    check("model_config sets rope_theta, rms_norm_eps, max_position_embeddings, rope_scaling on" in out,
          "no note of the keys set: " + out[:600])
    check("model_config.use_cache has no effect" in out, "no note for use_cache")
    rc, out, err = e.run("mc_edit", cfg_text("mc_edit", edit))
    ok_run(rc, out, err)
    rc, out, err = e.run("mc_plain", cfg_text("mc_plain", src))
    ok_run(rc, out, err)
    a, b, c = (e.metrics(n) for n in ("mc_over", "mc_edit", "mc_plain"))
    la, lb, lc = ([r["loss"] for r in m if "loss" in r] for m in (a, b, c))
    check(la and la == lb, "losses with model_config %s differ from the edited config.json's %s" % (la, lb))
    check(la[1:] != lc[1:], "model_config changed nothing: %s vs %s" % (la, lc))
    saved = json.load(open(e.path("mc_over", "out", "config.json")))
    for k, v in over.items():
        got = saved.get(k)
        if k == "rope_scaling":
            got = {kk: got.get(kk) for kk in v} if isinstance(got, dict) else got
        check(got == v, "saved config.json has %s = %r, expected %r" % (k, got, v))
    # the long spelling, and a shape key at the file's own value, are accepted (--plan)
    rc, out, err = e.run("mc_long", cfg_text("mc_long", src, "overrides_of_model_config:\n  hidden_size: 16\n"), "--plan")
    ok_run(rc, out, err)
    refusals = (("model_config:\n  hidden_size: 32\n", ("model_config.hidden_size", "shape")),
                ("model_config:\n  num_hidden_layers: 2\n", ("model_config.num_hidden_layers", "shape")),
                ("model_config:\n  rope_thetta: 1\n", ("model_config.rope_thetta", "not a config.json key")),
                ("model_config:\n  use_sliding_window: true\n", ("model_config.use_sliding_window", "derives")),
                ("model_config:\n  rope_theta: -1\n", ("with model_config", "rope_theta")),
                ("model_config: 5\n", ("'model_config' expects a mapping",)),
                ("model_config:\n  rope_theta: 1.0e6\noverrides_of_model_config:\n  rope_theta: 1.0e6\n",
                 ("same setting",)),
                ("rope_scaling:\n  rope_type: linear\n  factor: 2.0\nmodel_config:\n  rope_scaling:\n"
                 "    rope_type: linear\n    factor: 2.0\n", ("rope_scaling is given twice",)))
    for i, (extra, needles) in enumerate(refusals):
        rc, out, err = e.run("mc_bad%d" % i, cfg_text("mc_bad%d" % i, src, extra), "--plan")
        one_error(rc, err, *needles)
    rc, out, err = e.run("mc_block", yaml_text(e.base("mc_block")) + "model_config:\n  rope_theta: 1.0e6\n", "--plan")
    one_error(rc, err, "model_config", "model: block")


def batch_size_key(e):
    """batch_size (Axolotl's rows per step) sets gradient_accumulation_steps = batch_size /
    micro_batch_size: the same losses as the accumulation written out; a remainder or a
    disagreeing gradient_accumulation_steps is refused."""
    rc, out, err = e.run("bs_key", e.base("bs_key", batch_size=6, max_steps=3))
    ok_run(rc, out, err)
    rc, out, err = e.run("bs_gas", e.base("bs_gas", gradient_accumulation_steps=3, max_steps=3))
    ok_run(rc, out, err)
    rc, out, err = e.run("bs_one", e.base("bs_one", max_steps=3))
    ok_run(rc, out, err)
    la, lb, lc = ([r["loss"] for r in e.metrics(n) if "loss" in r] for n in ("bs_key", "bs_gas", "bs_one"))
    check(la and la == lb, "batch_size 6 gave %s, gradient_accumulation_steps 3 %s" % (la, lb))
    check(la != lc, "batch_size changed nothing")
    rc, out, err = e.run("bs_both", e.base("bs_both", batch_size=6, gradient_accumulation_steps=3), "--plan")
    ok_run(rc, out, err)
    for i, (over, needles) in enumerate(((dict(batch_size=5), ("batch_size 5", "multiple of micro_batch_size 2")),
                                         (dict(batch_size=6, gradient_accumulation_steps=2),
                                          ("batch_size 6", "gradient_accumulation_steps 2")))):
        rc, out, err = e.run("bs_bad%d" % i, e.base("bs_bad%d" % i, **over), "--plan")
        one_error(rc, err, *needles)


def lisa(e):
    """LISA (its numbers are checked against PyTorch in test_torch_ref m): what it cannot do is
    refused in one line, one key alone is noted and changes nothing (Axolotl needs both), and a
    run resumed from a LISA checkpoint redraws the same layers and keeps each layer's AdamW count:
    the same weights, bit for bit, as the unbroken run; a checkpoint of the other kind is refused.
    Drawing every layer gives the plain run's weights bit for bit."""
    m = dict(MODEL, num_hidden_layers=3)
    on = dict(lisa_n_layers=1, lisa_step_interval=2)
    for name, over, needles in (
            ("lisa_lora", dict(adapter="lora", lora_target_linear="true"), ("lisa_n_layers", "adapter: lora")),
            ("lisa_many", dict(lisa_n_layers=4), ("lisa_n_layers 4", "3 decoder layers")),
            ("lisa_attr", dict(lisa_layers_attribute="model.model.layers"), ("lisa_layers_attribute", "'model.layers'"))):
        rc, out, err = e.run(name, e.base(name, model=m, **dict(on, **over)))
        one_error(rc, err, *needles)
    rc, out, err = e.run("lisa_unf", yaml_text(e.base("lisa_unf", model=m, **on)) + "unfrozen_parameters: [model.norm]\n")
    one_error(rc, err, "lisa_n_layers", "unfrozen_parameters")
    rc, out, err = e.run("lisa_plain", e.base("lisa_plain", model=m, max_steps=4))
    ok_run(rc, out, err)
    rc, out, err = e.run("lisa_half", e.base("lisa_half", model=m, max_steps=4, lisa_n_layers=1))
    ok_run(rc, out, err)
    check("note: lisa_n_layers has no effect without lisa_step_interval" in out and "LISA:" not in out,
          "one LISA key alone: " + out[:400])
    plain = [r["loss"] for r in e.metrics("lisa_plain") if "loss" in r]
    check([r["loss"] for r in e.metrics("lisa_half") if "loss" in r] == plain, "lisa_n_layers alone changed the losses")
    # Every layer drawn every time: each layer's AdamW count is the step's, so the plain run, bit for bit.
    rc, out, err = e.run("lisa_all", e.base("lisa_all", model=m, max_steps=4, lisa_n_layers=3, lisa_step_interval=2))
    ok_run(rc, out, err)
    with open(e.path("lisa_all", "out", "model.safetensors"), "rb") as a, open(e.path("lisa_plain", "out", "model.safetensors"), "rb") as b:
        check(a.read() == b.read(), "lisa_n_layers = the layer count: the weights differ from the plain run's")
    rc, out, err = e.run("lisa_full", e.base("lisa_full", model=m, max_steps=6, save_steps=3, **on))
    ok_run(rc, out, err)
    draws = re.findall(r"^LISA: from step (\d+) the layers ([\d, ]+) train$", out, re.M)
    check([d[0] for d in draws] == ["1", "2", "3", "5"], "LISA drew at steps %s, expected 1, 2, 3 and 5" % draws)
    check([r["loss"] for r in e.metrics("lisa_full") if "loss" in r][:4] != plain, "LISA changed no loss")
    # Gradients for the drawn layer alone (zero_stage 0): two layers' float gradients less at the
    # peak than the plain run; ZeRO-1 (one process) keeps every layer's place and must give the
    # same weights bit for bit.
    rc, out, err = e.run("lisa_z1", e.base("lisa_z1", model=m, max_steps=6, zero_stage=1, **on))
    ok_run(rc, out, err)
    with open(e.path("lisa_full", "out", "model.safetensors"), "rb") as a, open(e.path("lisa_z1", "out", "model.safetensors"), "rb") as b:
        check(a.read() == b.read(), "LISA: the drawn layers' gradient slots (zero_stage 0) and every layer's place "
              "(zero_stage 1) gave different weights")
    with open(e.path("lisa_plain", "out", "model.safetensors"), "rb") as f:
        head = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    layer = sum(math.prod(v["shape"]) for k, v in head.items() if k.startswith("model.layers.0."))
    peak = {k: max(r["device_peak_bytes"] for r in e.metrics(k) if "device_peak_bytes" in r) for k in ("lisa_plain", "lisa_full", "lisa_z1")}
    check(peak["lisa_plain"] - peak["lisa_full"] == 2 * layer * 4 and peak["lisa_z1"] == peak["lisa_plain"],
          "LISA's device peak %s, expected the plain run's less 2 layers of %d float gradients" % (peak, layer))
    os.makedirs(e.path("lisa_res", "out"), exist_ok=True)
    shutil.copytree(e.path("lisa_full", "out", "checkpoint-3"), e.path("lisa_res", "out", "checkpoint-3"))
    rc, out, err = e.run("lisa_res", e.base("lisa_res", model=m, max_steps=6, resume_from_checkpoint="auto", **on))
    ok_run(rc, out, err)
    check("resumed from" in out and "LISA: from step 4 the layers %s train" % draws[2][1] in out,
          "the resumed run did not redraw step 3's layers: " + out[-600:])
    with open(e.path("lisa_full", "out", "model.safetensors"), "rb") as a, open(e.path("lisa_res", "out", "model.safetensors"), "rb") as b:
        check(a.read() == b.read(), "resumed from checkpoint-3: the final weights differ from the unbroken run's")
    ck = e.path("lisa_full", "out", "checkpoint-3")
    rc, out, err = e.run("lisa_res_off", e.base("lisa_res_off", model=m, max_steps=6, resume_from_checkpoint=ck))
    one_error(rc, err, "written by a LISA run")
    rc, out, err = e.run("lisa_res_iv", e.base("lisa_res_iv", model=m, max_steps=6, resume_from_checkpoint=ck,
                                                lisa_n_layers=1, lisa_step_interval=3))
    one_error(rc, err, "lisa=1 layers every 2 steps", "lisa=1 layers every 3 steps")
    rc, out, err = e.run("lisa_res_plain", e.base("lisa_res_plain", model=m, max_steps=6, save_steps=3))
    ok_run(rc, out, err)
    rc, out, err = e.run("lisa_res_on", e.base("lisa_res_on", model=m, max_steps=6, **on,
                                                resume_from_checkpoint=e.path("lisa_res_plain", "out", "checkpoint-3")))
    one_error(rc, err, "written without LISA")


CASES = [plugins_by_kind, unknown_keys_listed_together, single_unknown_key_names_line, set_unknown_key_no_far_suggestion,
         notes_for_no_effect_keys, refused_keys, datasets_keys_refused, type_tolerance, precision_keys,
         fsdp_forms, optimizer_family, checkpointing_offload, epochs_and_steps, lr_schedule, eval_cadence,
         save_cadence_and_limit, early_stopping, loss_watchdog, bnb_config, auto_resume, reinit_weights,
         unfrozen_parameters, deepspeed_files, curriculum_sampling,
         modules_to_save_refusals, model_config_overrides, batch_size_key, lisa]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    root = tempfile.mkdtemp(prefix="axolotl_cfg_")
    e = Env(binary, root)
    results = []

    def run(fn, *a):
        try:
            fn(e, *a)
            return fn.__name__, ""
        except Fail as x:
            return fn.__name__, str(x)
        except Exception as x:  # a crash of the test itself is a failure too
            return fn.__name__, "%s: %s" % (type(x).__name__, x)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(run, fn) for fn in CASES if args.k in fn.__name__]
        snap = None
        if args.k in "hub_id example_configs":
            try:
                snap = make_hf_cache(e)
            except Fail as x:
                results.append(("hf_cache_fixture", str(x)))
        if snap:
            futs += [pool.submit(run, fn, snap) for fn in (hub_id, example_configs) if args.k in fn.__name__]
        results += [f.result() for f in futs]
    failed = 0
    for name, why in results:
        if why:
            failed += 1
            print("FAIL %s: %s" % (name, why))
        else:
            print("PASS %s" % name)
    print("%d passed, %d failed" % (len(results) - failed, failed))
    if not failed:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
