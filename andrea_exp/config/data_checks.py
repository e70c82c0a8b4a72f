"""Checks of a data source's settings and files, cheap and without torch: a bad data.path (missing,
unreadable, a directory, binary, too small, 4-byte numbers given as uint16 ids, token ids beyond the
vocabulary) is one line naming the setting and the cause, raised while the settings are validated, before
any expensive work. The token file format's constants and readers live here too, shared with
andrea_exp.data.sources's loaders.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from andrea_exp.config.errors import ConfigError

TOKEN_DTYPE = np.dtype("<u2")  # flat little-endian uint16, 2 bytes a token
TOKEN_FILES = ("train.bin", "val.bin")
TOKEN_META = "meta.json"  # written by andrea_exp.data.prepare beside the token files: tokenizer and vocabulary size
DEFAULT_TOKEN_VOCAB = 50257  # data=tokens' vocabulary without data.vocab_size or meta.json: GPT-2's BPE
# the rule for "a binary file given as text", applied to the file's first BINARY_SAMPLE bytes
MARKOV_MAX_CONTEXTS = 2_000_000  # data=markov's table: vocab_size ** order contexts, a row each
BINARY_SAMPLE = 1 << 20
MAX_NUL_FRACTION = 0.01  # text has no NUL bytes; more than 1% of them means a binary file
MAX_INVALID_UTF8_FRACTION = 0.05  # more than 5% of bytes outside valid UTF-8 means not text


def check_markov_contexts(vocab_size: int, order: int) -> None:
    """data=markov's table fits: at most MARKOV_MAX_CONTEXTS contexts (ConfigError otherwise, a ValueError)."""
    if vocab_size ** order > MARKOV_MAX_CONTEXTS:
        raise ConfigError(f"data.vocab_size ** data.order must be at most {MARKOV_MAX_CONTEXTS:,} contexts; "
                          f"got {vocab_size}**{order}")


def open_tokens(file: Path) -> np.ndarray:
    """The token ids of a flat uint16 file as a read-only memory map: nothing is read until indexed."""
    return np.memmap(file, dtype=TOKEN_DTYPE, mode="r")


def too_large_id(rows: np.ndarray, vocab_size: int, file: Path, what: str) -> None:
    top = int(rows.max())
    if top >= vocab_size:
        raise ConfigError(f"data.vocab_size={vocab_size} is too small for {str(file)!r}: {what} hold token id "
                          f"{top}; set data.vocab_size to at least {top + 1}")


def token_meta(root: Path) -> dict | None:
    """The meta.json of a token directory (andrea_exp.data.prepare), or None when there is none; a meta.json that
    cannot be read, or whose vocab_size is not an integer from 2 to 65536, is a one-line error."""
    file = Path(root) / TOKEN_META
    if not file.is_file():
        return None
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _fail(file, f"cannot be read as JSON ({getattr(err, 'strerror', None) or err}); "
                          "rewrite it with python -m andrea_exp.prepare or remove it") from None
    vocab = meta.get("vocab_size") if isinstance(meta, dict) else None
    if isinstance(vocab, bool) or not isinstance(vocab, int) or not 2 <= vocab <= 65536:
        raise _fail(file, f"has vocab_size {vocab!r}, not an integer from 2 to 65536; rewrite it with "
                          "python -m andrea_exp.prepare or remove it")
    return meta


def token_vocab_size(cfg_data) -> int:
    """data=tokens' vocabulary: data.vocab_size when set, else the vocab_size of data.path/meta.json, else 50257."""
    vocab = cfg_data.vocab_size
    if vocab is not None:
        return vocab
    meta = token_meta(Path(str(cfg_data.path)).expanduser())
    return DEFAULT_TOKEN_VOCAB if meta is None else meta["vocab_size"]


def held_out_token_windows(file: Path, seq_len: int, n: int) -> np.ndarray:
    """(n, T + 1) uint16 windows of a token file at evenly spaced offsets: the same for every run seed."""
    ids = open_tokens(file)
    last = ids.size - (seq_len + 1)  # the last offset at which a whole window fits
    starts = np.arange(n, dtype=np.int64) * last // max(n - 1, 1)  # (n,)
    return np.asarray(ids[starts[:, None] + np.arange(seq_len + 1)])


def check_data(cfg_data, seq_len: int) -> None:
    """Raise ConfigError, one line naming data.path, the path and the cause, for data that cannot be used.

    Cheap (reads at most 1 MiB and the held-out windows), so the settings validation can call it before
    any expensive work. A text file is refused as binary when, in its first 1 MiB, more than 1% of the
    bytes are NUL or more than 5% are not part of valid UTF-8.
    """
    name = cfg_data.name
    if name == "markov":
        return
    if name not in ("text", "tokens"):
        raise ConfigError(f"data must be markov, text or tokens; got {name!r}")
    path = None if _is_missing(cfg_data, "path") else cfg_data.path
    kind = "a text file" if name == "text" else "a directory holding train.bin and val.bin"
    if path in (None, "", "???"):
        raise ConfigError(f"data.path must name {kind} when data={name}; got nothing")
    where = Path(str(path)).expanduser()
    if not where.exists():
        raise ConfigError(f"data.path: {str(where)!r} does not exist; data={name} needs {kind}")
    if name == "text":
        _check_text_file(where, seq_len)
    else:
        _check_token_dir(where, cfg_data, seq_len)


def _is_missing(cfg, key: str) -> bool:
    """OmegaConf's `???` test, tolerant of the typed group."""
    from omegaconf import DictConfig, OmegaConf

    return isinstance(cfg, DictConfig) and OmegaConf.is_missing(cfg, key)


