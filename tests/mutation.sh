#!/usr/bin/env bash
# Mutation testing: does each module's test suite fail when the module's code is changed?
#
#   tests/mutation.sh                  # the default list (DEFAULT_MODULES)
#   tests/mutation.sh attention data   # chosen modules (keys of TESTS below)
#
# For each module, mutmut mutates only that module's file (and, where FUNCTIONS names some, only those
# functions), runs only the test files in TESTS against each mutant, and the score is printed as
# killed / total with the list of survivors. Each module runs in its own scratch copy of the repository
# (MUTATION_WORKDIR, default /tmp/andrea-mutation) so the working tree and its pyproject stay untouched.
# Environment: MUTATION_JOBS (parallel mutants, default 2), MUTATION_WORKDIR, MUTMUT_VERSION.
# MUTATION_RESUME=1 keeps the module's previous scratch copy and its results, refreshes the sources and
# tests, and re-runs only the mutants not killed last time (new tests cannot revive a killed mutant).
# Known equivalent mutants are listed, one reason each, in tests/mutation_survivors.md. The named mutants that
# would turn a verdict around are also checked on their own, quickly: python tests/mutants/statements.py.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORKDIR="${MUTATION_WORKDIR:-/tmp/andrea-mutation}"
JOBS="${MUTATION_JOBS:-2}"
MUTMUT_VERSION="${MUTMUT_VERSION:-3.8.1}"
PYTHON="${PYTHON:-python}"

# module -> the files mutmut mutates (space-separated)
declare -A SOURCE=(
  [attention]="andrea_exp/model/attention.py"
  [choices]="andrea_exp/config/variants.py"
  [data]="andrea_exp/data/sources.py"
  [metrics]="andrea_exp/instruments/metrics.py"
  [train]="andrea_exp/training/loop.py andrea_exp/training/graphed_step.py"
  [report_rules]="andrea_exp/report/rules.py andrea_exp/report/seeds.py andrea_exp/report/bestlr.py"
  [head_gemms]="andrea_exp/model/head_gemms.py"
  # the statements' decisions: effect sizes, the verdict rule, reference runs and each claim's statements
  [report_verdicts]="andrea_exp/report/effects.py andrea_exp/report/verdicts.py andrea_exp/report/reference.py
                     andrea_exp/report/claims/c2.py andrea_exp/report/claims/c3.py andrea_exp/report/claims/c4.py
                     andrea_exp/report/claims/c5.py andrea_exp/report/claims/c7.py andrea_exp/report/claims/c9.py"
  # the literature's named rules: entropy collapse, the fixes' best-LR transfer and failure side, the largest logit
  [report_literature]="andrea_exp/report/collapse.py andrea_exp/report/fixes.py andrea_exp/report/largest.py"
  # the rules that set a seed or a place aside as the runs grow: memorising, a leak still growing
  [report_scale]="andrea_exp/report/memorisation.py andrea_exp/report/leak_growth.py"
  [visibility]="andrea_exp/model/visibility.py"
  # the chunked loss, its output logits' statistics (log Z, largest logit) and z-loss
  [output_logits]="andrea_exp/model/chunked_loss.py"
  [gpu_memory]="andrea_exp/launch/gpu_memory.py"
)
# the rules lived in andrea_exp/report_rules.py before the report became a package
[[ -f "$REPO/andrea_exp/report/rules.py" ]] || SOURCE[report_rules]="andrea_exp/report_rules.py"
# LogWindow may live in its own module (andrea_exp/training/logwindow.py) or still in train.py
LOGWINDOW_GLOB="andrea_exp.training.loop.xǁLogWindowǁ*"
if [[ -f "$REPO/andrea_exp/training/logwindow.py" ]]; then
  SOURCE[train]+=" andrea_exp/training/logwindow.py"
  LOGWINDOW_GLOB="andrea_exp.training.logwindow.xǁLogWindowǁ*"
fi
# drop a listed file that no longer exists (a module split moved it): mutmut stops on a missing path
for module in "${!SOURCE[@]}"; do
  kept=""
  for file in ${SOURCE[$module]}; do [[ -f "$REPO/$file" ]] && kept+="${kept:+ }$file"; done
  SOURCE[$module]="$kept"
done

