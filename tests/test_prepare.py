"""python -m andrea_exp.prepare: text files, folders and .tar.gz archives as data=tokens' train.bin / val.bin
with meta.json; bytes, BPE and GPT-2 tokenizers; one line for each bad input, nothing written; a rerun is a
no-op; and a prepared directory trains with data=tokens without data.vocab_size."""

from __future__ import annotations

import hashlib
import json
import math
import random
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import compose_config, make_archive

import andrea_exp.data.prepare as prepare_module
from andrea_exp.config.data_checks import held_out_token_windows
from andrea_exp.config.validation import ConfigError, command_line_error
from andrea_exp.data.corpora import join_texts
from andrea_exp.data.prepare import main, text_chunks
from andrea_exp.data.references import NgramCounts, held_out_references
from andrea_exp.data.sources import build_dataset, decode_bytes

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
T = 16  # --seq-len of these tests: val.bin needs 4 windows of 17 tokens
LINE = ("the quick brown fox jumps over a lazy dog while we sing of café naïve façade 日本語 ✓ and "
        "thou art more lovely, nay: temperate! winds do shake; the darling buds of May?")
WORDS = LINE.split()


def english(n_words: int, seed: int = 0) -> str:
    """Deterministic text with what a tokenizer can trip over: non-ASCII letters, runs of spaces and of
    newlines, indented lines, tabs."""
    rng = random.Random(seed)
    out = []
    for i in range(n_words):
        out.append(rng.choice(WORDS))
        out.append(rng.choice([" "] * 12 + ["\n", "\n\n", "  ", "\n    ", "\t", " \n"]) if i % 9 == 8 else " ")
    return "".join(out) + "\n"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def tokens_of(out: Path) -> tuple[np.ndarray, np.ndarray]:
    return np.fromfile(out / "train.bin", dtype="<u2"), np.fromfile(out / "val.bin", dtype="<u2")


def meta_of(out: Path) -> dict:
    return json.loads((out / "meta.json").read_text())


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(english(3000), encoding="utf-8")
    return path


def needs(package: str):
    return pytest.importorskip(package, reason=f"{package} is not installed (pip install 'andrea-exp[prepare]')")


# ------------------------------------------------------------------ tokenizers: round trip, counts, meta.json


def test_bytes_round_trip_counts_and_split(capsys, tmp_path, text_file):
    out = tmp_path / "out"
    code, printed, err = run(capsys, text_file, "--out", out, "--seq-len", T)
    assert code == 0, err
    assert printed.startswith(f"[andrea-exp] wrote {out}: ") and f"data=tokens data.path={out}" in printed
    train, val = tokens_of(out)
    raw = text_file.read_bytes()
    assert np.concatenate([train, val]).tobytes() == np.frombuffer(raw, np.uint8).astype("<u2").tobytes()
    assert decode_bytes(np.concatenate([train, val]).tolist()) == text_file.read_text(encoding="utf-8")
    n = len(raw)
    assert val.size == math.ceil(n * 0.1) and train.size == n - val.size  # the last 10% of the stream
    meta = meta_of(out)
    assert meta["tokenizer"] == {"kind": "bytes", "file": None} and meta["vocab_size"] == 256
    assert meta["tokens"] == {"train": train.size, "val": val.size, "total": n}
    assert meta["split"]["val_fraction"] == 0.1 and "ceil(N * val_fraction)" in meta["split"]["rule"]
    assert not (out / "tokenizer.json").exists()
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]  # no temporary file left


def test_meta_json_records_inputs_settings_and_references(capsys, tmp_path, text_file):
    out = tmp_path / "out"
    assert run(capsys, text_file, "--out", out, "--seq-len", T, "--val-fraction", 0.2)[0] == 0
    meta = meta_of(out)
    raw = text_file.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    assert meta["inputs"] == [{"path": str(text_file), "bytes": len(raw), "sha256": digest}]
    assert meta["corpus"]["bytes"] == len(raw) and meta["corpus"]["sha256"] == digest
    assert meta["settings"] == {"format": 1, "tokenizer": "bytes", "vocab_size": None, "val_fraction": 0.2,
                                "seq_len": T}
    assert meta["dtype"] == "uint16 little-endian"
    # the references: train.bin's counts, every window of T + 1 tokens of val.bin scored
    train, val = tokens_of(out)
    refs = meta["references"]
    assert refs["seq_len"] == T and refs["windows"] == (val.size - 1) // T
    expected = held_out_references(NgramCounts.of([train], 256), held_out_token_windows(out / "val.bin", T,
                                                                                       refs["windows"]))
    assert refs["unigram"] == pytest.approx(expected["unigram"]) and refs["bigram"] == pytest.approx(expected["bigram"])
    assert refs["log_vocab"] == pytest.approx(math.log(256))
    assert refs["bigram"] < refs["unigram"] < math.log(256)  # text: the previous byte helps


