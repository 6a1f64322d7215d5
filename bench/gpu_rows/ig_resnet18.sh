#!/usr/bin/env bash
# One GPU-check row (issue 16): Inverting Gradients on ResNet-18, real CIFAR-100
# samples, at breaching's budget (24,000 signed-Adam steps, one restart), batch
# 1 and 4. breaching publishes 14.2 dB (ImageNet ResNet-18, batch 1) and 20.8 dB
# (FedAvg, batch 4); CPU budgets here stop far short of either.
# bench/gpu_check.sh (issue 13) calls this as one row; run alone from the
# repository root: bash bench/gpu_rows/ig_resnet18.sh [OUT_DIR]
# The GPU image lacks flwr/ray: carry them as ../shared/gpu/bundle.sh prepares.
set -euo pipefail
out="${1:-${OUT:-runs}}/frontier-ig-resnet18"
python bench/frontier.py --attacks ig --models resnet18 --datasets cifar100-samples \
  --batch-sizes 1 4 --steps ig=24000 --restarts 1 --victims 1 --device cuda --out "$out"
