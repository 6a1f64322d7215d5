# The audit of real updates on a GPU (issue 35): the quickstart's clients on a quarter GPU each,
# every client's update analysed every round (labels, membership, class representatives on the
# driver, on CUDA when audit.num-gpus > 0) and round 1's probe reconstructed as a counterfactual
# by the portfolio's attacks on the GPU. 2 rounds; share of the budget: about 1-2 minutes.
if [ "$HAS_CUDA" = 1 ]; then
  dir="$OUT/leaks"
  start=$(now)
  if timeout "$(limit 240)" "$PY" -m fedsim.cli run quickstart --set federation.rounds=2 \
      --set backend.num-gpus=0.25 --set audit.num-gpus=0.25 --out "$dir" > "$dir.log" 2>&1; then
    wall=$(calc "$(now) - $start")
    kinds=$(csv "$dir/leaks.csv" "' '.join(f'{k}:{n}' for k, n in d.groupby('kind').size().items())")
    row "leaks cuda" ok "$(printf '%.0f s wall (2 rounds); rows %s; %s' "$wall" "$kinds" \
      "$(csv "$dir/metrics.csv" "f'label TV {d[\"audit-label-tv\"].iloc[-1]:.2f}, membership AUC {d[\"audit-membership-auc\"].iloc[-1]:.3f}, probe PSNR {d[\"audit-counterfactual-psnr\"].iloc[0]:.1f} dB'")")"
  else
    rc=$?
    row "leaks cuda" FAIL "no completion within $(limit 240) s (exit $rc); log: $dir.log"
  fi
else
  row "leaks cuda" SKIP "$SKIP_CUDA"
fi