def _fail(file: Path, cause: str):
    return ConfigError(f"data.path: {str(file)!r} {cause}")


def _read_head(file: Path, size: int) -> bytes:
    """The first `size` bytes; an unreadable file is a one-line error."""
    try:
        with open(file, "rb") as handle:
            return handle.read(size)
    except PermissionError:
        raise _fail(file, "cannot be read (permission denied)") from None
    except OSError as err:
        raise _fail(file, f"cannot be read ({err.strerror or type(err).__name__})") from None


def _check_regular_file(file: Path, needed_as: str) -> None:
    if file.is_dir():
        raise _fail(file, f"is a directory; {needed_as}")
    if not file.is_file():
        raise _fail(file, f"is not a regular file; {needed_as}")


def _check_text_file(file: Path, seq_len: int) -> None:
    _check_regular_file(file, "data=text needs a text file")
    head = _read_head(file, BINARY_SAMPLE)
    size = file.stat().st_size
    need = 2 * (seq_len + 2)  # a training and a held-out part, each longer than one window
    if size < need:
        raise _fail(file, f"has {size} bytes; data.seq_len={seq_len} needs at least {need}")
    cause = binary_cause(head)
    if cause is not None:
        raise _fail(file, f"{cause}; for token ids use data=tokens")


def binary_cause(head: bytes) -> str | None:
    """Why the first bytes of a file make it binary rather than text (the rule of check_data), or None for text."""
    if not head:
        return None
    nul = head.count(0) / len(head)
    # surrogateescape turns each byte outside valid UTF-8 into one lone surrogate, so they can be counted
    decoded = head.decode("utf-8", errors="surrogateescape")
    invalid = sum(1 for ch in decoded if "\udc80" <= ch <= "\udcff") / len(head)
    if nul > MAX_NUL_FRACTION or invalid > MAX_INVALID_UTF8_FRACTION:
        return (f"looks binary, not text: {nul:.1%} NUL bytes and {invalid:.1%} bytes outside UTF-8 in its first "
                f"{len(head)} bytes (text allows at most {MAX_NUL_FRACTION:.0%} and {MAX_INVALID_UTF8_FRACTION:.0%})")
    return None


MIN_WIDTH_WORDS = 16  # wide_token_cause judges a head of at least this many 4-byte words


def wide_token_cause(head: bytes) -> str | None:
    """Why the first bytes of a token file are 4-byte numbers rather than uint16 ids, or None. Read as
    little-endian int32 or float32, uint16 text ids are almost never all whole numbers below 65536 (that needs
    every second id 0, or every second id in a narrow band and their neighbours' low bits 0); 32- or 64-bit ids
    always are. A head of zeros alone says nothing."""
    words = len(head) // 4
    if words < MIN_WIDTH_WORDS or not any(head[: words * 4]):
        return None
    as_int = np.frombuffer(head, dtype="<i4", count=words)
    if ((as_int >= 0) & (as_int < 65536)).all():
        return "looks like 32- or 64-bit integers, not uint16 ids: every second uint16 of its first bytes is 0"
    as_float = np.frombuffer(head, dtype="<f4", count=words).astype(np.float64)
    with np.errstate(invalid="ignore"):
        whole = np.isfinite(as_float) & (as_float >= 0) & (as_float < 65536) & (as_float == np.round(as_float))
    if whole.all():
        return "looks like 32-bit floats, not uint16 ids: its first bytes read as float32 are all whole numbers"
    return None


def _check_token_dir(root: Path, cfg_data, seq_len: int) -> None:
    if not root.is_dir():
        raise _fail(root, "is a file; data=tokens needs a directory holding train.bin and val.bin")
    vocab = token_vocab_size(cfg_data)  # null: meta.json's (andrea_exp.data.prepare), else GPT-2's 50257
    if isinstance(vocab, bool) or not isinstance(vocab, int) or not 2 <= vocab <= 65536:
        raise ConfigError(f"data.vocab_size must be an integer from 2 to 65536 (uint16 token ids); got {vocab!r}")
    heads: dict[Path, np.ndarray] = {}  # the first BINARY_SAMPLE bytes of each file, as ids
    for name in TOKEN_FILES:
        file = root / name
        if not file.exists() and not file.is_symlink():
            raise _fail(file, f"is missing; data=tokens needs {' and '.join(TOKEN_FILES)} in data.path")
        _check_regular_file(file, "data=tokens needs a flat uint16 token file")
        head = _read_head(file, BINARY_SAMPLE)
        size = file.stat().st_size
        if size % TOKEN_DTYPE.itemsize:
            raise _fail(file, f"has an odd number of bytes ({size}); a token file is flat uint16, 2 bytes a token")
        if size // TOKEN_DTYPE.itemsize < seq_len + 1:
            raise _fail(file, f"holds {size // TOKEN_DTYPE.itemsize} tokens; data.seq_len={seq_len} needs at "
                              f"least {seq_len + 1}")
        cause = wide_token_cause(head)
        if cause is not None:
            raise _fail(file, f"{cause}; data=tokens reads flat little-endian uint16 ids (python -m "
                              "andrea_exp.prepare writes them)")
        heads[file] = np.frombuffer(head, dtype=TOKEN_DTYPE, count=len(head) // TOKEN_DTYPE.itemsize)
    held_file = root / "val.bin"
    held = held_out_token_windows(held_file, seq_len, cfg_data.eval_sequences)
    too_large_id(held, vocab, held_file, "its held-out windows")
    for file, first in heads.items():  # the start of train.bin, which the held-out windows do not see
        too_large_id(first, vocab, file, f"its first {first.size} tokens")
