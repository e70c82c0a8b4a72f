"""The training loop: optimiser, schedule, probes, evaluation, checkpoints, divergence, interrupts.

Read `train()` from top to bottom: set-up, the step loop, the end of the run. What must survive a
resume lives in `LoopState`. The loop's surroundings each have a module of their own: the device and
precision (`runtime`), the train/* rows, one host sync per window (`logwindow`), the bar (`progress`),
signals (`interrupts`) and the summary's facts about code and machine (`runfacts`).

Resuming (`train.resume=true hydra.run.dir=RUN`): the checkpoint records the run's resolved scientific
settings (`andrea_exp.config.schema.is_scientific`: model, data, optimiser, schedule, precision, probe
thresholds, ...) and a resume that changes any of them is refused in one line naming them. Operational
settings may change on resume: logging (`logger.*`), device, compile, progress, the cadences
(`train.eval_every`, `train.log_every`, `train.ckpt_every`, `probe.every`, `probe.maps_every`), the
sample length, the seed's name and the launcher. A finished run is left as it is.

SIGINT or SIGTERM ends the current step, writes a checkpoint and a summary with `run/status:
interrupted`, and the command exits 130 / 143 after printing how to resume; a second signal kills.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from andrea_exp.config.schema import Config, ProbeSchema, TrainSchema
from andrea_exp.data.epochs import epochs, repeat_line
from andrea_exp.instruments import attn_stats
from andrea_exp.instruments.evaluate import evaluate, generate
from andrea_exp.model.decoder import Andrea
from andrea_exp.runs import metric_keys as K
from andrea_exp.runs import run_guard
from andrea_exp.runs.end_lines import end_of_run_lines
from andrea_exp.runs.rundir import CHECKPOINT_DIR, read_summary
from andrea_exp.runs.tracking import Tracker
from andrea_exp.training import checkpoint
from andrea_exp.training.cell import build_cell
from andrea_exp.training.interrupts import Interrupted, StopRequest
from andrea_exp.training.logwindow import LogWindow
from andrea_exp.training.phases import PhaseClock
from andrea_exp.training.progress import Progress
from andrea_exp.training.runfacts import run_facts
from andrea_exp.training.runtime import Runtime, setup_runtime


class Diverged(Exception):
    """Training left the finite or the plausible: a result, not a crash."""


class AlreadyFinished(Exception):
    """train.resume on a run that finished or diverged (a result): nothing to do, nothing written."""

    def __init__(self, run_dir: Path, summary: dict):
        steps, status = summary.get(K.RUN_STEPS), summary.get(K.RUN_STATUS)
        done = f"finished ({steps} steps)" if status == "finished" else f"{status} at step {steps}"
        super().__init__(f"{run_dir} already {done}; nothing to resume")
        self.summary = summary


# ---------------------------------------------------------------- set-up




def describe_model(cfg, model: Andrea, device) -> str:
    m = cfg.model
    return (f"[andrea-exp] model {m.name}: {model.num_params() / 1e6:.2f}M parameters (d_model {m.d_model}, "
            f"{m.n_layer} layers, {m.n_head} heads, d_k {m.d_k}, d_v {m.d_v}, vocab {model.cfg.vocab_size}) "
            f"on {device}")




def local_batch_size(batch_size: int, world_size: int) -> int:
    if batch_size % world_size:
        raise ValueError(f"train.batch_size ({batch_size}) must be divisible by the number of processes "
                         f"({world_size})")
    return batch_size // world_size




def build_probe(probe_cfg: ProbeSchema, model, held_out, run_dir: Path, rt: Runtime):
    if probe_cfg.every <= 0 or not rt.is_main:
        return None
    from andrea_exp.instruments import map_worker
    from andrea_exp.instruments.probe import Probe

    return Probe(model, held_out[: probe_cfg.batch_size], probe_cfg, run_dir, drawer=map_worker.shared())


def probe_due(step: int, probe_cfg: ProbeSchema) -> bool:
    """Probe at this step? Every `dense_every` steps while step < `dense_until`, then every `every`; every=0: never."""
    if probe_cfg.every <= 0:
        return False
    if probe_cfg.dense_every > 0 and step < probe_cfg.dense_until:
        return step % probe_cfg.dense_every == 0
    return step % probe_cfg.every == 0


# ---------------------------------------------------------------- what survives a resume


class DivergenceWatch:
    """Non-finite loss or gradient, or a loss above factor x the initial loss `patience` times in a row."""

    def __init__(self, factor: float, patience: int):
        self.factor, self.patience = factor, patience
        self.initial: float | None = None
        self.streak = 0

    def state(self) -> dict:
        return {"initial_loss": self.initial, "diverge_streak": self.streak}

    def load_state(self, state: dict) -> None:
        self.initial, self.streak = state.get("initial_loss"), state.get("diverge_streak", 0)

    def check(self, step: int, loss: float, gnorm: float) -> None:
        if not (math.isfinite(loss) and math.isfinite(gnorm)):
            raise Diverged(f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at step {step}")
        if self.initial is None:
            self.initial = loss
        self.streak = self.streak + 1 if loss > self.factor * self.initial else 0
        if self.streak >= self.patience:
            raise Diverged(f"loss {loss:.3g} above {self.factor:g} x initial {self.initial:.3g} for "
                           f"{self.patience} steps at step {step}")


def _plain(metrics: dict) -> dict:
    """Numbers and strings only, so a checkpoint stays loadable with weights_only=True."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[key] = value
    return out