# module -> pytest arguments selecting the tests that cover it (slow end-to-end tests left out: they
# would run once per mutant; git_facts needs a git checkout, which the scratch copy is not)
declare -A TESTS=(
  [attention]="tests/test_attention.py"
  [choices]="tests/test_attention.py::test_scale_aliases tests/test_attention.py::test_bad_scale_raises_naming_the_setting
             tests/test_attention.py::test_bad_mask_fill_raises_naming_the_setting
             tests/test_attention.py::test_good_mask_fill_values tests/test_attention.py::test_explicit_matches_naive_loops"
  [data]="tests/test_data.py --deselect tests/test_data.py::test_briefly_trained_causal_model_stays_above_the_floor"
  [metrics]="tests/test_metrics.py tests/test_probe.py
             --deselect tests/test_probe.py::test_probes_every_step_leave_the_training_curve_identical"
  [train]="tests/test_training_controls.py tests/test_train_loop.py tests/test_divergence.py
           --deselect tests/test_train_loop.py::test_git_facts_in_and_outside_a_checkout
           --deselect tests/test_divergence.py::test_blown_up_run_ends_as_diverged_with_exit_0
           --deselect tests/test_divergence.py::test_a_diverging_cell_does_not_stop_the_sweep"
  [report_rules]="tests/test_report_rules.py tests/test_report.py
                  --deselect tests/test_report.py::test_report_on_a_real_tiny_sweep"
  [report_verdicts]="tests/test_report_statements.py tests/test_report_effects.py
                     --deselect tests/test_report_effects.py::test_write_report_first_screen"
  [head_gemms]="tests/test_head_gemms.py tests/test_model.py tests/test_fast_paths.py"
  [report_literature]="tests/test_collapse.py tests/test_largest_logit.py tests/test_stability_fixes_report.py"
  [report_scale]="tests/test_memorisation.py tests/test_leak_growth.py"
  [visibility]="tests/test_visibility.py"
  [output_logits]="tests/test_output_logits.py tests/test_fast_paths.py
                   --deselect tests/test_fast_paths.py::test_chunked_loss_in_bf16_on_the_gpu_sums_d_w_in_float32"
  [gpu_memory]="tests/test_gpu_memory.py
                --deselect tests/test_gpu_memory.py::test_on_a_gpu_a_cell_waits_beside_a_cell_that_holds_the_memory_and_starts_once_it_ends"
)

# module -> mutant-name globs (mutmut's names: module.x_function, module.xǁClassǁmethod); empty: all
declare -A FUNCTIONS=(
  [attention]=""
  [choices]=""
  [data]="andrea_exp.data.sources.xǁMarkovSourceǁ* andrea_exp.data.sources.x_floor_standard_error__mutmut_* andrea_exp.data.sources.xǁDatasetǁfloor_standard_error__mutmut_*"
  [metrics]=""
  # the stability study's controls: warmup + cosine schedule, clipping in the step, the divergence rule,
  # the probe schedule and the logged window (grad norm and clip share)
  [train]="andrea_exp.training.loop.x_build_optimizer__mutmut_* andrea_exp.training.loop.x_probe_due__mutmut_* andrea_exp.training.loop.xǁDivergenceWatchǁ* andrea_exp.training.graphed_step.x_step_body__mutmut_* andrea_exp.training.graphed_step.x_grad_norm__mutmut_* $LOGWINDOW_GLOB"
  [report_rules]=""
  [head_gemms]=""
  # the claim modules' statements only (their evidence tables are report_rules' concern)
  [report_verdicts]="andrea_exp.report.effects.* andrea_exp.report.verdicts.* andrea_exp.report.reference.*
                     andrea_exp.report.claims.c2.x_c2_growth__mutmut_* andrea_exp.report.claims.c3.x_c3_peaked__mutmut_*
                     andrea_exp.report.claims.c4.x_c4_vanish__mutmut_* andrea_exp.report.claims.c4.x_c4_stall__mutmut_*
                     andrea_exp.report.claims.c5.x_c5_unit_scale__mutmut_* andrea_exp.report.claims.c5.x_c5_proceeds__mutmut_*
                     andrea_exp.report.claims.c7.x_c7_leak__mutmut_* andrea_exp.report.claims.c7.x_untrained__mutmut_*
                     andrea_exp.report.claims.c9.x_c9_flat__mutmut_*"
  [report_literature]=""
  [report_scale]=""
  [visibility]=""
  [output_logits]=""
  # the pure rule and the records it reads; the waiting loop and the peak recorder's thread are timing, not rules
  [gpu_memory]="andrea_exp.launch.gpu_memory.x_room_for__mutmut_* andrea_exp.launch.gpu_memory.x_beside_and_need__mutmut_*
                andrea_exp.launch.gpu_memory.x_records__mutmut_* andrea_exp.launch.gpu_memory.x_write_record__mutmut_*
                andrea_exp.launch.gpu_memory.x_has_trained__mutmut_*"
)

