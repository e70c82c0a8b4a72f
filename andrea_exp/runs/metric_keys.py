"""Every key the project logs or summarises, with a line of meaning each: the one registry of metric names.

The training loop, the probe, the evaluation, the sweep table, the W&B workspace and the report import
their keys from here, and a test holds the README's table of metrics against `METRICS`. A key with
`{l}` has a per-layer variant (`attn/L{l}/entropy`) beside the pooled one (`attn/entropy`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    key: str
    meaning: str
    per_layer: bool = False  # also logged with `L{l}/` inserted after the namespace


def _m(key: str, meaning: str, per_layer: bool = False) -> Metric:
    return Metric(key, meaning, per_layer)


# a row whose largest probability exceeds this is "saturated" (one key takes it all): the */saturated_frac keys
SATURATION = 0.99


# ---------------------------------------------------------------- training (every step)
TRAIN_STEP = "train/step"
TRAIN_LOSS = "train/loss"
TRAIN_LR = "train/lr"
TRAIN_TOKENS = "train/tokens"
TRAIN_TOKENS_PER_S = "train/tokens_per_s"
TRAIN_GRAD_CLIP_FRAC = "train/grad_clip_frac"
TRAIN_WORLD_SIZE = "train/world_size"
GRAD_NORM = "grad/norm"
# the output logits of the step's training batch (its loss path reduces them; Wortsman et al. 2023's
# output-logit divergence shows as log Z drifting far from 0)
TRAIN_OUT_LOGZ_MEAN = "train/out_logz_mean"
TRAIN_OUT_LOGZ_MAX = "train/out_logz_max"
TRAIN_OUT_LOGIT_MAX = "train/out_logit_max"
TRAIN_Z_LOSS = "train/z_loss"

# ---------------------------------------------------------------- attention of the training batch (train.attn_stats)
ATTN_STEP = "attn_step"  # the namespace; per layer attn_step/L{l}/<stat>, per head attn_step/L{l}/H{h}/<stat>
ATTN_STEP_SCORE_MAX = "attn_step/score_max"
ATTN_STEP_ENTROPY = "attn_step/entropy"
ATTN_STEP_ENTROPY_NORM = "attn_step/entropy_norm"
ATTN_STEP_MAX_PROB = "attn_step/max_prob"
ATTN_STEP_MAX_PROB_MAX = "attn_step/max_prob_max"
ATTN_STEP_SATURATED_FRAC = "attn_step/saturated_frac"

# ---------------------------------------------------------------- evaluation (every eval_every steps and at the end)
EVAL_LOSS_AS_TRAINED = "eval/loss_as_trained"
EVAL_LOSS_GENERATION = "eval/loss_generation"
EVAL_GAP = "eval/gap"
EVAL_FLOOR = "eval/floor"
EVAL_FLOOR_SE = "eval/floor_se"
EVAL_BELOW_FLOOR = "eval/below_floor"
EVAL_LOSS_SE = "eval/loss_se"
EVAL_LOSS_TRAIN_SPLIT = "eval/loss_train_split"
EVAL_SAMPLE = "eval/sample"
EVAL_SAMPLE_TEXT = "eval/sample_text"
BEST_EVAL_LOSS = "best/eval/loss_as_trained"
BEST_EVAL_STEP = "best/eval/step"

# ---------------------------------------------------------------- the probe (every probe.every steps)
PROBE_LOSS = "probe/loss"
ATTN_ENTROPY = "attn/entropy"
ATTN_ENTROPY_NORM = "attn/entropy_norm"
ATTN_MAX_PROB = "attn/max_prob"
ATTN_SATURATED_FRAC = "attn/saturated_frac"
ATTN_SCORE_STD = "attn/score_std"
ATTN_SCORE_MAX = "attn/score_max"
ATTN_SCORE_MAX_MAX = "attn/score_max_max"
ATTN_Q_STD = "attn/q_std"
ATTN_K_STD = "attn/k_std"
ATTN_JAC_NORM = "attn/jac_norm"
ATTN_JAC_DEAD_FRAC = "attn/jac_dead_frac"
ATTN_QK_SPECTRAL = "attn/qk_spectral"
GRAD_SCORES = "grad/scores"
GRAD_SCORES_ROW_P10 = "grad/scores_row_p10"
GRAD_SCORES_ROW_P50 = "grad/scores_row_p50"
GRAD_SCORES_ROW_P90 = "grad/scores_row_p90"
GRAD_SCORES_DEAD_FRAC = "grad/scores_dead_frac"
GRAD_SCORES_TOP10_SHARE = "grad/scores_top10_share"
GRAD_EMBED = "grad/embed"
GRAD_HEAD = "grad/head"

# ---------------------------------------------------------------- the run's summary (summary.json)
RUN_STATUS = "run/status"
RUN_STEPS = "run/steps"
RUN_WALL_S = "run/wall_s"
RUN_START_STEP = "run/start_step"
RUN_ERROR = "run/error"
MODEL_PARAMS = "model/params"
DATA_LOG_VOCAB = "data/log_vocab"
DATA_UNIGRAM_XENT = "data/unigram_xent"
DATA_BIGRAM_XENT = "data/bigram_xent"
DATA_TRAIN_TOKENS = "data/train_tokens"
DATA_EPOCHS = "data/epochs"
SYSTEM_GPU = "system/gpu"
SYSTEM_TORCH = "system/torch"
SYSTEM_CUDA = "system/cuda"
RUN_GIT_COMMIT = "run/git_commit"
RUN_GIT_DIRTY = "run/git_dirty"
RUN_CODE_SHA = "run/code_sha"
# where the run's wall time went (andrea_exp/training/phases.py), seconds each: the loop's timed phases, and the
# steps as the loop less those; set-up before the loop, the end after it
LOOP_PHASES = ("probes", "evals", "maps", "checkpoints")
RUN_TIME = {phase: f"run/time/{phase}_s" for phase in ("setup", "steps", *LOOP_PHASES, "end")}

RUN_STATUSES = ("finished", "diverged", "failed", "interrupted", "timeout")

METRICS: tuple[Metric, ...] = (
    _m(TRAIN_LOSS, "training loss of the step (mean token cross-entropy, plus train/z_loss when train.z_loss > 0, "
                   "averaged over processes)"),
    _m(TRAIN_LR, "learning rate the step used (warmup, then cosine)"),
    _m(TRAIN_TOKENS, "tokens seen up to and including the step"),
    _m(TRAIN_TOKENS_PER_S, "training throughput over the logging window (evaluation and checkpoints excluded)"),
    _m(TRAIN_GRAD_CLIP_FRAC, "share of the window's steps whose gradient norm exceeded train.grad_clip"),
    _m(GRAD_NORM, "global L2 norm of all parameter gradients, before clipping"),
    _m(TRAIN_OUT_LOGZ_MEAN, "log Z = logsumexp of a position's output logits, mean over the step's training positions "
                            "(of the first process's share of the batch)"),
    _m(TRAIN_OUT_LOGZ_MAX, "largest log Z over the step's training positions"),
    _m(TRAIN_OUT_LOGIT_MAX, "largest absolute output logit over the step's training positions and the vocabulary"),
    _m(TRAIN_Z_LOSS, "train.z_loss x mean log Z^2: what z-loss added to train/loss (logged when train.z_loss > 0)"),
    _m(ATTN_STEP_SCORE_MAX, "largest scaled pre-softmax score (attention logit) over visible entries of the step's "
                            "training batch (train.attn_stats); per layer the max over heads, pooled the max over "
                            "layers", True),
    _m(ATTN_STEP_ENTROPY, "entropy of the training batch's attention rows (nats), mean over layers, heads and rows",
       True),
    _m(ATTN_STEP_ENTROPY_NORM, "training batch's row entropy / log(number of visible keys), mean over rows with more "
                               "than one visible key, heads and layers", True),
    _m(ATTN_STEP_MAX_PROB, "largest probability of a training batch's attention row, mean over rows, heads and "
                           "layers", True),
    _m(ATTN_STEP_MAX_PROB_MAX, "largest probability in the training batch's attention rows with more than one "
                               "visible key; per layer the max over heads, pooled the max over layers", True),
    _m(ATTN_STEP_SATURATED_FRAC, "share of the training batch's attention rows whose largest probability exceeds "
                                 "0.99, mean over heads and layers", True),
    _m(EVAL_LOSS_AS_TRAINED, "teacher-forced held-out loss with the model's own mask setting"),
    _m(EVAL_LOSS_GENERATION, "held-out loss when position i sees only tokens 0..i, as in generation"),
    _m(EVAL_GAP, "loss_generation - loss_as_trained (of the same windows, train.generation_sequences): "
                 "what leaking future tokens costs at inference"),
    _m(EVAL_FLOOR, "exact entropy of the held-out tokens under the true source (built-in data only)"),
    _m(EVAL_FLOOR_SE, "sampling standard error of the floor over the held-out sequences (its noise as an estimate)"),
    _m(EVAL_BELOW_FLOOR, "floor - loss_as_trained: positive only when the model reads the future"),
    _m(EVAL_LOSS_SE, "standard error of eval/loss_as_trained over the held-out windows (std of per-window means / "
                     "sqrt(windows))"),
    _m(EVAL_LOSS_TRAIN_SPLIT, "teacher-forced loss with the model's own mask on a fixed set of training windows, as "
                              "many as the held-out ones: beside eval/loss_as_trained it tells memorising from "
                              "stalling"),
    _m(PROBE_LOSS, "loss of the fixed probe batch, float32, explicit attention path"),
    _m(ATTN_ENTROPY, "entropy of the attention rows (nats), mean over layers, heads and rows", True),
    _m(ATTN_ENTROPY_NORM, "row entropy / log(number of visible keys): 1 uniform, 0 one-hot", True),
    _m(ATTN_MAX_PROB, "largest probability of a row, mean over rows", True),
    _m(ATTN_SATURATED_FRAC, "share of rows whose largest probability exceeds 0.99", True),
    _m(ATTN_SCORE_STD, "std of the scaled pre-softmax scores over visible entries", True),
    _m(ATTN_SCORE_MAX, "largest scaled pre-softmax score (attention logit) over visible entries, per head; mean over "
                       "heads and layers", True),
    _m(ATTN_SCORE_MAX_MAX, "the largest attention logit itself: per layer the max over heads of attn/score_max's "
                           "per-head value, pooled the max over layers", True),
    _m(ATTN_Q_STD, "std of the query components", True),
    _m(ATTN_K_STD, "std of the key components", True),
    _m(ATTN_JAC_NORM, "mean Frobenius norm of the softmax Jacobian diag(p) - p p^T over rows with >1 visible key",
       True),
    _m(ATTN_JAC_DEAD_FRAC, "share of those rows whose Jacobian norm is below probe.dead_jac", True),
    _m(ATTN_QK_SPECTRAL, "largest singular value over heads of scale * W_q^h W_k^h^T (max over layers pooled)", True),
    _m(GRAD_SCORES, "L2 norm of d loss / d scores, the gradient through softmax (global over layers)", True),
    _m(GRAD_SCORES_ROW_P10, "10th percentile over query rows of ||d loss / d S_i||", True),
    _m(GRAD_SCORES_ROW_P50, "median over query rows of ||d loss / d S_i||", True),
    _m(GRAD_SCORES_ROW_P90, "90th percentile over query rows of ||d loss / d S_i||", True),
    _m(GRAD_SCORES_DEAD_FRAC, "share of query rows whose ||d loss / d S_i|| is below probe.dead_grad", True),
    _m(GRAD_SCORES_TOP10_SHARE, "share of the summed squared row gradient norms carried by the top 10% of rows", True),
    _m("grad/L{l}/q", "L2 norm of the gradient of layer l's query projection (and its QK-LayerNorm)"),
    _m("grad/L{l}/k", "L2 norm of the gradient of layer l's key projection (and its QK-LayerNorm)"),
    _m("grad/L{l}/v", "L2 norm of the gradient of layer l's value projection"),
    _m("grad/L{l}/o", "L2 norm of the gradient of layer l's output projection"),
    _m("grad/L{l}/mlp", "L2 norm of the gradient of layer l's MLP"),
    _m(GRAD_EMBED, "L2 norm of the gradient of the token and position embeddings"),
    _m(GRAD_HEAD, "L2 norm of the gradient of the output head (the tied token embedding by default)"),
)

SUMMARY_KEYS: tuple[Metric, ...] = (
    _m(RUN_STATUS, "finished, diverged, failed, interrupted or timeout (a SLURM time limit)"),
    _m(RUN_STEPS, "optimiser steps taken"),
    _m(RUN_WALL_S, "wall time of the training loop in seconds"),
    _m(RUN_START_STEP, "the step the last segment began at: 0, or the checkpoint's step for a resumed run (it ran "
                       "run/steps - run/start_step steps, in run/wall_s)"),
    _m(RUN_ERROR, "why the run diverged or failed, in one line"),
    _m(TRAIN_WORLD_SIZE, "processes in the run (1 without torchrun)"),
    _m(MODEL_PARAMS, "trainable parameters, tied weights counted once"),
    _m(DATA_LOG_VOCAB, "log of the vocabulary size: the loss of a uniform guess"),
    _m(DATA_UNIGRAM_XENT, "held-out cross-entropy under add-one smoothed token counts of the training split: the "
                          "loss of a model that learned only frequencies"),
    _m(DATA_BIGRAM_XENT, "held-out cross-entropy under Witten-Bell smoothed pair counts of the training split: "
                         "about the loss of a model that uses only the previous token (no working attention)"),
    _m(DATA_TRAIN_TOKENS, "target tokens of the training split the batches draw from (training windows x T)"),
    _m(DATA_EPOCHS, "passes over the training split: tokens seen / data/train_tokens; above 1 the run saw some "
                    "windows again"),
    _m(SYSTEM_GPU, "GPU name, or cpu"),
    _m(SYSTEM_TORCH, "torch version"),
    _m(SYSTEM_CUDA, "CUDA version torch was built with (null on a CPU build)"),
    _m(RUN_GIT_COMMIT, "git commit of the code that ran (null outside a git checkout)"),
    _m(RUN_GIT_DIRTY, "whether that checkout had uncommitted changes"),
    _m(RUN_CODE_SHA, "SHA-256 (12 hex digits) of the package's .py files and the Hydra configs as they ran: "
                     "names the code even where git metadata is missing or stale"),
    _m(RUN_TIME["setup"], "seconds from the start of training's set-up (data, model, optimiser) to the first step"),
    _m(RUN_TIME["steps"], "seconds of the step loop spent on training steps (the loop less the phases below)"),
    _m(RUN_TIME["probes"], "seconds the loop spent in probes"),
    _m(RUN_TIME["evals"], "seconds the loop spent in held-out evaluations"),
    _m(RUN_TIME["maps"], "seconds the loop spent on attention maps (the probe's forward, the arrays written; "
                        "a process of their own draws the PNGs)"),
    _m(RUN_TIME["checkpoints"], "seconds the loop spent writing checkpoints"),
    _m(RUN_TIME["end"], "seconds after the loop: the final probe, evaluation, checkpoint and sample"),
    _m(EVAL_SAMPLE, "tokens generated from a held-out prompt at the end"),
    _m(EVAL_SAMPLE_TEXT, "that sample decoded as text (data=text only)"),
    _m(BEST_EVAL_LOSS, "lowest eval/loss_as_trained seen"),
    _m(BEST_EVAL_STEP, "training step of that evaluation"),
)

MEANINGS: dict[str, str] = {m.key: m.meaning for m in METRICS + SUMMARY_KEYS}
PER_LAYER: tuple[str, ...] = tuple(m.key for m in METRICS if m.per_layer)


def per_layer(key: str, layer: int) -> str:
    """attn/entropy, 2 -> attn/L2/entropy."""
    namespace, rest = key.split("/", 1)
    return f"{namespace}/L{layer}/{rest}"


# how W&B charts the history (runs/tracking.py defines them): held-out losses keep their lowest value beside the
# last in the run's summary; a constant of the data is a number of the summary, not a chart
MIN_IN_SUMMARY: tuple[str, ...] = (EVAL_LOSS_AS_TRAINED, EVAL_LOSS_GENERATION)
CONSTANTS: tuple[str, ...] = (EVAL_FLOOR, EVAL_FLOOR_SE)


def layer_of(key: str) -> int | None:
    """The layer of a per-layer or per-head key (`attn/L3/entropy`, `attn_step/L3/H1/max_prob` -> 3), else None."""
    parts = key.split("/")
    if len(parts) >= 3 and parts[1][:1] == "L" and parts[1][1:].isdigit():
        return int(parts[1][1:])
    return None


def is_known(key: str) -> bool:
    """A logged key is in the registry, pooled, per layer (`L{l}/`) or per head (`L{l}/H{h}/`)."""
    if key in MEANINGS:
        return True
    parts = key.split("/")
    if len(parts) >= 3 and parts[1].startswith("L") and parts[1][1:].isdigit():
        rest = parts[2:]
        if rest and rest[0].startswith("H") and rest[0][1:].isdigit():
            rest = rest[1:]
        pooled = "/".join([parts[0], *rest])
        return pooled in PER_LAYER or f"{parts[0]}/L{{l}}/{'/'.join(rest)}" in MEANINGS
    return False
