"""Tracker: metrics.jsonl and W&B (offline, read back with `wandb leet inspect --json`)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from andrea_exp.runs import tracking
from andrea_exp.runs.tracking import Tracker, logged_in, resolve_mode

WANDB = str(Path(sys.executable).with_name("wandb"))


def read_run(wandb_dir: Path) -> dict:
    """One offline run read back with W&B's own reader: run record, history keys, state, summary."""
    records = subprocess.run([WANDB, "leet", "inspect", "--json", str(wandb_dir)], capture_output=True, text=True,
                             check=True).stdout
    summary = json.loads(subprocess.run([WANDB, "leet", "inspect", "--summary", "--json", str(wandb_dir)],
                                        capture_output=True, text=True, check=True).stdout)
    run, history, metrics, environment, console = {}, [], {}, {}, []
    for line in records.splitlines():
        record = json.loads(line)
        if record["type"] == "run":
            run.update(record["run"])
        elif record["type"] == "environment":
            environment.update(record["environment"])
        elif record["type"] == "output_raw":  # the console log, as captured
            console.append(record["output_raw"]["line"])
        elif record["type"] == "history":
            history.append(record["history"]["item"])
        elif record["type"] == "metric":  # define_metric: name (or glob) -> its definition
            definition = record["metric"]
            metrics[definition.get("name") or definition.get("glob_name")] = definition
    keys = set().union(*history) if history else set()
    return {"run": run, "history": history, "keys": keys, "state": summary["state"], "summary": summary["summary"],
            "exit_code": summary["exit_code"], "config": summary["config"], "metrics": metrics,
            "environment": environment, "console": "".join(console)}


def charted(run: dict) -> set[str]:
    """The history keys W&B draws a chart of by itself: not hidden, not its own (`_step`), not the x-axis."""
    hidden = {name for name, d in run["metrics"].items() if d.get("options", {}).get("hidden")}
    keys = {k.split(".", 1)[0] for k in run["keys"]}  # an image or histogram comes as `name._type`, `name.path`...
    return {k for k in keys if not k.startswith("_") and k != "train/step" and k not in hidden}


def offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """No credentials and no W&B settings from the machine."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    tracking._said.clear()
    yield
    tracking.finish_open_runs(failed=True)


@pytest.fixture
def make_cfg(tiny_config):
    """make_cfg(mode, **logger): the tiny preset as a logged run of a non-causal d_k 16 model, a new copy each call."""
    tiny_config.model.d_k = 16
    tiny_config.model.causal = False
    tiny_config.logger.project = "andrea-test"
    tiny_config.logger.tags = ["t1"]

    def make(mode="offline", **logger):
        cfg = copy.deepcopy(tiny_config)
        cfg.logger.mode = mode
        cfg.logger.merge_with(logger)
        return cfg

    return make


def test_login_is_read_from_env_and_netrc_without_network(clean_env, tmp_path, monkeypatch):
    assert not logged_in()
    assert resolve_mode("auto")[0] == "offline"
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password " + "a" * 40 + "\n")
    netrc_file.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc_file))
    assert logged_in()
    assert resolve_mode("auto") == ("online", "logged in to W&B")
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert not logged_in()  # a key for another host does not count
    monkeypatch.setenv("WANDB_API_KEY", "b" * 40)
    assert logged_in()
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode("auto")[0] == "disabled"  # the user's WANDB_MODE wins over the login
    assert resolve_mode("offline")[0] == "offline"  # an explicit logger.mode wins over both


def test_offline_run_has_conventions_history_images_and_summary(make_cfg, clean_env, tmp_path):
    run_dir = tmp_path / "sweepname" / "run7"
    run_dir.mkdir(parents=True)
    tracker = Tracker(run_dir, make_cfg(), enabled=True)
    assert (run_dir / "wandb").is_dir()
    for step in range(3):
        tracker.log({"train/loss": 3.0 - step, "grad/norm": torch.tensor(0.5)}, step)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    png = run_dir / "map.png"
    plt.imsave(png, torch.eye(4).numpy())
    tracker.log_images({"attn/maps/L0": png}, step=2)
    scores = torch.tensor([[1.0, float("-inf")], [2.0, 3.0]])  # the masked entry must not reach the histogram
    tracker.log_histograms({"attn/scores_hist": scores}, step=2)
    tracker.log({"eval/loss_as_trained": 1.25}, step=2)
    tracker.finish({"run/status": "finished", "eval/loss_as_trained": 1.25, "run/steps": 3})

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1, 2, 2] and lines[2]["train/loss"] == 1.0
    assert json.loads((run_dir / "summary.json").read_text())["config"]["model"]["d_k"] == 16

    (wdir,) = offline_runs(run_dir)
    run = read_run(wdir)
    assert run["state"] == "finished" and run["exit_code"] == 0
    # outside Hydra no setting was given: the name is the cell's axes in the config's words, and the seed
    assert run["run"]["display_name"] == "d_k=16 scale=sqrt causal=false seed=0"
    assert re.fullmatch(r"d_k=16 scale=sqrt causal=false #[0-9a-f]{8}", run["run"]["run_group"])
    assert run["run"]["job_type"] == "train"
    assert run["run"]["tags"] == ["d_k=16", "scale=sqrt", "causal=false", "seed=0", "t1"]
    assert run["run"]["run_id"] == (run_dir / "wandb_run_id").read_text().strip()
    assert {"train/loss", "grad/norm", "train/step"} <= run["keys"]
    assert [h["train/step"] for h in run["history"] if "train/loss" in h] == [0, 1, 2]
    image = next(h for h in run["history"] if "attn/maps/L0._type" in h)  # media rows are flattened by W&B
    assert image["attn/maps/L0._type"] == "image-file" and image["train/step"] == 2
    hist = next(h for h in run["history"] if "attn/scores_hist._type" in h)
    assert hist["attn/scores_hist._type"] == "histogram"
    assert sum(hist["attn/scores_hist.values"]) == 3  # 3 finite scores of 4
    assert min(hist["attn/scores_hist.bins"]) == 1.0 and max(hist["attn/scores_hist.bins"]) == 3.0
    assert run["summary"]["run/status"] == "finished"
    assert run["summary"]["eval/loss_as_trained"] == {"min": 1.25, "last": 1.25}
    assert run["config"]["model"]["causal"] is False


def test_failed_run_is_marked_failed_and_an_unclosed_run_does_not_leak(make_cfg, clean_env, tmp_path):
    first, second, third = (tmp_path / name for name in ("a", "b", "c"))
    for d in (first, second, third):
        d.mkdir()
    Tracker(first, make_cfg(), enabled=True).log({"train/loss": 1.0}, 0)  # never finished: a job that crashed
    failing = Tracker(second, make_cfg(), enabled=True)  # opening the next run closes the leaked one as failed
    failing.log({"train/loss": 2.0}, 0)
    failing.finish({"run/status": "failed", "run/error": "boom"}, failed=True)
    diverged = Tracker(third, make_cfg(), enabled=True)
    diverged.finish({"run/status": "diverged"})
    assert tracking._open_runs == []

    a, b, c = (read_run(offline_runs(d)[0]) for d in (first, second, third))
    assert a["state"] == "failed" and a["summary"]["run/status"] == "failed"
    assert b["state"] == "failed" and b["exit_code"] == 1 and b["summary"]["run/error"] == "boom"
    assert b["keys"] >= {"train/loss"} and [h["train/loss"] for h in b["history"]] == [2.0]  # nothing of run a
    assert c["state"] == "finished" and c["summary"]["run/status"] == "diverged"  # a result, not a failure
    assert "diverged" in read_run(offline_runs(third)[0])["run"]["tags"]


def test_resume_reuses_the_stored_run_id(make_cfg, clean_env, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tracker = Tracker(run_dir, make_cfg(), enabled=True)
    tracker.log({"train/loss": 1.0}, 0)
    tracker.finish({"run/status": "finished"})
    first_id = (run_dir / "wandb_run_id").read_text().strip()
    again = Tracker(run_dir, make_cfg(), enabled=True, resume_step=1)
    assert again.wandb_run.id == first_id
    again.finish({"run/status": "finished"})
    fresh = Tracker(run_dir, make_cfg(), enabled=True)  # not a resume: a new W&B run
    assert fresh.wandb_run.id != first_id
    fresh.finish({"run/status": "finished"})


def test_online_without_login_falls_back_to_offline(make_cfg, clean_env, tmp_path, capsys):
    tracker = Tracker(tmp_path, make_cfg(mode="online"), enabled=True)
    assert tracker.wandb_run is not None and tracker.wandb_run.settings.mode == "offline"
    tracker.finish({"run/status": "finished"})
    err = capsys.readouterr().err
    assert "W&B online start failed" in err and f"wandb sync {tmp_path}/wandb/offline-run-*" in err
    assert read_run(offline_runs(tmp_path)[0])["state"] == "finished"


def test_disabled_and_non_main_ranks_write_no_wandb(make_cfg, clean_env, tmp_path):
    (tmp_path / "off").mkdir()
    (tmp_path / "rank1").mkdir()
    off = Tracker(tmp_path / "off", make_cfg(mode="disabled"), enabled=True)
    off.log({"train/loss": 1.0}, 0)
    off.finish({"run/status": "finished"})
    assert (tmp_path / "off" / "metrics.jsonl").read_text().count("\n") == 1
    assert not (tmp_path / "off" / "wandb").exists()
    rank1 = Tracker(tmp_path / "rank1", make_cfg(), enabled=False)
    rank1.log({"train/loss": 1.0}, 0)
    rank1.finish({"run/status": "finished"})
    assert list((tmp_path / "rank1").iterdir()) == []


def short_run(make_cfg, **train):
    """A 3-step run at lr 0.001 with TRAIN's changes."""
    cfg = make_cfg()
    cfg.train.merge_with({"lr": 0.001, "max_steps": 3, **train})
    return cfg