def test_bpe_round_trip_and_token_counts(capsys, tmp_path, text_file):
    tokenizers = needs("tokenizers")
    out = tmp_path / "out"
    code, _, err = run(capsys, text_file, "--out", out, "--tokenizer", "bpe", "--vocab-size", 400, "--seq-len", T)
    assert code == 0, err
    meta = meta_of(out)
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    assert meta["tokenizer"]["kind"] == "bpe" and meta["tokenizer"]["file"] == "tokenizer.json"
    assert meta["tokenizer"]["requested_vocab_size"] == 400 and 256 < meta["vocab_size"] == tok.get_vocab_size() <= 400
    text = text_file.read_text(encoding="utf-8")
    train, val = tokens_of(out)
    ids = np.concatenate([train, val])
    assert ids.tolist() == tok.encode(text).ids  # the chunked tokenizing gives the whole text's tokens
    assert meta["tokens"] == {"train": train.size, "val": val.size, "total": ids.size} and ids.size < len(text) / 2
    assert int(ids.max()) < meta["vocab_size"]
    assert val.size == math.ceil(ids.size * 0.1)
    assert tok.decode(ids.tolist()) == text
    for other in ["plain words", "  lead and trail  \n\n\t", "unseen: Ωμέγα 🙂 \u2028 x\x1cy", english(50, seed=9)]:
        assert tok.decode(tok.encode(other).ids) == other  # byte-level: any text, not only the corpus
    assert meta["references"]["log_vocab"] == pytest.approx(math.log(meta["vocab_size"]))


def test_text_chunks_cut_where_the_pretokenizer_does(capsys, tmp_path):
    tokenizers = needs("tokenizers")
    text = english(2000, seed=3) + "x" * 300 + " tail"  # a stretch with nowhere to cut
    pieces = text_chunks(text, size=100)
    assert "".join(pieces) == text and len(pieces) > 20
    assert all(len(p) <= 400 for p in pieces)
    assert all(p[-1] not in " \n" and p[-1].isascii() for p in pieces[:-1] if not p.endswith("x"))
    tok = prepare_module.train_bpe(tokenizers, text, 350)
    assert sum((tok.encode(p).ids for p in pieces if "x" * 100 not in p), []) == \
           tok.encode("".join(p for p in pieces if "x" * 100 not in p)).ids
    whole = tok.encode(english(2000, seed=3)).ids
    assert sum((e.ids for e in tok.encode_batch(text_chunks(english(2000, seed=3), size=100))), []) == whole


def test_gpt2_with_an_encoding_at_hand(capsys, tmp_path, text_file, monkeypatch):
    """The gpt2 path with a stand-in for tiktoken's GPT-2 encoding (its files are not here): byte ranks and
    GPT-2's pattern, so the ids are the bytes."""
    tiktoken = needs("tiktoken")
    from tiktoken_ext.openai_public import r50k_pat_str

    stand_in = tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str,
                                 mergeable_ranks={bytes([i]): i for i in range(256)}, special_tokens={})
    monkeypatch.setattr(prepare_module, "load_gpt2", lambda: stand_in)
    out = tmp_path / "out"
    code, _, err = run(capsys, text_file, "--out", out, "--tokenizer", "gpt2", "--seq-len", T)
    assert code == 0, err
    meta = meta_of(out)
    assert meta["tokenizer"]["kind"] == "gpt2" and meta["tokenizer"]["encoding"] == "gpt2"
    assert meta["vocab_size"] == 256
    ids = np.concatenate(tokens_of(out))
    assert ids.astype(np.uint8).tobytes() == text_file.read_bytes()
    data = build_dataset(tokens_cfg(out), T, seed=0)
    assert data.vocab_size == 256 and data.decode(ids[:40].tolist()) == text_file.read_bytes()[:40].decode()


