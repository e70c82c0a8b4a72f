"""Every bad setting is refused before any work with one line that names it and what is allowed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from andrea_exp.config.validation import command_line_error
from andrea_exp.launch.cli import CONF_DIR

# (overrides, the setting the message must name, a fragment saying what is allowed)
BAD = [
    (["model.d_model=0"], "model.d_model", "integer >= 1"),
    (["model.n_layer=-1"], "model.n_layer", "integer >= 1"),
    (["model.n_head=0"], "model.n_head", "integer >= 1"),
    (["model.d_k=0"], "model.d_k", "integer >= 1"),
    (["model.d_v=-4"], "model.d_v", "integer >= 1"),
    (["model.block_size=0"], "model.block_size", "integer >= 1"),
    (["data.seq_len=0"], "data.seq_len", "integer >= 1"),
    (["data.train_sequences=0"], "data.train_sequences", "integer >= 1"),
    (["model.d_k=abc"], "model.d_k", "integer >= 1"),
    (["train.max_steps=1.5"], "train.max_steps", "integer >= 0"),
    (["model.scale=maybe"], "model.scale", "sqrt, none, inv, true, false"),
    (["model.qk_init=xavier"], "model.qk_init", "unit, gpt2, torch"),
    (["model.attn_impl=flash"], "model.attn_impl", "auto, explicit, fused, bilinear"),
    (["model.causal=maybe"], "model.causal", "True, False"),
    (["logger.mode=sometimes"], "logger.mode", "auto, online, offline, disabled"),
    (["train.precision=fp8"], "train.precision", "auto, fp32, bf16, fp16"),
    (["train.device=tpu"], "train.device", "auto, cpu, cuda"),
    (["data=imagenet"], "data", "markov, text"),
    (["model=gpt5"], "model", "andrea_120m, andrea_small, andrea_tiny"),
    (["experiment=nope"], "experiment", "claims_grid"),
    (["train.lr=0"], "train.lr", "finite number > 0"),
    (["train.lr=-0.1"], "train.lr", "finite number > 0"),
    (["train.lr=nan"], "train.lr", "finite number > 0"),
    (["train.lr=inf"], "train.lr", "finite number > 0"),
    (["train.lr=fast"], "train.lr", "finite number > 0"),
    (["train.max_steps=-1"], "train.max_steps", "integer >= 0"),
    (["train.batch_size=0"], "train.batch_size", "integer >= 1"),
    (["train.batch_size=-8"], "train.batch_size", "integer >= 1"),
    (["train.grad_clip=-1"], "train.grad_clip", ">= 0"),
    (["train.diverge_factor=1"], "train.diverge_factor", "> 1"),
    (["train.beta2=1"], "train.beta2", "<= 0.999999"),
    (["probe.every=-1"], "probe.every", "integer >= 0"),
    (["train.progress=sometimes"], "train.progress", "auto, True, False"),
    (["data.seq_len=128"], "data.seq_len", "<= model.block_size (64)"),
    (["data.train_sequences=4", "train.batch_size=8"], "data.train_sequences", ">= train.batch_size"),
    (["model.vocab_size=8"], "model.vocab_size", ">= the data's 32 tokens"),
    (["model.attn_impl=bilinear", "model.qk_layernorm=true"], "model.attn_impl=bilinear", "qk_layernorm=false"),
    (["model.mask_fill=-5"], "model.mask_fill", "-inf or a finite number <= -1e4"),
    (["model.mask_fill=0"], "model.mask_fill", "-inf or a finite number <= -1e4"),
    (["model.mask_fill=inf"], "model.mask_fill", "-inf or a finite number <= -1e4"),
    (["model.mask_fill=zero"], "model.mask_fill", "-inf or a finite number <= -1e4"),
    (["data=text"], "data.path", "must name a text file"),
    (["data=text", "data.path=/no/such/file.txt"], "data.path", "does not exist; data=text needs a text file"),
    (["model.dk=64"], "model.dk", "did you mean model.d_k?"),
    (["train.warmup=5"], "train.warmup", "did you mean train.warmup_steps?"),
    (["train.learning_rate=0.1"], "train.learning_rate", "train has: max_steps, batch_size, lr,"),
    (["seeed=3"], "seeed", "did you mean seed?"),
    (["hydra.run.dirr=x"], "hydra.run.dirr", "did you mean hydra.run.dir?"),
    (["model.d_k=[1,2"], "model.d_k=[1,2", "override_grammar"),
    (["+model.d_k=3"], "model.d_k", "remove + prefix"),
    (["-m", "model.dk=16,32"], "model.dk", "did you mean model.d_k?"),  # an unknown key in a sweep
    (["-m", "data=markov,imagenet"], "data", "markov, text"),  # every value of a sweep is composed
    # the schema refuses keys nobody reads, added with + too
    (["+train.anything=1"], "train.anything", "train has: max_steps"),
    (["+model.extra_note=1"], "model.extra_note", "model has: name, d_model"),
    (["+seeed=1"], "seeed", "did you mean seed?"),
    (["data.path=/tmp/corpus.txt"], "data.path", "read only by data=text or data=tokens"),
    (["data=text", "data.order=3"], "data.order", "read only by data=markov"),
    (["train.warmup_steps=100", "train.max_steps=50"], "train.warmup_steps (100)", "<= train.max_steps (50)"),
    (["data=tokens"], "data.path", "must name a directory holding train.bin and val.bin when data=tokens; got nothing"),
    (["data=tokens", "data.path=/no/such/dir"], "data.path", "does not exist; data=tokens needs a directory"),
    (["probe.dead_jac=-1"], "probe.dead_jac", "finite number > 0"),
    # a zero threshold counts no row as dead: refused with the other settings, before the data or model are built
    (["probe.dead_jac=0"], "probe.dead_jac", "finite number > 0; got 0"),
    (["probe.dead_grad=0"], "probe.dead_grad", "finite number > 0; got 0"),
    (["train.keep_checkpoints=-1"], "train.keep_checkpoints", "integer >= 0"),
    # a sweep is checked cell by cell before its first cell runs, naming the bad value
    (["-m", "model.d_k=16,0"], "model.d_k", "got 0 (sweep value model.d_k=0)"),
    (["-m", "model.d_k=16,32", "train.lr=1e-3,nan"], "train.lr", "(sweep value train.lr=nan)"),
    (["-m", "experiment=claims_grid", "model.scale=true,bad"], "model.scale", "sweep value model.scale=bad"),
    (["-m", "experiment=lr_sensitivity", "train.max_steps=50"], "train.warmup_steps", "<= train.max_steps (50)"),
]


def one_line(message: str | None) -> str:
    assert message is not None, "accepted"
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize(("overrides", "setting", "allowed"), BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_setting_is_one_line_naming_it(overrides, setting, allowed):
    message = one_line(command_line_error(overrides, CONF_DIR))
    assert setting in message and allowed in message, message


def test_empty_or_short_text_file_is_refused(tmp_path):
    empty, short, folder = tmp_path / "empty.txt", tmp_path / "short.txt", tmp_path / "folder"
    empty.write_text("")
    short.write_text("too short for a window")
    folder.mkdir()
    for path, allowed in ((empty, "has 0 bytes; data.seq_len=64 needs at least 132"),
                          (short, "has 22 bytes; data.seq_len=64 needs at least 132"),
                          (folder, "is a directory; data=text needs a text file")):
        message = one_line(command_line_error(["data=text", f"data.path={path}"], CONF_DIR))
        assert message == f"data.path: {str(path)!r} {allowed}", message


def test_a_cuda_device_on_a_machine_without_one_is_refused():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    message = one_line(command_line_error(["train.device=cuda"], CONF_DIR))
    assert message.startswith("train.device must be auto, cpu or a visible GPU")


@pytest.mark.parametrize("overrides", [
    [], ["model.mask_fill=-1e9"], ["model.scale=false"], ["model.scale=inv"], ["train.grad_clip=0"],
    ["model.d_k=512", "model.d_v=8"], ["train.lr=1e4"], ["-m", "model.d_k=16,64", "model.scale=true,false"],
    ["experiment=claims_grid", "model.d_k=64", "model.scale=true", "model.causal=true", "seed=0"],
    ["hydra.run.dir=/tmp/x"], ["train.device=cpu"], ["train.max_steps=5"],
    ["-m", "experiment=scaling_at_init"], ["-m", "experiment=claims_grid"], ["-m", "experiment=extras"],
    ["train.warmup_steps=20", "train.max_steps=20"], ["probe.dead_jac=1e-2", "probe.dense_until=100"],
])
def test_good_settings_pass(overrides):
    assert command_line_error(overrides, CONF_DIR) is None


def test_good_text_file_passes(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 10)
    assert command_line_error(["data=text", f"data.path={corpus}"], CONF_DIR) is None


def test_good_token_directory_passes_and_a_short_one_is_refused(tmp_path):
    import numpy as np

    for name in ("train.bin", "val.bin"):
        np.arange(200, dtype=np.uint16).tofile(tmp_path / name)
    assert command_line_error(["data=tokens", f"data.path={tmp_path}", "data.vocab_size=300"], CONF_DIR) is None
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "val.bin")
    message = one_line(command_line_error(["data=tokens", f"data.path={tmp_path}"], CONF_DIR))
    assert message == f"data.path: {str(tmp_path / 'val.bin')!r} holds 10 tokens; data.seq_len=64 needs at least 65"


def test_a_combination_that_only_fails_together_is_left_to_its_cell():
    # each value is composed with the other axes' first values, not every combination: seq_len 128 fits
    # block_size 128 and seq_len 32 fits 64, but the cell (seq_len 128, block_size 64) is left to run and fail
    line = ["-m", "data.seq_len=32,128", "model.block_size=128,64"]
    assert command_line_error(line, CONF_DIR) is None


def test_flags_are_left_to_hydra():
    assert command_line_error(["--cfg", "job", "model.dk=1"], CONF_DIR) is None


# the whole command: one line on stderr, a non-zero exit, no traceback, no run directory
END_TO_END = [["model.dk=64"], ["data=imagenet"], ["train.lr=nan"], ["data=text", "data.path=/no/such/file.txt"],
              ["model.mask_fill=-5"], ["+train.anything=1"], ["-m", "model.d_k=16,0"]]


@pytest.mark.parametrize("overrides", END_TO_END, ids=[" ".join(o) for o in END_TO_END])
def test_command_line_fails_in_one_line_before_any_run(overrides, tmp_path):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    done = subprocess.run([sys.executable, "-m", "andrea_exp", *overrides, f"hydra.run.dir={run_dir}",
                           f"hydra.sweep.dir={run_dir}"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not run_dir.exists()  # nothing started: no metrics.jsonl, not even a run directory
