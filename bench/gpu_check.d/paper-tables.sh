# FedCG Tables 1 and 2 (issue 17) at 1% of the paper's budget (10 rounds x 2 local epochs), one
# seed: accuracy per method and how many of the paper's orderings hold. The full budget (100 x 20,
# 3 seeds) is bench/paper_tables_gpu.sh: hours, not a check. Needs Debian's Fashion-MNIST files
# (FMNIST_ROOT, default /usr/share/datasets/fashion-mnist; the device image has none unless carried).
# Never run on a GPU yet: its share of the 6-minute budget is unknown (estimate: 3-5 minutes).
FMNIST_ROOT=${FMNIST_ROOT:-/usr/share/datasets/fashion-mnist}
if [ "$HAS_CUDA" != 1 ]; then
  row paper-tables SKIP "no CUDA"
elif [ ! -f "$FMNIST_ROOT/train-images-idx3-ubyte.gz" ]; then
  row paper-tables SKIP "no Fashion-MNIST in $FMNIST_ROOT (set FMNIST_ROOT to a carried copy)"
elif timeout "$(limit 420)" "$PY" bench/paper_tables.py --budget 0.01 --seeds 0 \
    --set "data.root=$FMNIST_ROOT" --set backend.num-gpus=0.2 --set audit.num-gpus=0.2 --out "$OUT/paper-tables" >"$OUT/paper-tables.log" 2>&1; then
  row paper-tables ok "$(grep -c '| holds' "$OUT/paper-tables/paper-tables.md") of \
$(grep -c '^| Table' "$OUT/paper-tables/paper-tables.md") orderings hold; \
$(grep -E '^\| (FedCG|FedAvg) \| [0-9.]+ \| ' "$OUT/paper-tables/paper-tables.md" | head -2 | tr '\n' ' ')"
else
  row paper-tables FAIL "no completion within $(limit 420) s; log: $OUT/paper-tables.log"
fi
