#!/usr/bin/env bash
# Every fix at every d_k (experiment=stability_fixes), one fix a stage, then the report:
#   experiments/stability_fixes.sh                      # every stage in order
#   experiments/stability_fixes.sh softcap report       # some stages
# Stages: the fixes of conf/fix/ (54 runs each: 6 LRs x d_k 64, 256, 4096 x 3 seeds), then `report`
# (andrea-report over $SWEEPS into $RESULTS). The study is larger than one 10-minute command (about 18 minutes of
# stages on one H200: experiments/README.md), so it runs stage by stage, resumable across sessions (carry $SWEEPS
# along): a stage that ended with every cell finished (or diverged) leaves $SWEEPS/NAME.done holding its command
# and is skipped while the command is the same; one that stopped part way is resumed (train.resume=true:
# finished runs are left as they are, the others continue from their last checkpoint). Each stage's wall time is
# appended to $SWEEPS/stages.tsv (stage, seconds, exit status, UTC end), one line a session.
# EXTRA="k=v ..." is added to every stage (a smoke test: EXTRA="train.max_steps=20" with its own SWEEPS).
set -u
SWEEPS=${SWEEPS:-multirun/stability_fixes}
RESULTS=${RESULTS:-experiments/results/stability_fixes}
PAR=${CELLS_PER_GPU:-16}
FIXES="sqrt none inv qk_layernorm inv_qk_layernorm inv_qk_layernorm_z_loss softcap sigma_reparam"
STAGES="$FIXES report"
# shellcheck source=experiments/stages.sh
. "$(dirname "$0")/stages.sh"
check_stages "$@"

sweep() {  # sweep FIX: the preset's grid at one fix, a stage (stages.sh)
  run_stage "$1" "experiment=stability_fixes fix=$1 ${EXTRA_ARGS[*]}" experiment=stability_fixes "fix=$1" \
    hydra/launcher=local_gpus "cells_per_gpu=$PAR" "${EXTRA_ARGS[@]}"
}

[ $# -eq 0 ] && set -- $STAGES
for name in "$@"; do
  case $name in
    report) $py -m andrea_exp.report "$SWEEPS" --out "$RESULTS" ${MACHINE:+--machine "$MACHINE"} ;;
    *) sweep "$name" ;;
  esac
done
