#!/usr/bin/env bash
# The default job from nothing: dependencies, data, build, then train the ~0.8M-parameter
# byte-level Llama on tinyshakespeare (a few minutes on 2 cores). Extra args go to train_llama.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
python3 scripts/prepare_text.py --name tinyshakespeare --out data/tinyshakespeare
make -j"$(nproc)"
./train_llama -c configs/tiny_shakespeare.yaml "$@"
