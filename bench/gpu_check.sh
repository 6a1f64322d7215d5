#!/bin/bash
# GPU check: does fedsim use a GPU correctly and profitably? Prints one table, exits non-zero
# when a check fails. Budget: at most 6 minutes on one H200 (16 cores).
#
#   bash bench/gpu_check.sh [--with NAME[,NAME...]] [--out DIR]
#
# Rows:
#   split clients=C audit=A   the four client/audit placements (CPU or GPU each), audit-fedavg for
#                             2 rounds: completes? wall seconds per round (Ray start included)
#   dlg cpu / dlg cuda        the 16-image DLG case (cifar100-samples, lenet-zhu, uniform init,
#                             4 restarts, 100 steps): median PSNR, reconstructions per second;
#                             check: CUDA median within 1 dB of CPU
#   grnn cuda                 GRNN on mnist-samples, batch 4, 1,000 steps: PSNR, seconds per batch
#   fedavg-10 audited         10 rounds, 8 clients all sampled, every client attacked every round
#                             by DLG on the GPU: completes with 80 audit rows?
#   --with NAME               sources bench/gpu_check.d/NAME.sh, which adds rows by calling
#                             `row NAME STATUS DETAIL` (STATUS: ok, FAIL or SKIP); for later issues.
# On a machine without CUDA, CUDA rows print SKIP and the rest run (slowly: CPU only).
# Time limits are set for the H200 machine; GPU_CHECK_TIME_SCALE=N multiplies them (a small or busy
# CPU-only machine needs 4 or more).
#
# Runs from the project root with `python3 -m fedsim.cli` (PYTHON overrides the interpreter), so
# it works both in a venv and on the GPU machine's source checkout (../shared/gpu/bundle.sh).
set -uo pipefail
PY=${PYTHON:-python3}
OUT=""
WITH=""
while [ $# -gt 0 ]; do
  case "$1" in
    --with) WITH="${2//,/ }"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (allowed: --with NAME[,NAME...], --out DIR)"; exit 2 ;;
  esac
done
[ -f scenarios/audit-fedavg.toml ] || { echo "gpu_check.sh: run from the project root"; exit 2; }
OUT=${OUT:-$(mktemp -d /tmp/gpu-check-XXXXXX)}
mkdir -p "$OUT"
SCALE=${GPU_CHECK_TIME_SCALE:-1}
limit() { echo $(( $1 * SCALE )); }  # limit SECONDS: a time limit, scaled
export FLWR_TELEMETRY_ENABLED=0 RAY_USAGE_STATS_ENABLED=0

ROWS=()
FAILED=0
row() {  # row NAME STATUS DETAIL
  ROWS+=("$(printf '%-28s %-5s %s' "$1" "$2" "$3")")
  echo "[gpu_check] $1: $2 $3"
  [ "$2" = "FAIL" ] && FAILED=1
  return 0
}
calc() { "$PY" -c "print($1)"; }  # arithmetic without bc (the GPU image may lack it)
now() { "$PY" -c "import time; print(time.time())"; }
csv() {  # csv FILE EXPRESSION: a number from a CSV (pandas frame `d`)
  "$PY" -c "import sys, pandas as pd; d = pd.read_csv(sys.argv[1]); print($2)" "$1" 2>/dev/null
}
HAS_CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
SKIP_CUDA="no CUDA on this machine"
echo "[gpu_check] $("$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')") -> $OUT"

# -- the four client/audit splits ----------------------------------------------------------
SPLIT_DLG="audit.attacks=[{name='dlg', steps=100, restarts=2}]"
for clients in cpu gpu; do
  for audit in cpu gpu; do
    name="split clients=$clients audit=$audit"
    if [ "$HAS_CUDA" != 1 ] && [ "$clients$audit" != cpucpu ]; then row "$name" SKIP "$SKIP_CUDA"; continue; fi
    cg=0; ag=0
    [ "$clients" = gpu ] && cg=0.25
    [ "$audit" = gpu ] && ag=0.5
    dir="$OUT/split-$clients-$audit"
    start=$(now)
    if timeout "$(limit 150)" "$PY" -m fedsim.cli run scenarios/audit-fedavg.toml --set federation.rounds=2 \
        --set "$SPLIT_DLG" --set backend.num-gpus=$cg --set audit.num-gpus=$ag --out "$dir" \
        > "$dir.log" 2>&1; then
      wall=$(calc "$(now) - $start")
      row "$name" ok "$(printf '%.1f s/round wall; %s' "$(calc "$wall / 2")" \
        "$(csv "$dir/audit.csv" "f'{len(d)} attacks, device {d.device.iloc[0]}, mean PSNR {d.psnr.mean():.1f} dB'")")"
    else
      rc=$?
      row "$name" FAIL "no completion within $(limit 150) s (exit $rc); log: $dir.log"
    fi
  done
done

