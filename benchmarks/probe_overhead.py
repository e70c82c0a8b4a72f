"""What the probes cost: tokens/s of the real train loop with probes at the default cadence vs probes off.

Both settings train the same model for the same steps in this one process, in ABBA order over
--repeats so drift of the machine cancels. tokens/s is total tokens / total time of the logging
windows that start at or after --warmup (evaluation, checkpoints and attention maps are already kept
out of those windows by the train loop; probe.measure is not, so its cost shows).

A small model's step is bound by kernel launches on the host, and its speed drifts by several
percent between runs, more than a probe every 100 steps costs. So the script also times one probe
directly (synchronised, on the same model and batch) and reports the ratio that cost implies:
1 / (1 + probe_ms / (probe_every * step_ms)), with step_ms from the probes-off runs.

    PYTHONPATH=. python3 benchmarks/probe_overhead.py                     # andrea_small on CUDA
    PYTHONPATH=. python3 benchmarks/probe_overhead.py --device cpu --model andrea_tiny --steps 50
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from andrea_exp.training.cell import build_cell
from andrea_exp.training.loop import build_probe, train
from benchmarks.common import compose_cfg, git_commit, steady_throughput

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "probe_overhead.json"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="andrea_small", help="model preset (conf/model)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--steps", type=int, default=600, help="training steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=100,
                        help="steps left out of the timing (clamped to steps/2)")
    parser.add_argument("--probe-every", type=int, default=None, help="probe cadence; default: conf/probe")
    parser.add_argument("--repeats", type=int, default=4, help="runs per setting, in ABBA order")
    parser.add_argument("--compile", action="store_true", help="train.compile=true")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="any further Hydra override, applied to both settings (repeatable)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device is visible; use --device cpu")
    if args.steps < 2 or args.repeats < 1:
        parser.error("--steps must be >= 2 and --repeats >= 1")
    return args


def timed_run(overrides: list[str], warmup: int) -> dict:
    cfg = compose_cfg(overrides)
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(cfg, Path(tmp))
        figures = steady_throughput(Path(tmp), warmup)
    figures["status"] = summary["run/status"]
    return figures


def probe_ms(cfg, repeats: int = 20) -> float:
    """Wall time of one Probe.measure on the run's model and probe batch, synchronised, after warm-up."""
    cell = build_cell(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        probe = build_probe(cfg.probe, cell.model, cell.data.eval.tokens, Path(tmp), cell.rt)
        sync = torch.cuda.synchronize if cell.rt.device.type == "cuda" else (lambda: None)
        for _ in range(3):
            probe.measure(0)
        sync()
        start = time.perf_counter()
        for _ in range(repeats):
            probe.measure(0)
        sync()
    return 1e3 * (time.perf_counter() - start) / repeats


def main(argv=None) -> dict:
    args = parse_args(argv)
    warmup = min(args.warmup, args.steps // 2)
    common = [f"model={args.model}", f"train.max_steps={args.steps}", f"train.device={args.device}",
              f"train.compile={str(args.compile).lower()}", "logger.mode=disabled", "train.progress=false",
              *args.override]
    probe_every = args.probe_every if args.probe_every is not None else int(compose_cfg(common).probe.every)
    if probe_every < 1:
        sys.exit("--probe-every must be >= 1 (the probes-on setting needs probes)")
    probes_timed = sum(1 for s in range(warmup, args.steps) if s % probe_every == 0)
    if probes_timed == 0:
        print(f"note: no probe falls in the timed steps {warmup}..{args.steps - 1} at probe.every={probe_every}; "
              "the ratio will read about 1", file=sys.stderr)
    settings = {"on": common + [f"probe.every={probe_every}"], "off": common + ["probe.every=0"]}

    totals = {label: {"tokens": 0.0, "seconds": 0.0, "runs": []} for label in settings}
    for r in range(args.repeats):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        for label in order:
            figures = timed_run(settings[label], warmup)
            totals[label]["tokens"] += figures["timed_tokens"]
            totals[label]["seconds"] += figures["timed_s"]
            totals[label]["runs"].append(figures)
            print(f"repeat {r} probes {label:3s}: {figures['tokens_per_s']:>12,.0f} tokens/s "
                  f"({figures['status']})", flush=True)

    on = totals["on"]["tokens"] / totals["on"]["seconds"]
    off = totals["off"]["tokens"] / totals["off"]["seconds"]
    pair_ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(totals["on"]["runs"], totals["off"]["runs"])]
    cfg = compose_cfg(settings["on"])
    tokens_per_step = int(cfg.train.batch_size) * int(cfg.data.seq_len)
    step_ms = 1e3 * tokens_per_step / off
    one_probe_ms = probe_ms(cfg)
    implied = 1.0 / (1.0 + one_probe_ms / (probe_every * step_ms))
    result = {
        "tokens_per_s_probe_on": on,
        "tokens_per_s_probe_off": off,
        "ratio": on / off,
        "ratio_median_of_pairs": statistics.median(pair_ratios),
        "pair_ratios": pair_ratios,
        "probe_ms": one_probe_ms,
        "step_ms_probe_off": step_ms,
        "ratio_implied_by_probe_ms": implied,
        "gpu": torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else "cpu",
        "commit": git_commit(),
        "settings": {
            "model": args.model, "device": args.device, "steps": args.steps, "warmup_steps_excluded": warmup,
            "probe_every": probe_every, "probes_in_timed_steps": probes_timed,
            "probe_batch_size": int(cfg.probe.batch_size), "maps_every": int(cfg.probe.maps_every),
            "batch_size": int(cfg.train.batch_size), "seq_len": int(cfg.data.seq_len),
            "d_model": int(cfg.model.d_model), "n_layer": int(cfg.model.n_layer), "d_k": int(cfg.model.d_k),
            "compile": args.compile, "precision": str(cfg.train.precision), "repeats": args.repeats,
            "overrides": args.override, "torch": torch.__version__,
        },
        "runs": {label: totals[label]["runs"] for label in settings},
    }
    print(f"probes on  (every {probe_every}): {on:>12,.0f} tokens/s")
    print(f"probes off:            {off:>12,.0f} tokens/s")
    print(f"ratio on/off: {on / off:.4f} (median of ABBA pairs {result['ratio_median_of_pairs']:.4f}) "
          f"on {result['gpu']}")
    print(f"one probe {one_probe_ms:.1f} ms, one step {step_ms:.2f} ms: implied ratio {implied:.4f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