DEFAULT_MODULES=(attention choices data metrics train report_rules report_verdicts head_gemms report_literature
                 report_scale visibility output_logits gpu_memory)

ensure_mutmut() {
  if ! "$PYTHON" -c "import importlib.metadata as m, sys; sys.exit(m.version('mutmut') != '$MUTMUT_VERSION')" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet "mutmut==$MUTMUT_VERSION"
  fi
}

# a copy of the tracked and untracked-but-not-ignored files, with this module's [tool.mutmut] settings
prepare_copy() {
  local module="$1" dest="$2"
  [[ "${MUTATION_RESUME:-0}" == 1 && -d "$dest/mutants" ]] || rm -rf "$dest"
  mkdir -p "$dest"
  (cd "$REPO" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf - 2>/dev/null) | tar -xf - -C "$dest"
  "$PYTHON" - "$dest/pyproject.toml" "${SOURCE[$module]}" ${TESTS[$module]} <<'PY'
import json, sys
path, sources, selection = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
kept, skipping = [], False
for line in open(path).read().splitlines():
    if line.startswith("["):
        skipping = line.strip() == "[tool.mutmut]"
    if not skipping:
        kept.append(line)
kept += ["", "[tool.mutmut]", 'source_paths = ["andrea_exp"]', 'also_copy = ["conf"]',
         f"only_mutate = {json.dumps(sources)}",
         f"pytest_add_cli_args_test_selection = {json.dumps(selection)}",
         # torch is not fork-safe once used: fork workers from a server that has only imported pytest
         'process_isolation = "forkserver"', "use_git_change_detection = false"]
open(path, "w").write("\n".join(kept) + "\n")
PY
}

# killed / total and the survivors, from `mutmut results --all true`, restricted to the module's globs
score() {
  local module="$1"
  mutmut results --all true 2>/dev/null | "$PYTHON" -c '
import fnmatch, sys
module, globs = sys.argv[1], sys.argv[2].split()
rows = [line.strip().rsplit(": ", 1) for line in sys.stdin if ": " in line]
rows = [(name, status) for name, status in rows if not globs or any(fnmatch.fnmatch(name, g) for g in globs)]
killed = [n for n, s in rows if s in ("killed", "timeout")]
survivors = [(n, s) for n, s in rows if s not in ("killed", "timeout")]
print(f"SCORE {module}: {len(killed)} / {len(rows)} killed")
for name, status in survivors:
    print(f"  {status}: {name}")
' "$module" "${FUNCTIONS[$module]}"
}

run_module() {
  local module="$1"
  if [[ -z "${SOURCE[$module]:-}" ]]; then
    echo "unknown module '$module'; choose from: ${!SOURCE[*]}" >&2
    return 2
  fi
  local dest="$WORKDIR/$module"
  echo "== $module: ${SOURCE[$module]} against ${TESTS[$module]}"
  local names="${FUNCTIONS[$module]}"
  if [[ "${MUTATION_RESUME:-0}" == 1 && -d "$dest/mutants" ]]; then
    names="$(cd "$dest" && score "$module" | awk '/^  [a-z ]+: /{print $NF}' | tr '\n' ' ')"
    echo "   resuming: re-running $(wc -w <<<"$names") mutants not killed last time"
    [[ -n "$names" ]] || { (cd "$dest" && score "$module"); return 0; }
  fi
  prepare_copy "$module" "$dest"
  # the package under test must be the mutated copy, never one on PYTHONPATH
  (cd "$dest" && unset PYTHONPATH && export WANDB_MODE=disabled WANDB_SILENT=true &&
     # shellcheck disable=SC2086
     mutmut run --max-children "$JOBS" $names > "$dest/mutmut-run.log" 2>&1 || {
       echo "mutmut run failed for $module; see $dest/mutmut-run.log" >&2; tail -20 "$dest/mutmut-run.log" >&2; return 1; }
     score "$module")
}

main() {
  ensure_mutmut
  local modules=("$@") status=0 module
  [[ ${#modules[@]} -gt 0 ]] || modules=("${DEFAULT_MODULES[@]}")
  for module in "${modules[@]}"; do
    run_module "$module" || status=1
  done
  return $status
}

main "$@"; exit $?  # one line: bash has read all it runs before it starts