# -- DLG on CPU and CUDA: the 16-image case -------------------------------------------------
DLG_ARGS=(attack --attack dlg --dataset cifar100-samples --model lenet-zhu --init uniform
  --num-images 16 --restarts 4 --steps 100 --parallel 16)
declare -A PSNR
for device in cpu cuda; do
  if [ "$device" = cuda ] && [ "$HAS_CUDA" != 1 ]; then row "dlg cuda" SKIP "$SKIP_CUDA"; continue; fi
  threads=1; [ "$device" = cpu ] && threads=0  # CPU: every core (PyTorch's default)
  start=$(now)
  if timeout "$(limit 240)" "$PY" -m fedsim.cli "${DLG_ARGS[@]}" --device $device --threads $threads \
      --out "$OUT/dlg-$device" > "$OUT/dlg-$device.log" 2>&1; then
    wall=$(calc "$(now) - $start")
    PSNR[$device]=$(csv "$OUT/dlg-$device/results.csv" "d.psnr.median()")
    row "dlg $device" ok "$(printf 'median PSNR %.1f dB; %.2f reconstructions/s (16 in %.0f s wall)' \
      "${PSNR[$device]}" "$(calc "16 / $wall")" "$wall")"
  else
    rc=$?
    row "dlg $device" FAIL "did not finish within $(limit 240) s (exit $rc); log: $OUT/dlg-$device.log"
  fi
done
if [ -n "${PSNR[cpu]:-}" ] && [ -n "${PSNR[cuda]:-}" ]; then
  gap=$(calc "${PSNR[cuda]} - ${PSNR[cpu]}")
  if [ "$(calc "int(abs($gap) <= 1)")" = 1 ]; then status=ok; else status=FAIL; fi
  row "dlg cuda vs cpu" $status "$(printf 'CUDA - CPU median PSNR = %+.2f dB (limit: 1 dB)' "$gap")"
else
  row "dlg cuda vs cpu" SKIP "needs both DLG rows"
fi

# -- GRNN on CUDA ------------------------------------------------------------------------------
if [ "$HAS_CUDA" = 1 ]; then
  if timeout "$(limit 90)" "$PY" -m fedsim.cli attack --attack grnn --dataset mnist-samples --batch-size 4 \
      --num-images 4 --steps 1000 --device cuda --out "$OUT/grnn" > "$OUT/grnn.log" 2>&1; then
    row "grnn cuda" ok "$(csv "$OUT/grnn/results.csv" "f'PSNR {d.psnr.median():.1f} dB, {d.seconds.median():.1f} s per batch of 4'")"
  else
    rc=$?
    row "grnn cuda" FAIL "did not finish within $(limit 90) s (exit $rc); log: $OUT/grnn.log"
  fi
else
  row "grnn cuda" SKIP "$SKIP_CUDA"
fi

# -- 10 audited FedAvg rounds, every client attacked every round, on the GPU --------------------
if [ "$HAS_CUDA" = 1 ]; then
  dir="$OUT/fedavg-10"
  start=$(now)
  if timeout "$(limit 200)" "$PY" -m fedsim.cli run scenarios/audit-fedavg.toml --set federation.rounds=10 \
      --set federation.num-clients=8 --set federation.clients-per-round=8 --set audit.victims=0 \
      --set "audit.attacks=[{name='dlg', steps=100, restarts=4}]" \
      --set backend.num-gpus=0.1 --set audit.num-gpus=0.5 --out "$dir" > "$dir.log" 2>&1; then
    wall=$(calc "$(now) - $start")
    rows=$(csv "$dir/audit.csv" "len(d)")
    status=ok; [ "$rows" = 80 ] || status=FAIL
    row "fedavg-10 audited" $status "$(printf '%s/80 attacks; %.0f s wall; %s' "$rows" "$wall" \
      "$(csv "$dir/audit.csv" "f'mean PSNR {d.psnr.mean():.1f} dB, {d[\"gpu-seconds\"].sum():.0f} GPU-s, peak {d[\"peak-gpu-mb\"].max():.0f} MiB'")")"
  else
    rc=$?
    row "fedavg-10 audited" FAIL "no completion within $(limit 200) s (exit $rc); log: $dir.log"
  fi
else
  row "fedavg-10 audited" SKIP "$SKIP_CUDA"
fi

# -- rows other checks add (--with) ---------------------------------------------------------------
for name in $WITH; do
  extra="bench/gpu_check.d/$name.sh"
  if [ -f "$extra" ]; then
    # shellcheck source=/dev/null
    source "$extra"
  else
    row "with $name" FAIL "no $extra (allowed: $(ls bench/gpu_check.d/*.sh 2>/dev/null | xargs -n1 basename 2>/dev/null | sed 's/\.sh$//' | tr '\n' ' '))"
  fi
done

echo
printf '%-28s %-5s %s\n' check status detail
printf '%s\n' "${ROWS[@]}"
exit $FAILED
