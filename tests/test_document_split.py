"""python -m andrea_exp.prepare --split documents: val.bin holds whole documents, a seeded choice reaching
--val-fraction of the tokens; train.bin the others; the choice is deterministic and meta.json records it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from andrea_exp.data.prepare import held_out_documents, main

T = 4  # --seq-len: val.bin needs 4 windows of 5 tokens


def held(lengths, fraction, seed) -> list[int]:
    return np.flatnonzero(held_out_documents(lengths, fraction, seed)).tolist()


def test_the_seeded_choice_on_hand_computed_cases():
    lengths = [10, 20, 30, 40]  # N = 100
    # default_rng(0).permutation(4) = [2, 0, 1, 3]: document 2's 30 tokens reach ceil(100 * 0.25) = 25
    assert held(lengths, 0.25, 0) == [2]
    # the same order, 50 wanted: 30, then 40, then 60 >= 50
    assert held(lengths, 0.5, 0) == [0, 1, 2]
    # default_rng(1).permutation(4) = [0, 1, 2, 3]: 10 + 20 reaches 30 exactly, so no third document
    assert held(lengths, 0.3, 1) == [0, 1]
    # default_rng(2).permutation(4) = [3, 2, 0, 1]
    assert held(lengths, 0.25, 2) == [3]


def test_the_choice_is_deterministic_and_reaches_the_fraction():
    lengths = np.random.default_rng(7).integers(1, 500, size=300)
    first = held_out_documents(lengths, 0.1, 3)
    assert np.array_equal(first, held_out_documents(lengths, 0.1, 3))
    assert not np.array_equal(first, held_out_documents(lengths, 0.1, 4))
    want = int(np.ceil(lengths.sum() * 0.1))
    assert lengths[first].sum() >= want
    order = np.random.default_rng(3).permutation(lengths.size)
    last = order[first.sum() - 1]  # the last document taken: without it the choice falls short
    assert lengths[first].sum() - lengths[last] < want


def documents(tmp_path) -> tuple[Path, list[bytes]]:
    """A folder of 12 documents of different lengths, each its own text; and its provenance record."""
    folder = tmp_path / "docs"
    texts = [(f"document {i:02d} " + "word " * (5 + 3 * i) + "\n").encode() for i in range(12)]
    for i, text in enumerate(texts):
        (folder / f"part{i % 2}").mkdir(parents=True, exist_ok=True)
        (folder / f"part{i % 2}" / f"doc{i:02d}.txt").write_bytes(text)
    (folder / "provenance.json").write_text(json.dumps({"corpus": "made here", "packages": []}))
    return folder, texts


def prepared(capsys, folder: Path, out: Path, *extra) -> dict:
    code = main([str(folder), "--out", str(out), "--seq-len", str(T), "--split", "documents",
                 "--val-fraction", "0.25", *map(str, extra)])
    assert code == 0, capsys.readouterr().err
    return json.loads((out / "meta.json").read_text())


def test_val_bin_holds_whole_documents_and_meta_json_says_which(capsys, tmp_path):
    folder, texts = documents(tmp_path)
    meta = prepared(capsys, folder, tmp_path / "out", "--split-seed", 5)
    train = (tmp_path / "out" / "train.bin").read_bytes()
    val = (tmp_path / "out" / "val.bin").read_bytes()
    # the folder's name order: part0/doc00, part0/doc02, ..., part1/doc01, ...
    names = sorted(f"{folder}/part{i % 2}/doc{i:02d}.txt" for i in range(12))
    by_name = {f"{folder}/part{i % 2}/doc{i:02d}.txt": t for i, t in enumerate(texts)}
    assert [e["path"] for e in meta["inputs"]] == names
    lengths = [len(by_name[n]) for n in names]  # bytes tokenizer: a token per byte
    chosen = held_out_documents(lengths, 0.25, 5)
    as_u16 = lambda data: np.frombuffer(data, np.uint8).astype("<u2").tobytes()
    assert val == as_u16(b"".join(by_name[n] for n, h in zip(names, chosen) if h))
    assert train == as_u16(b"".join(by_name[n] for n, h in zip(names, chosen) if not h))
    assert [e["split"] for e in meta["inputs"]] == ["val" if h else "train" for h in chosen]
    assert [e["tokens"] for e in meta["inputs"]] == lengths
    split = meta["split"]
    assert split["by"] == "document" and split["split_seed"] == 5 and split["val_fraction"] == 0.25
    assert "permutation" in split["rule"] and "ceil(N * val_fraction)" in split["rule"]
    assert split["val"] == {"documents": int(chosen.sum()), "tokens": len(val) // 2,
                            "bytes": sum(n for n, h in zip(lengths, chosen) if h)}
    assert split["train"]["documents"] == 12 - int(chosen.sum()) and split["train"]["tokens"] == len(train) // 2
    assert meta["tokens"] == {"train": len(train) // 2, "val": len(val) // 2, "total": sum(lengths)}
    assert meta["settings"]["split"] == "documents" and meta["settings"]["split_seed"] == 5
    assert meta["provenance"] == {str(folder): {"corpus": "made here", "packages": []}}


def test_the_same_seed_gives_the_same_files_another_seed_other_documents(capsys, tmp_path):
    folder, _ = documents(tmp_path)
    a = prepared(capsys, folder, tmp_path / "a", "--split-seed", 1)
    b = prepared(capsys, folder, tmp_path / "b", "--split-seed", 1)
    c = prepared(capsys, folder, tmp_path / "c", "--split-seed", 2)
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert [e["split"] for e in a["inputs"]] == [e["split"] for e in b["inputs"]]
    assert [e["split"] for e in a["inputs"]] != [e["split"] for e in c["inputs"]]


def test_bpe_tokenizes_each_document_by_itself(capsys, tmp_path):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer

    folder, texts = documents(tmp_path)
    meta = prepared(capsys, folder, tmp_path / "out", "--tokenizer", "bpe", "--vocab-size", 300)
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    train = np.fromfile(tmp_path / "out" / "train.bin", dtype="<u2")
    val = np.fromfile(tmp_path / "out" / "val.bin", dtype="<u2")
    ids = {e["path"]: tok.encode(Path(e["path"]).read_text()).ids for e in meta["inputs"]}
    assert [e["tokens"] for e in meta["inputs"]] == [len(ids[e["path"]]) for e in meta["inputs"]]
    assert val.tolist() == sum((ids[e["path"]] for e in meta["inputs"] if e["split"] == "val"), [])
    assert train.tolist() == sum((ids[e["path"]] for e in meta["inputs"] if e["split"] == "train"), [])


def test_a_stream_split_records_no_document_settings(capsys, tmp_path):
    folder, _ = documents(tmp_path)
    assert main([str(folder), "--out", str(tmp_path / "out"), "--seq-len", str(T), "--val-fraction", "0.25"]) == 0
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert "split" not in meta["settings"] and "by" not in meta["split"] and "split" not in meta["inputs"][0]


@pytest.mark.parametrize("argv, message", [
    (["--split", "files"], "error: --split must be one of stream, documents; got 'files'\n"),
    # 12 short documents: a 0.9 held-out share leaves train.bin too few tokens for --seq-len 200
    (["--val-fraction", "0.9", "--seq-len", "200"], "too small for --seq-len 200"),
])
def test_bad_split_settings_are_one_line(capsys, tmp_path, argv, message):
    folder, _ = documents(tmp_path)
    base = [str(folder), "--out", str(tmp_path / "out"), "--split", "documents"]
    assert main(base + argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out" / "meta.json").exists()
