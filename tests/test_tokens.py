"""data=tokens: uint16 train.bin / val.bin read through a memory map, batches a pure function of (seed, step),
held-out windows independent of the seed, and one-line errors for a bad directory or token id."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compose_config, data_error_line, data_settings

import andrea_exp.config.data_checks as checks_module
from andrea_exp.config.data_checks import BINARY_SAMPLE, check_data
from andrea_exp.config.validation import ConfigError
from andrea_exp.data.sources import TokenWindows, build_dataset

T = 8


def write_tokens(path: Path, ids) -> None:
    np.asarray(ids, dtype="<u2").tofile(path)


def corpus(tmp_path, n_train: int = 1000, n_val: int = 200, val=None) -> Path:
    """train.bin holds 0, 1, 2, ... so a window names its offset; val.bin counts down from 30000."""
    root = tmp_path / "corpus"
    root.mkdir()
    write_tokens(root / "train.bin", np.arange(n_train))
    write_tokens(root / "val.bin", 30000 - np.arange(n_val) if val is None else val)
    return root


def tokens_cfg(path, **changes):
    return data_settings("tokens", **{"seq_len": T, "vocab_size": 50257, "path": str(path), "eval_sequences": 5,
                                      **changes})


def test_conf_file_composes_and_builds(tmp_path):
    root = corpus(tmp_path)
    cfg = compose_config("data=tokens", f"data.path={root}", "data.seq_len=8")
    # the data schema is shared by every source; the Markov chain's fields stay null for data=tokens, and
    # vocab_size is null: meta.json's, else (as here, a directory without one) GPT-2's 50257
    assert {k for k, v in cfg.data.items() if v is not None} == {"name", "seq_len", "path", "eval_sequences"}
    assert cfg.data.name == "tokens" and cfg.data.vocab_size is None and cfg.data.train_sequences is None
    data = build_dataset(cfg.data, cfg.data.seq_len, cfg.seed)
    assert data.vocab_size == 50257
    assert math.isnan(data.floor) and math.isnan(data.floor_standard_error)
    assert data.decode([1, 2]) is None  # GPT-2 token ids, and no tokenizer to read them with
    unset = compose_config("data=tokens")
    with pytest.raises(ConfigError, match=r"^data\.path must name a directory holding train\.bin and val\.bin "
                                          r"when data=tokens; got nothing$"):
        check_data(unset.data, 8)


def test_files_are_read_through_a_memory_map_little_endian(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "train.bin").write_bytes(bytes([0x01, 0x02, 0x03, 0x00]) * 20)  # tokens 0x0201 = 513, 3, 513, 3 ...
    (root / "val.bin").write_bytes(bytes([0x01, 0x02, 0x03, 0x00]) * 20)
    data = build_dataset(tokens_cfg(root), seq_len=T, seed=0)
    assert isinstance(data.train.tokens, TokenWindows)
    assert isinstance(data.train.tokens.ids, np.memmap)  # nothing read until a batch asks
    assert data.eval.tokens[0, :4].tolist() == [513, 3, 513, 3]
    x, _ = data.batch(0, 2, seed=0)
    assert set(x.flatten().tolist()) == {513, 3}


def test_held_out_windows_are_evenly_spaced_and_independent_of_the_seed(tmp_path):
    root = corpus(tmp_path, n_val=200)
    a = build_dataset(tokens_cfg(root), seq_len=T, seed=0)
    b = build_dataset(tokens_cfg(root), seq_len=T, seed=7)
    assert torch.equal(a.eval.tokens, b.eval.tokens)
    assert a.eval.tokens.shape == (5, T + 1) and a.eval.tokens.dtype == torch.int64
    # the last whole window starts at 200 - 9 = 191; five windows at 0, 191/4, ... floored: 0, 47, 95, 143, 191
    val = 30000 - np.arange(200)
    expected = np.stack([val[s : s + T + 1] for s in (0, 47, 95, 143, 191)])
    assert a.eval.tokens.tolist() == expected.tolist()
    # one window: the file's start
    one = build_dataset(tokens_cfg(root, eval_sequences=1), seq_len=T, seed=0)
    assert one.eval.tokens.tolist() == [val[: T + 1].tolist()]


def offsets(x: torch.Tensor) -> list[int]:
    """train.bin counts 0, 1, 2, ...: a row's first input is its window's offset."""
    return x[:, 0].tolist()


def test_training_windows_and_batches(tmp_path):
    root = corpus(tmp_path, n_train=1000)
    data = build_dataset(tokens_cfg(root), seq_len=T, seed=3)
    # (1000 - 1) // 8 = 124 windows of 9 tokens at offsets 0, 8, 16, ... (neighbours share one token)
    assert len(data.train.tokens) == 124
    x, y = data.batch(0, 4, seed=3)
    assert x.shape == y.shape == (4, T) and x.dtype == torch.int64
    for row_x, row_y in zip(x.tolist(), y.tolist()):
        start = row_x[0]
        assert start % T == 0 and start <= 123 * T
        assert row_x == list(range(start, start + T)) and row_y == list(range(start + 1, start + T + 1))
    # within an epoch (124 // 4 = 31 steps) every window is drawn once
    epoch = sum((offsets(data.batch(s, 4, seed=3)[0]) for s in range(31)), [])
    assert sorted(epoch) == [w * T for w in range(124)]
    assert offsets(data.batch(31, 4, seed=3)[0]) != offsets(data.batch(0, 4, seed=3)[0])  # a new order


def test_batches_are_a_pure_function_of_seed_and_step(tmp_path):
    root = corpus(tmp_path, n_train=2000)
    data = build_dataset(tokens_cfg(root), seq_len=T, seed=0)
    in_order = [offsets(data.batch(s, 8, seed=5)[0]) for s in range(40)]  # crosses an epoch (31 steps)
    fresh = build_dataset(tokens_cfg(root), seq_len=T, seed=0)  # a resumed run
    for s in (39, 0, 17, 31, 30):
        assert offsets(fresh.batch(s, 8, seed=5)[0]) == in_order[s]
    assert offsets(data.batch(0, 8, seed=6)[0]) != in_order[0]  # the seed matters


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_draw_disjoint_slices_of_the_global_batch(tmp_path, world_size):
    data = build_dataset(tokens_cfg(corpus(tmp_path, n_train=2000)), seq_len=T, seed=0)
    for step in (0, 1, 13, 40):
        parts = [offsets(data.batch(step, 16 // world_size, 0, rank, world_size)[0]) for rank in range(world_size)]
        flat = sum(parts, [])
        assert len(set(flat)) == 16
        assert flat == offsets(data.batch(step, 16, seed=0)[0])


def test_train_sequences_keeps_that_many_windows_spread_over_the_file(tmp_path):
    data = build_dataset(tokens_cfg(corpus(tmp_path, n_train=1000), train_sequences=4), seq_len=T, seed=0)
    assert len(data.train.tokens) == 4
    # 124 windows, 4 kept: windows 0, 31, 62, 93 -> offsets 0, 248, 496, 744
    assert sorted(offsets(data.batch(0, 4, seed=0)[0])) == [0, 248, 496, 744]
    more = build_dataset(tokens_cfg(tmp_path / "corpus", train_sequences=10**9), seq_len=T, seed=0)
    assert len(more.train.tokens) == 124  # at most every window


def test_batches_land_on_the_dataset_device(tmp_path):
    data = build_dataset(tokens_cfg(corpus(tmp_path)), seq_len=T, seed=0).to("cpu")
    x, y = data.batch(0, 4, seed=0)
    assert x.device == y.device == torch.device("cpu")
    assert data.eval.tokens.device == torch.device("cpu")


# ------------------------------------------------------------------ token ids beyond the vocabulary


def test_held_out_id_beyond_the_vocabulary_is_one_line(tmp_path):
    val = np.full(200, 7)
    val[50] = 60000  # inside the held-out window at offset 47
    root = corpus(tmp_path, val=val)
    for call in (lambda: check_data(tokens_cfg(root), T), lambda: build_dataset(tokens_cfg(root), T, seed=0)):
        with pytest.raises(ConfigError) as caught:
            call()
        assert str(caught.value) == (f"data.vocab_size=50257 is too small for {str(root / 'val.bin')!r}: its "
                                     "held-out windows hold token id 60000; set data.vocab_size to at least 60001")
    build_dataset(tokens_cfg(root, vocab_size=60001), T, seed=0)  # the largest id fits exactly
    with pytest.raises(ConfigError, match="token id 60000"):
        build_dataset(tokens_cfg(root, vocab_size=60000), T, seed=0)


def test_training_id_beyond_the_vocabulary_is_one_line(tmp_path):
    # id 99 only after the first 1 MiB of train.bin, which validation reads; held-out ids 0
    root = corpus(tmp_path, n_train=100, val=np.zeros(200))
    half = BINARY_SAMPLE // 2
    write_tokens(root / "train.bin", np.concatenate([np.zeros(half), np.full(half, 99)]))
    data = build_dataset(tokens_cfg(root, vocab_size=50, train_sequences=4), T, seed=0)  # validation passes
    with pytest.raises(ConfigError, match=re.escape(f"{str(root / 'train.bin')!r}: its training windows hold token")):
        for step in range(20):
            data.batch(step, 4, seed=0)


# ------------------------------------------------------------------ a bad data.path: one line each


def config_error(cfg, seq_len: int = T) -> str:
    return data_error_line(cfg, seq_len)


def test_directory_that_does_not_exist(tmp_path):
    message = config_error(tokens_cfg(tmp_path / "nope"))
    assert message == (f"data.path: {str(tmp_path / 'nope')!r} does not exist; data=tokens needs a directory "
                       "holding train.bin and val.bin")


def test_a_file_where_the_directory_is_needed(tmp_path):
    root = corpus(tmp_path)
    message = config_error(tokens_cfg(root / "train.bin"))
    assert message == (f"data.path: {str(root / 'train.bin')!r} is a file; data=tokens needs a directory holding "
                       "train.bin and val.bin")


@pytest.mark.parametrize("name", ["train.bin", "val.bin"])
def test_missing_token_file(tmp_path, name):
    root = corpus(tmp_path)
    (root / name).unlink()
    assert config_error(tokens_cfg(root)) == (f"data.path: {str(root / name)!r} is missing; data=tokens needs "
                                              "train.bin and val.bin in data.path")


def test_token_file_that_is_a_directory(tmp_path):
    root = corpus(tmp_path)
    (root / "val.bin").unlink()
    (root / "val.bin").mkdir()
    assert config_error(tokens_cfg(root)) == (f"data.path: {str(root / 'val.bin')!r} is a directory; data=tokens "
                                              "needs a flat uint16 token file")


def test_unreadable_token_file(tmp_path, monkeypatch):
    root = corpus(tmp_path)

    def denied(file, *args, **kwargs):
        if Path(file).name == "train.bin":
            raise PermissionError(13, "Permission denied")
        return open(file, *args, **kwargs)

    monkeypatch.setattr(checks_module, "open", denied, raising=False)
    expected = f"data.path: {str(root / 'train.bin')!r} cannot be read (permission denied)"
    assert config_error(tokens_cfg(root)) == expected


def test_token_file_with_an_odd_number_of_bytes(tmp_path):
    root = corpus(tmp_path)
    (root / "train.bin").write_bytes(b"\x01" * 101)
    assert config_error(tokens_cfg(root)) == (f"data.path: {str(root / 'train.bin')!r} has an odd number of bytes "
                                              "(101); a token file is flat uint16, 2 bytes a token")


@pytest.mark.parametrize("name", ["train.bin", "val.bin"])
def test_token_file_too_small_for_seq_len(tmp_path, name):
    root = corpus(tmp_path)
    write_tokens(root / name, np.arange(T))  # one token short of a window
    assert config_error(tokens_cfg(root)) == (f"data.path: {str(root / name)!r} holds {T} tokens; "
                                              f"data.seq_len={T} needs at least {T + 1}")
    write_tokens(root / name, np.arange(T + 1))  # exactly one window
    check_data(tokens_cfg(root), T)
    assert build_dataset(tokens_cfg(root), T, seed=0).batch(0, 1, seed=0)[0].shape == (1, T)


@pytest.mark.parametrize("vocab", [0, 1, 65537, 1.5, True])  # None: meta.json's, else 50257 (tests/test_prepare.py)
def test_vocab_size_must_fit_uint16(tmp_path, vocab):
    message = config_error(tokens_cfg(corpus(tmp_path), vocab_size=vocab))
    assert message == f"data.vocab_size must be an integer from 2 to 65536 (uint16 token ids); got {vocab!r}"
