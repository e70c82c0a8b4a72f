#!/usr/bin/env bash
# The GPU runs behind the committed results, stage by stage, on one machine with CUDA.
#   experiments/run_h200.sh STAGE...      stages: probe_overhead grid_parallel grid_sequential grid_seeds
#                                                 scaling_at_init qk_init lr_sensitivity leak_gap throughput
# Sweeps go to $SWEEPS (default multirun/h200), figures/JSON to $RESULTS (default experiments/results).
set -u
SWEEPS=${SWEEPS:-multirun/h200}
RESULTS=${RESULTS:-experiments/results}
PAR=${CELLS_PER_GPU:-12}
mkdir -p "$SWEEPS" "$RESULTS"
py=${PYTHON:-python3}

timed() {  # timed NAME CMD...: run a command, append its wall time to $RESULTS/wall_times.jsonl
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$@"; local rc=$?
  $py -c "import json,sys; print(json.dumps({'stage': sys.argv[1], 'wall_s': round(float(sys.argv[3]) - float(sys.argv[2]), 1), 'rc': int(sys.argv[4]), 'command': sys.argv[5]}))" \
    "$name" "$t0" "$(date +%s.%N)" "$rc" "$*" >> "$RESULTS/wall_times.jsonl"
  return $rc
}

sweep() {  # sweep NAME EXPERIMENT [overrides...]: one multirun, cells in parallel on the GPUs
  local name=$1 exp=$2; shift 2
  timed "$name" $py -m andrea_exp -m "experiment=$exp" hydra/launcher=local_gpus "cells_per_gpu=$PAR" \
    "hydra.sweep.dir=$SWEEPS/$name" logger.mode=offline train.progress=false "$@"
}

for stage in "$@"; do
  case $stage in
    probe_overhead) $py benchmarks/probe_overhead.py --out "$RESULTS/probe_overhead.json" ;;
    grid_parallel) sweep claims_grid_parallel claims_grid seed=0 ;;
    grid_sequential) timed claims_grid_sequential $py -m andrea_exp -m experiment=claims_grid seed=0 \
        "hydra.sweep.dir=$SWEEPS/claims_grid_sequential" logger.mode=offline train.progress=false ;;
    grid_seeds) sweep claims_grid_seeds claims_grid seed=1,2 ;;
    scaling_at_init) sweep scaling_at_init scaling_at_init ;;
    qk_init) sweep qk_init_gpt2 qk_init model.qk_init=gpt2 ;;
    lr_sensitivity) sweep lr_sensitivity lr_sensitivity ;;
    leak_gap) sweep leak_gap leak_gap seed=0,1,2 ;;
    throughput) $py benchmarks/throughput.py --out "$RESULTS/throughput_h200.json" ;;
    *) echo "unknown stage: $stage" >&2; exit 2 ;;
  esac
done