@dataclass
class LoopState:
    """Everything besides weights, optimiser, schedule and random streams that a resumed run needs to carry
    on as if it had never stopped."""
    watch: DivergenceWatch
    step: int = 0
    best_eval: float = math.inf
    best_step: int | None = None         # step of best_eval (which checkpoint is best.pt)
    last: dict = field(default_factory=dict)  # latest value of every key, for the summary
    records_step: int | None = None      # the step `records` were logged at
    records: list = field(default_factory=list)  # logged at records_step: the evaluation just before a checkpoint

    def to_checkpoint(self, max_steps: int, scientific: dict) -> dict:
        here = self.records if self.records_step == self.step else []
        return {**self.watch.state(), "best_eval": self.best_eval, "best_step": self.best_step,
                "max_steps": max_steps, "settings": scientific, "last": _plain(self.last),
                "records_at_step": [_plain(r) for r in here]}

    def load_checkpoint(self, state: dict) -> None:
        extra = state["extra"]
        self.watch.load_state(extra)
        self.step, self.best_eval = state["step"], extra.get("best_eval", math.inf)
        self.best_step = extra.get("best_step")
        self.last = dict(extra.get("last", {}))


def log(tracker: Tracker, st: LoopState, metrics: dict, at: int) -> None:
    st.last.update(metrics)
    tracker.log(metrics, at)
    if st.records_step != at:
        st.records_step, st.records = at, []
    st.records.append(metrics)


def load_resume_state(train_cfg: TrainSchema, run_dir: Path, scientific: dict, is_main: bool) -> dict | None:
    """The checkpoint to continue from, or None for a run that never started (a sweep's cell: from step 0).
    Refuses changed scientific settings and a run with nothing to continue from (CheckpointError, nothing
    written); stops at a finished or diverged run (AlreadyFinished)."""
    if not train_cfg.resume:
        return None
    ckpt_dir = run_dir / CHECKPOINT_DIR
    state = checkpoint.load(ckpt_dir)
    if state is not None:
        checkpoint.check_settings(state["extra"].get("settings"), scientific, ckpt_dir / checkpoint.LATEST)
    held = run_guard.holding(run_dir)
    # a finished run asked for more steps goes on to restore(), which names train.max_steps
    more_steps = held.kind == run_guard.FINISHED and state is not None and state["step"] < train_cfg.max_steps
    if held.kind in run_guard.DONE and not more_steps:
        raise AlreadyFinished(run_dir, read_summary(run_dir))
    if state is not None:
        return state
    if held.kind not in run_guard.FREE:  # the command line's and the job's checks refuse it before this
        raise checkpoint.CheckpointError(run_guard.refusal(run_dir, held, resume=True, overwrite=False,
                                                           in_sweep=True))
    if is_main:
        print(f"[andrea-exp] {run_dir} never started; starting it from step 0", flush=True)
    return None





# ---------------------------------------------------------------- between steps: checkpoints, evaluation, rows


def save_checkpoint(ckpt_dir: Path, st: LoopState, train_cfg: TrainSchema, scientific: dict, model, optimizer,
                    scheduler) -> None:
    checkpoint.save(ckpt_dir, step=st.step, model=model, optimizer=optimizer, scheduler=scheduler,
                    extra=st.to_checkpoint(train_cfg.max_steps, scientific))
    if train_cfg.keep_checkpoints > 0:
        checkpoint.keep_copies(ckpt_dir, st.step, train_cfg.keep_checkpoints, is_best=st.best_step == st.step)


