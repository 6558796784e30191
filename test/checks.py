"""Small pieces the end-to-end test scripts share: PASS/FAIL lines with a closing count, llm.c
token shards, running the trainer with --set overrides (optionally under a file-size limit,
which makes a write fail like a full disk), and reading its --profile table."""
import os
import re
import resource
import signal
import struct
import subprocess
import sys

_results = []


def tiny_model_yaml(layers=1):
    """The `model:` block of the tiny random-init model the end-to-end tests train."""
    return ("model:\n  vocab_size: 256\n  hidden_size: 16\n  intermediate_size: 32\n"
            "  num_hidden_layers: %d\n  num_attention_heads: 2\n  max_position_embeddings: 64\n" % layers)


def check(name, ok, detail=""):
    """Prints 'PASS name' or 'FAIL name: detail' and remembers the outcome."""
    _results.append(bool(ok))
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, detail)), flush=True)


def finish():
    """Prints 'N passed, M failed' and exits 1 if any check failed."""
    bad = _results.count(False)
    print("%d passed, %d failed" % (len(_results) - bad, bad))
    sys.exit(1 if bad else 0)


def write_shard(path, tokens):
    """A version-1 (uint16) token shard as llm.c writes it."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def run_trainer(binary, cfg, *args, cwd=None, fsize=None, timeout=300, drop_env=()):
    """Runs binary -c cfg; each arg is a key=value for --set, or a flag starting with '--'.
    Returns (exit code, stdout, stderr); one thread, as the suite's other runs. drop_env:
    variables not to pass on (e.g. LLMC_DEVICE, when the test chooses the device itself)."""
    argv = [binary, "-c", cfg]
    for a in args:
        argv += [a] if a.startswith("--") else ["--set", a]

    def limit():
        if fsize:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for k in drop_env:
        env.pop(k, None)
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                       preexec_fn=limit if fsize else None)
    return p.returncode, p.stdout, p.stderr


def prepared_rows_env(root, T, cuts, nrows=8, vocab=64, seed=5):
    """A prepared-rows directory (the row file of prepare_data.py: tokens, targets and document
    starts, one document per [a, b) of cuts in every row) and a stand-in preparation script
    that points the trainer at it. Returns the scripts directory for LLMC_SCRIPTS_DIR."""
    import numpy as np
    d = os.path.join(root, "prepared")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    body = np.zeros((nrows, 3, T), np.int32)
    ntg = 0
    for r in range(nrows):
        for a, b in zip(cuts, cuts[1:]):
            body[r, 0, a:b] = rng.integers(1, vocab, size=b - a)
            body[r, 2, a:b] = a
            body[r, 1, a:b] = -1
            body[r, 1, a:b - 1] = body[r, 0, a + 1:b]
        ntg += int((body[r, 1] >= 0).sum())
    h = np.zeros(256, np.int32)
    h[:9] = [20241124, 1, T, nrows, 1, vocab, (len(cuts) - 1) * nrows, ntg, 0]
    with open(os.path.join(d, "train.bin"), "wb") as f:
        f.write(h.tobytes())
        f.write(body.tobytes())
    sd = os.path.join(root, "scripts")
    os.makedirs(sd, exist_ok=True)
    with open(os.path.join(sd, "prepare_data.py"), "w") as f:
        f.write("import sys\na = sys.argv[1:]\nopen(a[a.index('--result') + 1], 'w').write(%r + '\\n')\n"
                "print('data: using prepared %s (cache hit)')\n" % (d, d))
    return sd


def profile_table(stdout):
    """{op: (calls per step, ms per step)} and the header line of the trainer's --profile table."""
    rows, head = {}, ""
    for line in stdout.splitlines():
        if line.startswith("op profile"):
            head = line
        m = re.match(r"\| (\w+) \| ([0-9.e+]+) \| ([0-9.]+) \|", line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return rows, head