def test_gpt2_without_a_cached_encoding_is_one_line(capsys, tmp_path, text_file, monkeypatch):
    needs("tiktoken")

    def no_network(*args, **kwargs):
        raise AssertionError("the network was used")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    out = tmp_path / "out"
    code, printed, err = run(capsys, text_file, "--out", out, "--tokenizer", "gpt2", "--seq-len", T)
    assert code == 2 and printed == "" and err.count("\n") == 1
    assert err.startswith(f"error: --tokenizer gpt2: tiktoken's GPT-2 encoding is not in tiktoken's cache {cache} "
                          "and this command never downloads")
    assert f"TIKTOKEN_CACHE_DIR={cache} python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\"" in err
    assert not out.exists() and list(cache.iterdir()) == []
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken's way to turn its cache off
    code, _, err = run(capsys, text_file, "--out", out, "--tokenizer", "gpt2", "--seq-len", T)
    assert code == 2 and "TIKTOKEN_CACHE_DIR is empty" in err and err.count("\n") == 1


@pytest.mark.parametrize("kind, package", [("bpe", "tokenizers"), ("gpt2", "tiktoken")])
def test_a_missing_package_names_the_extra(capsys, tmp_path, text_file, monkeypatch, kind, package):
    monkeypatch.setitem(sys.modules, package, None)  # import fails
    out = tmp_path / "out"
    code, _, err = run(capsys, text_file, "--out", out, "--tokenizer", kind)
    assert (code, err) == (2, f"error: --tokenizer {kind} needs the package {package!r}, which is not installed: "
                              "pip install 'andrea-exp[prepare]'\n")
    assert not out.exists()


# ------------------------------------------------------------------ folders and archives


def test_a_folder_is_read_recursively_in_name_order(capsys, tmp_path):
    root = tmp_path / "texts"
    (root / "b" / "deep").mkdir(parents=True)
    parts = {"b/deep/z.txt": english(300, 1), "a.txt": english(300, 2), "b/c.txt": english(300, 3)}
    for name, text in parts.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / "notes.md").write_text("not included\n")
    out = tmp_path / "out"
    assert run(capsys, root, "--out", out, "--seq-len", T)[0] == 0
    joined = "".join(parts[k] for k in ("a.txt", "b/c.txt", "b/deep/z.txt")).encode()
    assert np.concatenate(tokens_of(out)).astype(np.uint8).tobytes() == joined
    assert [i["path"] for i in meta_of(out)["inputs"]] == [str(root / k) for k in ("a.txt", "b/c.txt",
                                                                                   "b/deep/z.txt")]
    only = tmp_path / "only"
    assert run(capsys, root, "--out", only, "--seq-len", T, "--include", "b/*.txt")[0] == 0
    assert len(meta_of(only)["inputs"]) == 2 and meta_of(only)["include"] == "b/*.txt"


def test_an_archive_is_joined_as_andrea_exp_corpora_joins_it(capsys, tmp_path):
    members = {"pkg/texts/b_gut.txt": english(400, 5).encode(), "pkg/texts/a_gut.txt": english(400, 6).encode(),
               "pkg/README": b"skip me", "pkg/other/c_gut.txt": b"skip me too"}
    archive = make_archive(tmp_path / "corpus.tar.gz", members)
    out = tmp_path / "out"
    assert run(capsys, archive, "--out", out, "--seq-len", T, "--include", "*/texts/*_gut.txt")[0] == 0
    joined = tmp_path / "joined.txt"
    join_texts(archive, "*/texts/*_gut.txt", joined)
    assert np.concatenate(tokens_of(out)).astype(np.uint8).tobytes() == joined.read_bytes()
    assert [i["path"] for i in meta_of(out)["inputs"]] == [f"{archive}:pkg/texts/a_gut.txt",
                                                          f"{archive}:pkg/texts/b_gut.txt"]


# ------------------------------------------------------------------ bad input: one line each, nothing written


def refused(capsys, tmp_path, *argv) -> str:
    out = tmp_path / "out"
    code, printed, err = run(capsys, *argv, "--out", out)
    assert code == 2 and printed == "" and err.count("\n") == 1 and err.startswith("error: "), err
    assert not out.exists()
    return err[len("error: "):-1]


def test_a_missing_input(capsys, tmp_path, text_file):
    missing = tmp_path / "nope.txt"
    assert refused(capsys, tmp_path, text_file, missing) == f"input {str(missing)!r} does not exist"