def evaluate_into(tracker: Tracker, st: LoopState, model, data, rt: Runtime, train_cfg: TrainSchema) -> None:
    """Held-out evaluation at st.step (rank 0 only), logged; the best value follows the held-out loss."""
    with rt.autocast():
        metrics = evaluate(model, data.eval.tokens, data.floor, data.floor_standard_error,
                           generation_sequences=train_cfg.generation_sequences, held_in=data.held_in())
    if metrics[K.EVAL_LOSS_AS_TRAINED] < st.best_eval:
        st.best_eval, st.best_step = metrics[K.EVAL_LOSS_AS_TRAINED], st.step
    log(tracker, st, metrics, st.step)


def flush_window(window: LogWindow, tracker: Tracker, st: LoopState, progress: Progress,
                 stats: attn_stats.StepStats | attn_stats.Off = attn_stats.OFF) -> None:
    """Log the window's rows (with the steps' attn_step/* values, train.attn_stats), then check them for
    divergence: a diverged run keeps every record it made."""
    rows = window.flush()
    step_stats = stats.flush()
    for at, row in rows:
        log(tracker, st, {**row, **step_stats.get(at, {})}, at)
    for at, row in rows:
        st.watch.check(at, row[K.TRAIN_LOSS], row[K.GRAD_NORM])
    if rows:
        progress.note(st.step, rows[-1][1][K.TRAIN_LOSS])


def measure_probe(probe, tracker: Tracker, st: LoopState, probe_cfg: ProbeSchema, window: LogWindow,
                  clock: PhaseClock) -> None:
    """The probe's metrics and attention maps when due at st.step."""
    if probe is None:
        return
    if probe_due(st.step, probe_cfg):
        with clock.phase("probes"):
            log(tracker, st, probe.measure(st.step), st.step)
    if probe_cfg.maps_every and st.step % probe_cfg.maps_every == 0:
        with window.aside(), clock.phase("maps"):  # drawing PNGs and handing them to W&B is not training
            tracker.log_images(probe.draw_maps(st.step), st.step)


def reference_record(data) -> dict:
    """The data's reference losses for the summary (andrea_exp.data.references): unigram and bigram levels."""
    refs = data.references
    return {K.DATA_UNIGRAM_XENT: refs.get("unigram"), K.DATA_BIGRAM_XENT: refs.get("bigram")} if refs else {}


def epochs_record(data, steps: int, tokens_per_step: int) -> dict:
    """Passes over the training split so far (andrea_exp.data.epochs), for the summary."""
    return {K.DATA_TRAIN_TOKENS: data.train_tokens, K.DATA_EPOCHS: epochs(steps * tokens_per_step, data.train_tokens)}


def sample_record(cfg, model, data, rt: Runtime) -> dict:
    """Tokens generated from a held-out prompt, as ids and, for text data, decoded."""
    prompt = data.eval.tokens[:1, : min(8, data.eval.tokens.size(1))]
    with rt.autocast():
        sample = generate(model.eval(), prompt, cfg.train.sample_tokens, seed=cfg.seed)[0].tolist()
    text = data.decode(sample)
    return {K.EVAL_SAMPLE: " ".join(map(str, sample)), **({K.EVAL_SAMPLE_TEXT: text} if text is not None else {})}


# ---------------------------------------------------------------- the loop


