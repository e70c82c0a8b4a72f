"""data=tokens refuses, while the settings are validated, a token file whose bytes cannot be the uint16 ids it
should hold (32- or 64-bit integers, 32-bit floats) and ids beyond the vocabulary at the start of train.bin."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import data_settings

from andrea_exp.config.data_checks import check_data, wide_token_cause
from andrea_exp.config.errors import ConfigError

T = 8
IDS = np.random.default_rng(0).integers(0, 256, 4000)  # byte-like ids


def token_dir(tmp_path, dtype: str, train=IDS, val=IDS[:800]):
    root = tmp_path / "tokens"
    root.mkdir()
    np.asarray(train).astype(dtype).tofile(root / "train.bin")
    np.asarray(val).astype(dtype).tofile(root / "val.bin")
    return root


def cfg(root, vocab_size=None):
    return data_settings("tokens", seq_len=T, vocab_size=vocab_size, path=str(root), eval_sequences=5)


@pytest.mark.parametrize("dtype, cause", [
    ("<i4", "looks like 32- or 64-bit integers, not uint16 ids: every second uint16 of its first bytes is 0"),
    ("<i8", "looks like 32- or 64-bit integers, not uint16 ids: every second uint16 of its first bytes is 0"),
    ("<f4", "looks like 32-bit floats, not uint16 ids: its first bytes read as float32 are all whole numbers"),
])
def test_wide_numbers_without_meta_json_are_refused_at_validation(tmp_path, dtype, cause):
    root = token_dir(tmp_path, dtype)  # no meta.json: data.vocab_size falls back to 50257, which every id fits
    with pytest.raises(ConfigError) as err:
        check_data(cfg(root), T)
    assert str(err.value) == (f"data.path: {str(root / 'train.bin')!r} {cause}; data=tokens reads flat "
                              "little-endian uint16 ids (python -m andrea_exp.prepare writes them)")


def test_uint16_ids_are_not_taken_for_wide_numbers():
    rng = np.random.default_rng(1)
    for ids in (IDS, rng.integers(0, 50257, 4000), np.arange(4000), np.full(4000, 5), np.zeros(4000)):
        assert wide_token_cause(np.asarray(ids, dtype="<u2").tobytes()) is None
    assert wide_token_cause(np.arange(8, dtype="<i4").tobytes()) is None  # too few bytes to judge


def test_an_id_beyond_the_vocabulary_at_the_start_of_train_bin_is_refused_at_validation(tmp_path):
    train = IDS.copy()
    train[3] = 300  # val.bin's held-out windows all fit vocab_size 256
    root = token_dir(tmp_path, "<u2", train=train)
    with pytest.raises(ConfigError) as err:
        check_data(cfg(root, vocab_size=256), T)
    assert str(err.value) == (f"data.vocab_size=256 is too small for {str(root / 'train.bin')!r}: its first 4000 "
                              "tokens hold token id 300; set data.vocab_size to at least 301")
    check_data(cfg(root, vocab_size=301), T)


def test_a_vocabulary_of_one_token_is_refused(tmp_path):
    root = token_dir(tmp_path, "<u2", train=np.zeros(100), val=np.zeros(100))
    with pytest.raises(ConfigError, match="data.vocab_size must be an integer from 2 to 65536"):
        check_data(cfg(root, vocab_size=1), T)
