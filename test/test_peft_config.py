#!/usr/bin/python3
"""adapter_config.json read with PEFT's matching rules, written with peft 0.11+'s fields
(issue 13, item 3).

An adapter trained here is loaded back through lora_model_dir with its target_modules written
in every form PEFT accepts (short names, full module paths, a regex string, "all-linear",
layers_to_transform over every layer): each gives the same first-step loss, bit for bit, as
the short-name form. Options that would train something else are refused by name: DoRA,
rank/alpha patterns, modules_to_save, trained biases, fan_in_fan_out, another peft_type,
targets outside the decoder projections, an adapter on a subset of layers when the run config
selects all of them (per-layer targeting itself: test_peft_layers.py), a regex matching nothing.
Usage: /usr/bin/python3 test/test_peft_config.py --bin build/train_llama
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

from checks import check, finish, run_trainer, tiny_model_yaml, write_shard

CFG = tiny_model_yaml(layers=2) + """train_data: {data}
sequence_len: 8
micro_batch_size: 2
max_steps: 2
num_threads: 1
learning_rate: 1e-2
adapter: lora
lora_r: 2
lora_alpha: 4
output_dir: {out}
"""
PEFT_011_FIELDS = {"peft_type", "task_type", "base_model_name_or_path", "revision", "inference_mode",
                   "r", "target_modules", "lora_alpha", "lora_dropout", "fan_in_fan_out", "bias",
                   "use_rslora", "modules_to_save", "init_lora_weights", "layers_to_transform",
                   "layers_pattern", "rank_pattern", "alpha_pattern", "megatron_config",
                   "megatron_core", "loftq_config", "use_dora", "layer_replication"}


def run(binary, cwd, *sets):
    """Trains with the shared cfg.yaml beside cwd: (exit code, stderr)."""
    rc, _, err = run_trainer(binary, os.path.join(cwd, "..", "cfg.yaml"), *sets, cwd=cwd)
    return rc, err


def first_loss(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return json.loads(f.readline())["loss"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    root = tempfile.mkdtemp(prefix="test_peft_config.")
    try:
        toks = [(i * 11) % 91 for i in range(3000)]
        data = os.path.join(root, "train.bin")
        write_shard(data, toks)
        with open(os.path.join(root, "cfg.yaml"), "w") as f:
            f.write(CFG.format(data=data, out="out"))
        work = os.path.join(root, "w")
        os.makedirs(work)
        rc, err = run(binary, work, "lora_target_modules=q_proj,v_proj", "output_dir=qv")
        rc2, err2 = run(binary, work, "lora_target_linear=true", "output_dir=all")
        if rc or rc2:
            sys.exit("FAIL setup: %s %s" % (err, err2))
        written = json.load(open(os.path.join(work, "qv", "adapter_config.json")))
        check("written adapter_config.json has peft 0.11's fields",
              PEFT_011_FIELDS <= set(written) and written["target_modules"] == ["q_proj", "v_proj"],
              repr(sorted(set(PEFT_011_FIELDS) - set(written))))

        def variant(src, name, **edit):
            d = os.path.join(work, name)
            shutil.copytree(os.path.join(work, src), d)
            p = os.path.join(d, "adapter_config.json")
            c = json.load(open(p))
            c.update(edit)
            json.dump(c, open(p, "w"))
            return d

        def loss_with(adapter, *extra):
            out = os.path.join(work, "run_" + os.path.basename(adapter))
            rc, err = run(binary, work, "lora_model_dir=" + adapter, "max_steps=1", "output_dir=" + out, *extra)
            return (first_loss(out) if rc == 0 else None), err

        ref, err = loss_with(os.path.join(work, "qv"), "lora_target_modules=q_proj,v_proj")
        check("reference: the adapter loads as written", ref is not None, err)
        full = ["model.layers.%d.self_attn.%s" % (l, t) for l in (0, 1) for t in ("q_proj", "v_proj")]
        forms = {
            "full_paths": dict(target_modules=full),
            "regex_alternation": dict(target_modules=r".*\.(q_proj|v_proj)"),
            "regex_layers": dict(target_modules=r"model\.layers\.[0-9]+\.self_attn\.(q|v)_proj"),
            "layers_to_transform_all": dict(target_modules=["q_proj", "v_proj"], layers_to_transform=[0, 1],
                                            layers_pattern="layers"),
            "mixed_suffixes": dict(target_modules=["self_attn.q_proj", "v_proj"]),
        }
        for name, edit in forms.items():
            got, err = loss_with(variant("qv", name, **edit), "lora_target_modules=q_proj,v_proj")
            check("target form %s: same loss bit for bit" % name, got == ref, "%r vs %r %s" % (got, ref, err))
        ref_all, err = loss_with(os.path.join(work, "all"), "lora_target_linear=true")
        got, err2 = loss_with(variant("all", "all_linear", target_modules="all-linear"), "lora_target_linear=true")
        check("target form all-linear: same loss bit for bit", ref_all is not None and got == ref_all,
              "%r vs %r %s %s" % (got, ref_all, err, err2))

        refused = {
            "use_dora": (dict(use_dora=True), "use_dora"),
            "rank_pattern": (dict(rank_pattern={"q_proj": 4}), "rank_pattern"),
            "alpha_pattern": (dict(alpha_pattern={"v_proj": 8}), "alpha_pattern"),
            "modules_to_save": (dict(modules_to_save=["lm_head"]), "modules_to_save"),
            "bias_all": (dict(bias="all"), "bias"),
            "fan_in_fan_out": (dict(fan_in_fan_out=True), "fan_in_fan_out"),
            "peft_type": (dict(peft_type="LOHA"), "peft_type"),
            "lm_head_target": (dict(target_modules=["q_proj", "v_proj", "lm_head"]), "lm_head"),
            "layer_subset": (dict(layers_to_transform=[1]), "layer"),
            "regex_matches_nothing": (dict(target_modules="nothing_here"), "target_modules"),
            "regex_invalid": (dict(target_modules="(q_proj"), "target_modules"),
            "other_targets": (dict(target_modules=["q_proj", "k_proj"]), "k_proj"),
        }
        for name, (edit, word) in refused.items():
            d = variant("qv", "bad_" + name, **edit)
            rc, err = run(binary, work, "lora_model_dir=" + d, "lora_target_modules=q_proj,v_proj",
                          "max_steps=1", "output_dir=" + os.path.join(work, "out_bad_" + name))
            lines = [l for l in err.splitlines() if l.strip()]
            check("refused: %s" % name, rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and
                  "adapter_config.json" in lines[0] and word in lines[0], "exit %s %r" % (rc, err))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