def test_an_empty_input(capsys, tmp_path, text_file):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert refused(capsys, tmp_path, text_file, empty) == f"input {str(empty)!r} is empty"


def test_a_binary_input(capsys, tmp_path, text_file):
    blob = tmp_path / "weights.txt"
    blob.write_bytes(bytes(range(256)) * 100)
    message = refused(capsys, tmp_path, text_file, blob)
    assert message.startswith(f"input {str(blob)!r} looks binary, not text: ") and "NUL bytes" in message
    assert message.endswith("; prepare reads text files")


def test_an_unreadable_input(capsys, tmp_path, text_file, monkeypatch):
    read = Path.read_bytes

    def denied(self):
        if self.name == "corpus.txt":
            raise PermissionError(13, "Permission denied")
        return read(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    assert refused(capsys, tmp_path, text_file) == f"input {str(text_file)!r} cannot be read (permission denied)"


def test_folders_and_archives_without_a_matching_text(capsys, tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.md").write_text("words\n")
    assert refused(capsys, tmp_path, folder) == f"input {str(folder)!r} holds no file matching '*.txt' (--include)"
    archive = make_archive(tmp_path / "c.tar.gz", {"x/a.md": b"words\n"})
    assert refused(capsys, tmp_path, archive) == f"input {str(archive)!r} holds no file matching '*.txt' (--include)"
    empty_member = make_archive(tmp_path / "e.tar.gz", {"x/a.txt": english(500).encode(), "x/b.txt": b""})
    assert refused(capsys, tmp_path, empty_member) == f"input '{empty_member}:x/b.txt' is empty"
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"not a gzip file at all")
    assert refused(capsys, tmp_path, broken).startswith(f"input {str(broken)!r} cannot be read as a .tar.gz archive")


def test_a_corpus_too_small_for_seq_len(capsys, tmp_path, text_file):
    n = text_file.stat().st_size  # about 19 kB: val.bin gets about 1.9k tokens, 4 windows of 1025 need 4100
    message = refused(capsys, tmp_path, text_file)  # --seq-len 1024 by default
    assert message.startswith(f"the corpus {str(text_file)!r} (1 file, {n} bytes) is too small for --seq-len 1024: "
                              f"its {n} tokens give val.bin {math.ceil(n * 0.1)} and train.bin "
                              f"{n - math.ceil(n * 0.1)} (--val-fraction 0.1), but val.bin needs 4100 (4 windows "
                              "of 1025 tokens) and train.bin 1025")
    # bpe: refused on the bytes (a token is at least one byte) before any training
    needs("tokenizers")
    assert "too small for --seq-len 1024: its at most" in refused(capsys, tmp_path, text_file, "--tokenizer", "bpe",
                                                                   "--vocab-size", 300)


def test_a_corpus_whose_tokens_are_too_few_is_refused_after_tokenizing(capsys, tmp_path):
    needs("tokenizers")
    repetitive = tmp_path / "aaa.txt"
    repetitive.write_text(("a" * 64 + " ") * 60)  # 3900 bytes, but a few hundred BPE tokens
    message = refused(capsys, tmp_path, repetitive, "--tokenizer", "bpe", "--vocab-size", 300, "--seq-len", 64)
    assert message.startswith(f"the corpus {str(repetitive)!r} (1 file, 3900 bytes) is too small for --seq-len 64: "
                              "its ") and "at most" not in message


@pytest.mark.parametrize("argv, message", [
    (["--vocab-size", "500"], "--vocab-size is read only by --tokenizer bpe; got --vocab-size 500 with "
                              "--tokenizer bytes"),
    (["--tokenizer", "bpe", "--vocab-size", "65537"], "--vocab-size must be from 257 to 65536 (256 bytes and at "
                                                      "least one merge; uint16 ids); got 65537"),
    (["--tokenizer", "wordpiece"], "--tokenizer must be one of bytes, bpe, gpt2; got 'wordpiece'"),
    (["--val-fraction", "1"], "--val-fraction must be between 0 and 1; got 1"),
])
def test_bad_options(capsys, tmp_path, text_file, argv, message):
    assert refused(capsys, tmp_path, text_file, *argv) == message


def test_a_bad_input_leaves_a_prepared_directory_as_it_was(capsys, tmp_path, text_file):
    out = tmp_path / "out"
    assert run(capsys, text_file, "--out", out, "--seq-len", T)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert run(capsys, text_file, empty, "--out", out, "--seq-len", T, "--force")[0] == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# ------------------------------------------------------------------ a rerun is a no-op


def stamps(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.iterdir()}


def test_a_rerun_is_a_no_op_unless_something_changed(capsys, tmp_path, text_file, monkeypatch):
    out = tmp_path / "out"
    argv = [text_file, "--out", out, "--seq-len", T]
    assert run(capsys, *argv)[0] == 0
    first = stamps(out)
    monkeypatch.setattr(prepare_module, "tokenize", lambda *a, **k: pytest.fail("tokenized again"))
    code, printed, _ = run(capsys, *argv)
    assert code == 0 and printed == (f"[andrea-exp] {out} is up to date (the same inputs and settings as its "
                                     "meta.json); --force prepares it again\n")
    assert stamps(out) == first
    monkeypatch.undo()
    before = stamps(out)
    code, printed, _ = run(capsys, *argv, "--force")  # --force: written again
    assert code == 0 and printed.startswith("[andrea-exp] wrote") and stamps(out) != before
    # anything else that would replace it is refused before tokenizing, the earlier output kept, until --force
    monkeypatch.setattr(prepare_module, "tokenize", lambda *a, **k: pytest.fail("tokenized before refusing"))
    refusals = [(["--val-fraction", "0.2"], "it was prepared with other settings (val_fraction was 0.1)")]
    with open(text_file, "a") as handle:  # a changed input
        handle.write("one more line\n")
    refusals.append(([], "it was prepared from other inputs (their sizes or SHA-256 differ)"))
    for change, why in refusals:
        before = stamps(out)
        code, printed, err = run(capsys, *argv, *change)
        assert (code, printed) == (2, "") and stamps(out) == before
        assert err == (f"error: --out {str(out)!r} holds an earlier preparation and {why}; --force replaces it, or "
                       "choose another --out\n")
    monkeypatch.undo()
    assert run(capsys, *argv, "--val-fraction", "0.2", "--force")[1].startswith("[andrea-exp] wrote")
    assert run(capsys, *argv, "--val-fraction", "0.2")[1].startswith(f"[andrea-exp] {out} is up to date")
    (out / "val.bin").write_bytes(b"\x00\x00")  # a damaged output
    assert run(capsys, *argv, "--val-fraction", "0.2")[2].endswith(
        "and its val.bin is not the size its meta.json records; --force replaces it, or choose another --out\n")
    assert run(capsys, *argv, "--val-fraction", "0.2", "--force")[1].startswith("[andrea-exp] wrote")
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_a_folder_that_holds_other_files_needs_force(capsys, tmp_path, text_file):
    out = tmp_path / "notes"
    out.mkdir()
    assert run(capsys, text_file, "--out", out, "--seq-len", T)[0] == 0  # an empty folder is new output
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.md").write_text("mine\n")
    code, printed, err = run(capsys, text_file, "--out", other, "--seq-len", T)
    assert (code, printed) == (2, "") and [p.name for p in other.iterdir()] == ["notes.md"]
    assert err == (f"error: --out {str(other)!r} is not empty and holds no preparation (meta.json); choose a new or "
                   "empty folder, or --force writes train.bin, val.bin and meta.json into it\n")
    assert run(capsys, text_file, "--out", other, "--seq-len", T, "--force")[0] == 0
    assert sorted(p.name for p in other.iterdir()) == ["meta.json", "notes.md", "train.bin", "val.bin"]


def test_bytes_after_bpe_removes_the_old_tokenizer(capsys, tmp_path, text_file):
    needs("tokenizers")
    out = tmp_path / "out"
    assert run(capsys, text_file, "--out", out, "--seq-len", T, "--tokenizer", "bpe", "--vocab-size", 300)[0] == 0
    assert (out / "tokenizer.json").is_file()
    assert run(capsys, text_file, "--out", out, "--seq-len", T)[0] == 2  # replacing it needs --force
    assert (out / "tokenizer.json").is_file() and meta_of(out)["tokenizer"]["kind"] == "bpe"
    assert run(capsys, text_file, "--out", out, "--seq-len", T, "--force")[0] == 0
    assert not (out / "tokenizer.json").exists() and meta_of(out)["vocab_size"] == 256


# ------------------------------------------------------------------ data=tokens reads meta.json


def tokens_cfg(path, **overrides):
    cfg = compose_config("data=tokens", f"data.path={path}", f"data.seq_len={T}",
                         *(f"{k}={v}" for k, v in overrides.items()))
    return cfg.data


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_a_prepared_directory_trains_without_typing_vocab_size(capsys, tmp_path, text_file, kind):
    if kind == "bpe":
        needs("tokenizers")
    out = tmp_path / "out"
    extra = ["--tokenizer", "bpe", "--vocab-size", 320] if kind == "bpe" else []
    assert run(capsys, text_file, "--out", out, "--seq-len", T, *extra)[0] == 0
    meta = meta_of(out)
    cfg = tokens_cfg(out)
    assert cfg.vocab_size is None
    data = build_dataset(cfg, T, seed=0)
    assert data.vocab_size == meta["vocab_size"]
    x, y = data.batch(0, 4, seed=0)
    assert x.shape == (4, T) and int(x.max()) < meta["vocab_size"]
    _, val = tokens_of(out)
    text = text_file.read_text(encoding="utf-8")
    assert data.decode(val.tolist()) == text[len(text) - len(data.decode(val.tolist())):]  # the text's end
    assert data.decode([*val[:5].tolist(), meta["vocab_size"] + 3]).endswith("\ufffd")  # an id beyond it
    # the settings validation takes the vocabulary from meta.json too
    assert command_line_error(["data=tokens", f"data.path={out}", f"data.seq_len={T}"], CONF_DIR) is None
    small = meta["vocab_size"] - 1
    assert f"model.vocab_size must be null or >= the data's {meta['vocab_size']} tokens; got {small}" in \
           command_line_error(["data=tokens", f"data.path={out}", f"data.seq_len={T}", f"model.vocab_size={small}"],
                              CONF_DIR)


def test_a_typed_vocab_size_wins_and_too_small_still_errors(capsys, tmp_path, text_file):
    out = tmp_path / "out"
    assert run(capsys, text_file, "--out", out, "--seq-len", T)[0] == 0
    assert build_dataset(tokens_cfg(out, **{"data.vocab_size": 300}), T, seed=0).vocab_size == 300
    top = int(tokens_of(out)[1].max())
    with pytest.raises(ConfigError, match=rf"^data.vocab_size=100 is too small for .*val.bin'.* token id {top}; "
                                          rf"set data.vocab_size to at least {top + 1}$"):
        build_dataset(tokens_cfg(out, **{"data.vocab_size": 100}), T, seed=0)


def test_without_meta_json_the_vocabulary_stays_gpt2s(tmp_path):
    root = tmp_path / "plain"
    root.mkdir()
    for name in ("train.bin", "val.bin"):
        np.arange(200, dtype="<u2").tofile(root / name)
    data = build_dataset(tokens_cfg(root), T, seed=0)
    assert data.vocab_size == 50257 and data.decode([1, 2]) is None


@pytest.mark.parametrize("content, cause", [
    ("{not json", "cannot be read as JSON"),
    ('{"vocab_size": 70000}', "has vocab_size 70000, not an integer from 2 to 65536"),
    ('{"vocab_size": 1}', "has vocab_size 1, not an integer from 2 to 65536"),  # one token: nothing to learn
])
def test_a_bad_meta_json_is_one_line(capsys, tmp_path, text_file, content, cause):
    out = tmp_path / "out"
    assert run(capsys, text_file, "--out", out, "--seq-len", T)[0] == 0
    (out / "meta.json").write_text(content)
    with pytest.raises(ConfigError) as caught:
        build_dataset(tokens_cfg(out), T, seed=0)
    assert str(caught.value).startswith(f"data.path: {str(out / 'meta.json')!r} {cause}")
    assert "\n" not in str(caught.value)


def test_three_training_steps_through_the_cli(capsys, tmp_path, text_file, cli):
    out = tmp_path / "out"
    assert run(capsys, text_file, "--out", out, "--seq-len", T)[0] == 0
    run_dir = tmp_path / "run"
    done = cli("data=tokens", f"data.path={out}", f"data.seq_len={T}", "train.max_steps=3", "probe.every=0",
               "data.eval_sequences=8", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run/status"] == "finished" and summary["run/steps"] == 3
    assert summary["data/log_vocab"] == pytest.approx(math.log(256))
    assert isinstance(summary.get("eval/sample_text"), str)  # decoded with the bytes tokenizer
