# Inverting Gradients on ResNet-18 (issue 16): real CIFAR-100 samples at breaching's
# budget (24,000 signed-Adam steps, one restart), batch 1 and 4. breaching publishes
# 14.2 dB (ImageNet ResNet-18, batch 1) and 20.8 dB (FedAvg, batch 4). Never run on a
# GPU yet: its share of the 6-minute budget is unknown (estimate: 2-4 minutes).
if [ "$HAS_CUDA" = 1 ]; then
  if "$PY" bench/frontier.py --attacks ig --models resnet18 --datasets cifar100-samples \
      --batch-sizes 1 4 --steps ig=24000 --restarts 1 --victims 1 --device cuda \
      --out "$OUT/frontier-ig-resnet18" >"$OUT/ig-resnet18.log" 2>&1; then
    row ig-resnet18 ok "$(tail -n 3 "$OUT/frontier-ig-resnet18/frontier.md" | tr '\n' ' ')"
  else
    row ig-resnet18 FAIL "see $OUT/ig-resnet18.log"
  fi
else
  row ig-resnet18 SKIP "no CUDA"
fi
