"""A process builds a dataset once for the cells that share it: the same data, a Dataset of each call's own, and
a rebuild when the settings, the seed or the files change."""

from __future__ import annotations

import torch
from conftest import data_settings

from andrea_exp.data import sources
from andrea_exp.data.sources import build_dataset


def test_the_same_settings_reuse_the_data_and_each_call_gets_its_own_dataset(monkeypatch):
    built = []
    real = sources._build_dataset
    monkeypatch.setattr(sources, "_build_dataset", lambda *a: built.append(a) or real(*a))
    monkeypatch.setattr(sources, "_LAST_BUILT", None)
    cfg = data_settings("markov")
    a, b = build_dataset(cfg, 16, 0), build_dataset(cfg, 16, 0)
    assert len(built) == 1 and a is not b and a.train is not b.train
    assert torch.equal(a.train.tokens, b.train.tokens) and a.references == b.references and a.floor == b.floor
    a.train.tokens = a.train.tokens[:1]  # what Dataset.to does: rebinds a Split's tensors
    assert len(build_dataset(cfg, 16, 0).train.tokens) == len(b.train.tokens)  # the kept one is as built
    build_dataset(cfg, 16, 1)
    build_dataset(cfg, 8, 1)
    assert len(built) == 3  # another seed, another length: built again


def test_a_kept_dataset_is_the_one_a_fresh_process_builds(monkeypatch):
    cfg = data_settings("markov")
    monkeypatch.setattr(sources, "_LAST_BUILT", None)
    kept = build_dataset(cfg, 16, 3)
    build_dataset(cfg, 16, 3).batch(0, 4, 3)  # a cell that trained on it
    again = build_dataset(cfg, 16, 3)
    fresh = sources._build_dataset(cfg, 16, 3)
    for x, y in ((kept, fresh), (again, fresh)):
        assert torch.equal(x.train.tokens, y.train.tokens) and torch.equal(x.eval.tokens, y.eval.tokens)
        assert [t.tolist() for t in x.batch(5, 4, 3)] == [t.tolist() for t in y.batch(5, 4, 3)]


def test_changed_files_are_read_again(tmp_path, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text("abcdefgh" * 400)
    cfg = data_settings("text", path=str(corpus), train_sequences=8, eval_sequences=4)
    monkeypatch.setattr(sources, "_LAST_BUILT", None)
    first = build_dataset(cfg, 16, 0)
    corpus.write_text("zyxwvuts" * 500)
    second = build_dataset(cfg, 16, 0)
    assert not torch.equal(first.train.tokens, second.train.tokens)
