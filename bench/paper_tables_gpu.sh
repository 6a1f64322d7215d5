#!/usr/bin/env bash
# FedCG Tables 1 and 2 at the paper's full budget (100 rounds x 20 local epochs, 3 seeds) on a
# CUDA machine: each of the 4 clients and the audit take a fifth of the GPU (backend.num-gpus,
# audit.num-gpus). Resumable: rerun to finish an interrupted sweep.
# Usage: bench/paper_tables_gpu.sh [OUT_DIR] [extra paper_tables.py arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
"$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "no CUDA device")'
out=${1:-runs/paper-tables-full}
exec "$python" bench/paper_tables.py --budget 1 --out "$out" \
  --set backend.num-gpus=0.2 --set audit.num-gpus=0.2 "${@:2}"