def test_seeds_of_one_cell_share_a_group_and_two_cells_never_do(make_cfg, clean_env, tmp_path):
    groups = {}
    for name, cfg in (("seed0", short_run(make_cfg)), ("seed1", short_run(make_cfg)),
                      ("lr", short_run(make_cfg, lr=0.01))):
        if name == "seed1":
            cfg.seed = 1
        (tmp_path / name).mkdir()
        Tracker(tmp_path / name, cfg, enabled=True).finish({"run/status": "finished"})
        groups[name] = read_run(offline_runs(tmp_path / name)[0])["run"]["run_group"]
    assert groups["seed0"] == groups["seed1"]  # replicates: W&B averages them
    assert groups["lr"] != groups["seed0"]  # another learning rate is another cell, named or not
    probe_only = tmp_path / "probe"
    probe_only.mkdir()
    Tracker(probe_only, short_run(make_cfg, max_steps=0), enabled=True).finish({"run/status": "finished"})
    assert read_run(offline_runs(probe_only)[0])["run"]["job_type"] == "probe"


def test_layers_and_constants_leave_the_charts_and_the_best_loss_stays_in_the_summary(make_cfg, clean_env, tmp_path):
    tracker = Tracker(tmp_path, make_cfg(), enabled=True)
    for step, loss in ((0, 3.0), (5, 2.0), (10, 2.5)):
        tracker.log({"train/loss": loss, "attn/entropy": 1.0, "attn/L0/entropy": 0.9, "attn/L1/entropy": 1.1,
                     "attn_step/L1/H2/max_prob": 0.5, "grad/L0/q": 0.1}, step)
        tracker.log({"eval/loss_as_trained": loss, "eval/loss_generation": loss + 1, "eval/floor": 0.93,
                     "eval/floor_se": 0.01}, step)
    tracker.finish({"run/status": "finished", "eval/loss_as_trained": 2.5, "eval/floor": 0.93,
                    "best/eval/loss_as_trained": 2.0, "best/eval/step": 5})
    run = read_run(offline_runs(tmp_path)[0])
    per_layer = {"attn/L0/entropy", "attn/L1/entropy", "attn_step/L1/H2/max_prob", "grad/L0/q"}
    assert per_layer <= run["keys"]  # still logged
    assert charted(run) == {"train/loss", "attn/entropy", "eval/loss_as_trained", "eval/loss_generation"}
    for key in per_layer | {"eval/floor", "eval/floor_se"}:
        assert run["metrics"][key]["options"]["hidden"] is True
        assert run["metrics"][key]["step_metric"] == "train/step"
    assert run["summary"]["eval/loss_as_trained"] == {"min": 2.0, "last": 2.5}
    assert run["summary"]["eval/loss_generation"] == {"min": 3.0, "last": 3.5}
    assert run["summary"]["best/eval/step"] == 5 and run["summary"]["eval/floor"] == 0.93  # constants: summary only
