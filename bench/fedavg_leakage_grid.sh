#!/bin/bash
# The reach grid of bench/fedavg_leakage.py, one cell per process, PARALLEL at a time, the paper's
# analogue first, then the smaller cells (so that a time limit cuts the largest); rows land in OUT/cell-*.csv as they come.
#   bash bench/fedavg_leakage_grid.sh OUT [PARALLEL] [DEVICE]
set -u
OUT=${1:?output folder}; PARALLEL=${2:-14}; DEVICE=${3:-cpu}
mkdir -p "$OUT"
B="${PY:-python3} bench/fedavg_leakage.py --device $DEVICE --steps 40 --restarts 2"
{
  # The nearest offline analogue of the paper's FEMNIST setting (10 epochs x 10 batches x 5 images).
  echo "--clients 1 --images 50 --epochs 10 --batch 5 --optimizers sgd --attacks fedavg-leakage"
  for n in 5 10; do for e in 1 2 5; do for b in 5 10; do
    echo "--clients 2 --images $n --epochs $e --batch $b --optimizers sgd --attacks fedavg-leakage unrolled-dlg"
  done; done; done
  for n in 5 10; do for e in 1 2 5; do
    echo "--clients 2 --images $n --epochs $e --batch 5 --optimizers adam --attacks fedavg-leakage unrolled-dlg"
  done; done
  for n in 5 10; do for e in 1 2; do
    echo "--clients 2 --images $n --epochs $e --batch 5 --optimizers sgd --datasets fashion-mnist-samples --attacks fedavg-leakage"
  done; done
  for n in 25 50; do for e in 1 2 5; do for b in 5 10; do
    echo "--clients 2 --images $n --epochs $e --batch $b --optimizers sgd --attacks fedavg-leakage unrolled-dlg"
  done; done; done
} | awk '{print NR" "$0}' | sort -k1,1n | \
  xargs -P "$PARALLEL" -L 1 bash -c 'i=$0; '"$B"' "$@" --out '"$OUT"'/cell-$i.csv > '"$OUT"'/cell-$i.log 2>&1'