def train(settings: Config, run_dir: Path) -> dict:
    """Train one run described by `settings` (validate()'s, checked) into run_dir; return its summary. Raises
    Interrupted after SIGINT / SIGTERM (checkpoint and summary written), AlreadyFinished for a finished run,
    errors on real errors."""
    tc, pc, record = settings.train, settings.probe, settings.record()
    rt = setup_runtime(settings)
    clock = PhaseClock(rt.device)
    ckpt_dir, scientific = run_dir / CHECKPOINT_DIR, checkpoint.scientific_settings(record)
    resumed = load_resume_state(tc, run_dir, scientific, rt.is_main)
    cell = build_cell(settings, rt, resumed, ckpt_dir / checkpoint.LATEST)
    data, model, optimizer, scheduler, stats, step = (cell.data, cell.model, cell.optimizer, cell.scheduler,
                                                      cell.stats, cell.step)
    if rt.is_main:
        print(describe_model(settings, model, rt.device), flush=True)
        repeat = repeat_line(tc.max_steps, settings.tokens_per_step, data.train_tokens)
        if repeat:
            print(repeat, flush=True)
    local_bs = local_batch_size(tc.batch_size, rt.world_size)
    st = LoopState(DivergenceWatch(tc.diverge_factor, tc.diverge_patience))
    if resumed is not None:
        st.load_checkpoint(resumed)
        if rt.is_main:
            print(f"[andrea-exp] resuming {run_dir} from step {st.step}", flush=True)
    start_step = st.step  # this segment's first step: 0, or the checkpoint's
    tracker = Tracker(run_dir, record, enabled=rt.is_main, resume_step=st.step if resumed is not None else None)
    probe = build_probe(pc, model, data.eval.tokens, run_dir, rt)
    window = LogWindow(settings.tokens_per_step, tc.grad_clip, z_loss=model.z_loss)
    progress = Progress(settings, rt, st.step)

    if resumed is not None and st.step < tc.max_steps:
        for record_at_step in resumed["extra"].get("records_at_step", []):
            log(tracker, st, record_at_step, st.step)  # metrics.jsonl was cut at the checkpoint's step
    if resumed is not None:
        checkpoint.set_rng_state(resumed["rng"])  # last, after every set-up step that might draw numbers

    status, error = "finished", None
    clock.loop_start()
    try:
        try:
            with StopRequest() as stop:
                if resumed is None and tc.eval_every and tc.max_steps > 0 and rt.is_main:
                    with window.aside(), clock.phase("evals"):  # the held-out loss before training: its start
                        evaluate_into(tracker, st, model, data, rt, tc)
                while st.step < tc.max_steps:
                    measure_probe(probe, tracker, st, pc, window, clock)
                    x, y = data.batch(st.step, local_bs, settings.seed, rt.rank, rt.world_size)
                    stats.before_step(st.step)
                    window.add(st.step, *step(x, y), model.out_stats.clone())  # the output logits' stats
                    stats.after_step(st.step)
                    st.step += 1
                    progress.update()
                    eval_due = tc.eval_every and st.step % tc.eval_every == 0 and st.step < tc.max_steps
                    ckpt_due = tc.ckpt_every and st.step % tc.ckpt_every == 0 and st.step < tc.max_steps
                    # a checkpoint at step S must follow every record of steps < S and the divergence checks
                    at_sync = len(window) >= tc.log_every or st.step == tc.max_steps or eval_due or ckpt_due
                    stopping = stop.agreed(rt, at_sync) and st.step < tc.max_steps
                    if at_sync or stopping:
                        flush_window(window, tracker, st, progress, stats)
                    if eval_due and rt.is_main:
                        with window.aside(), clock.phase("evals"):
                            evaluate_into(tracker, st, model, data, rt, tc)
                    if (ckpt_due or stopping) and rt.is_main:
                        with window.aside(), clock.phase("checkpoints"):
                            save_checkpoint(ckpt_dir, st, tc, scientific, model, optimizer, scheduler)
                    if stopping:
                        status = stop.status_of(stop.signum)  # interrupted, or timeout (SLURM)
                        break
        except Diverged as why:
            status, error = "diverged", str(why)
            if rt.is_main:
                print(f"[andrea-exp] diverged: {why}", flush=True)
        finally:
            progress.close()
            clock.loop_end()
        summary = {K.RUN_STATUS: status, K.RUN_STEPS: st.step, K.RUN_START_STEP: start_step,
                   K.RUN_WALL_S: clock.loop_s,
                   **run_facts(rt, model, data.vocab_size), **reference_record(data),
                   **epochs_record(data, st.step, settings.tokens_per_step),
                   **({K.RUN_ERROR: error} if error else {})}
        if status == "finished" and rt.is_main:
            with clock.phase("end"):  # the final probe, evaluation, checkpoint and sample
                if probe is not None and pc.maps_every:  # the attention the run ends with, whatever the cadence;
                    tracker.log_images(probe.draw_maps(st.step), st.step)  # first: drawn while the rest runs
                if probe is not None:
                    log(tracker, st, probe.measure(st.step), st.step)
                evaluate_into(tracker, st, model, data, rt, tc)
                save_checkpoint(ckpt_dir, st, tc, scientific, model, optimizer, scheduler)
                summary.update(sample_record(settings, model, data, rt))
        summary.update(clock.summary())
    except Exception as err:
        # the disk that failed the run may refuse its summary too: the error raised is still the first one
        with contextlib.suppress(OSError):
            tracker.finish({K.RUN_STATUS: "failed", K.RUN_ERROR: f"{type(err).__name__}: {err}", K.RUN_STEPS: st.step,
                            K.TRAIN_WORLD_SIZE: rt.world_size, **st.last}, failed=True)
        raise
    summary.update(st.last)
    summary[K.BEST_EVAL_LOSS] = st.best_eval if math.isfinite(st.best_eval) else None
    summary[K.BEST_EVAL_STEP] = st.best_step
    if rt.is_main and status != "interrupted":  # before the W&B run closes: its console log keeps the results
        print("\n".join(end_of_run_lines(summary, run_dir)), flush=True)
    tracker.finish(summary)
    if status in Interrupted.STATUSES:
        raise Interrupted(stop.signum, summary)
    return summary
