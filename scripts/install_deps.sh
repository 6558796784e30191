#!/usr/bin/env bash
# Installs everything the build and the tests need on a fresh Debian machine (run as root).
set -euo pipefail
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
pkgs="build-essential libopenblas-openmp-dev libyaml-dev libcjson-dev libstb-dev libopenmpi-dev openmpi-bin python3 python3-torch python3-numpy python3-matplotlib clang libclang-rt-dev libomp-dev"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends $missing
fi
# Data preparation (scripts/prepare_data.py, scripts/tokenize_hf.py and their tests): Hugging Face
# tokenizers and chat templates, and pyarrow for parquet datasets (17.x: the last line that works
# with Debian's numpy 1.x), pinned, into Debian's python3 (python3-pip; Debian marks its Python as
# externally managed, hence the flag).
PY_PKGS="tokenizers==0.22.2 transformers==4.57.6 jinja2==3.1.6 pyarrow==17.0.0"
if ! /usr/bin/python3 -c "import tokenizers, transformers, jinja2, pyarrow.parquet" >/dev/null 2>&1; then
    dpkg -s python3-pip >/dev/null 2>&1 || { export DEBIAN_FRONTEND=noninteractive; $SUDO apt-get update -q; \
        $SUDO apt-get install -y -q --no-install-recommends python3-pip; }
    $SUDO /usr/bin/python3 -m pip install -q --break-system-packages $PY_PKGS
fi
# peft for the PEFT round trips (test/test_peft_layers.py): peft 0.11.1 (the version issue 13 was
# checked against) and accelerate 0.30.1, which it imports, both pinned and installed without
# their dependencies: pip reads Debian's torch "1.13.0a0" as older than their torch>=1.13 and
# would replace it. Their other dependencies (safetensors, huggingface_hub, psutil, pyyaml,
# tqdm) come with transformers above.
PEFT_PKGS="peft==0.11.1 accelerate==0.30.1"
if ! /usr/bin/python3 -c "import peft" >/dev/null 2>&1; then
    $SUDO /usr/bin/python3 -m pip install -q --break-system-packages --no-deps $PEFT_PKGS
fi
# transformers' GPT2LMHeadModel for test/test_gpt2_lora.py: the transformers above (4.57) builds
# no torch model on Debian's torch 1.13, so transformers 4.44.2 (which does) and the tokenizers
# it checks for go into a directory of their own that only that test puts on sys.path.
GPT2_TF_DIR=/opt/llmc-transformers-4.44.2
if [ ! -f "$GPT2_TF_DIR/transformers/__init__.py" ]; then
    $SUDO /usr/bin/python3 -m pip install -q --no-deps --target "$GPT2_TF_DIR" transformers==4.44.2 tokenizers==0.19.1
fi
