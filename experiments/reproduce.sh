#!/usr/bin/env bash
# Every study behind experiments/results/report.md, 3 seeds each, on the GPUs of this machine, then the report.
#   experiments/reproduce.sh                 # all presets, then the report
#   STAGES="claims_grid leak_gap" experiments/reproduce.sh
# Sweeps go to $SWEEPS (default multirun/reproduce), the report to $RESULTS (default experiments/results).
# Each stage's wall time is appended to $RESULTS/wall_times.jsonl.
set -u
SWEEPS=${SWEEPS:-multirun/reproduce}
RESULTS=${RESULTS:-experiments/results}
PAR=${CELLS_PER_GPU:-16}
STAGES=${STAGES:-"scaling_at_init claims_grid qk_init lr_sensitivity extras leak_gap"}
py=${PYTHON:-python3}
mkdir -p "$SWEEPS" "$RESULTS"

stage() {  # stage NAME [overrides...]: one Hydra multirun of experiment=NAME, cells in parallel on the GPUs
  local name=$1; shift
  local t0 rc; t0=$(date +%s.%N)
  $py -m andrea_exp -m "experiment=$name" hydra/launcher=local_gpus "cells_per_gpu=$PAR" \
    "hydra.sweep.dir=$SWEEPS/$name" logger.mode=offline train.progress=false "$@" > "$SWEEPS/$name.log" 2>&1
  rc=$?
  $py - "$name" "$t0" "$(date +%s.%N)" "$rc" "$RESULTS/wall_times.jsonl" <<'PY'
import json, sys
name, t0, t1, rc, out = sys.argv[1:]
record = {"stage": name, "wall_s": round(float(t1) - float(t0), 1), "rc": int(rc)}
print(json.dumps(record))
with open(out, "a") as fh:
    fh.write(json.dumps(record) + "\n")
PY
  tail -n 20 "$SWEEPS/$name.log"
}

t_all=$(date +%s)
for name in $STAGES; do
  stage "$name"
done
echo "all stages: $(( $(date +%s) - t_all )) s"
$py -m andrea_exp.report "$SWEEPS"/* --out "$RESULTS" --machine "${MACHINE:-}" ${NOTE:+--note "$NOTE"}
