"""Attention maps drawn by a process of their own: the same PNGs as drawn in the loop, on disk and in W&B by the
end of the run; the training process never loads matplotlib."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import probe_settings

from andrea_exp.instruments import map_worker
from andrea_exp.instruments.probe import Probe
from andrea_exp.model.decoder import Andrea, ModelConfig
from andrea_exp.runs.tracking import Tracker
from tests.test_tracking import clean_env, make_cfg, offline_runs, read_run  # noqa: F401 (clean_env, make_cfg: fixtures)

PROBE_CFG = probe_settings(every=1, batch_size=4, maps_every=1, maps_heads=2, per_head=False)


def tiny_probe(run_dir, drawer=None) -> Probe:
    torch.manual_seed(0)
    model = Andrea(ModelConfig(vocab_size=16, d_model=16, n_layer=3, n_head=2, d_k=8, d_v=8, block_size=16))
    tokens = torch.randint(0, 16, (4, 13), generator=torch.Generator().manual_seed(1))
    return Probe(model, tokens, PROBE_CFG, run_dir, drawer=drawer)


@pytest.fixture
def drawer():
    made = map_worker.BackgroundDrawer()
    yield made
    made.close()


def test_the_drawing_process_draws_the_same_pngs_as_the_loop(tmp_path, drawer):
    here = tiny_probe(tmp_path / "here").draw_maps(7)
    pending = tiny_probe(tmp_path / "there", drawer).draw_maps(7)
    assert isinstance(pending, map_worker.PendingMaps) and set(pending) == set(here) == {"attn_map/L0", "attn_map/L2"}
    drawn = pending.wait()
    for name, path in here.items():
        assert drawn[name] == tmp_path / "there" / "attention_maps" / path.name
        assert drawn[name].read_bytes() == path.read_bytes()  # byte for byte
    with np.load(tmp_path / "there" / "attention_maps" / "step0000007.npz") as arrays:
        assert sorted(arrays) == ["L0", "L2"] and arrays["L0"].shape == (2, 12, 12)
        assert arrays["L0"].dtype == np.float32
        np.testing.assert_allclose(arrays["L0"].sum(-1), 1.0, rtol=1e-5)  # rows of probabilities


def test_one_drawing_process_serves_one_run_after_another(tmp_path, drawer):
    first = tiny_probe(tmp_path / "a", drawer).draw_maps(0)
    first.wait()
    pid = drawer.proc.pid
    second = tiny_probe(tmp_path / "b", drawer).draw_maps(0)
    assert all(p.is_file() for p in second.wait().values())
    assert drawer.proc.pid == pid


def test_a_failed_drawing_is_reported_at_the_wait_and_the_process_goes_on(tmp_path, drawer):
    bad = drawer.submit(tmp_path / "missing.npz", [("L0", str(tmp_path / "x.png"), "t")])
    with pytest.raises(map_worker.DrawingFailed, match="missing.npz"):
        bad.wait()
    good = tiny_probe(tmp_path, drawer).draw_maps(1)
    assert all(p.is_file() for p in good.wait().values())


def test_the_tracker_logs_pending_maps_to_wandb_when_the_run_ends(clean_env, make_cfg, tmp_path, drawer):  # noqa: F811
    tracker = Tracker(tmp_path, make_cfg(), enabled=True)
    probe = tiny_probe(tmp_path, drawer)
    tracker.log({"train/loss": 1.0}, 0)
    tracker.log_images(probe.draw_maps(0), 0)
    tracker.log({"train/loss": 0.5}, 3)
    tracker.log_images(probe.draw_maps(3), 3)
    tracker.finish({"run/status": "finished", "run/steps": 3})
    assert sorted(p.name for p in (tmp_path / "attention_maps").glob("*.png")) == [
        "step0000000_L0.png", "step0000000_L2.png", "step0000003_L0.png", "step0000003_L2.png"]
    (wdir,) = offline_runs(tmp_path)
    images = [(h["train/step"], k) for h in read_run(wdir)["history"] for k in h if k.endswith("._type")]
    assert sorted(images) == [(0, "attn_map/L0._type"), (0, "attn_map/L2._type"),
                              (3, "attn_map/L0._type"), (3, "attn_map/L2._type")]


def test_a_failed_drawing_costs_the_maps_not_the_run(clean_env, make_cfg, tmp_path, drawer, capsys):  # noqa: F811
    tracker = Tracker(tmp_path, make_cfg(), enabled=True)
    tracker.log_images(drawer.submit(tmp_path / "missing.npz", [("L0", str(tmp_path / "x.png"), "t")]), 0)
    tracker.finish({"run/status": "finished", "run/steps": 0})
    assert "[andrea-exp] attention maps not drawn: DrawingFailed" in capsys.readouterr().err
    assert read_run(offline_runs(tmp_path)[0])["state"] == "finished"


def test_the_training_process_never_loads_matplotlib():
    code = ("import sys; import andrea_exp.training.loop, andrea_exp.instruments.probe, andrea_exp.launch.cli; "
            "print('matplotlib' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
