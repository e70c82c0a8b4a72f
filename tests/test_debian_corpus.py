"""A corpus of documents read out of Debian packages: tiny .deb files built here with dpkg-deb (no network),
read into a folder of documents with its provenance; bad packages are one line."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from andrea_exp.config.errors import ConfigError
from andrea_exp.data import corpora, debian
from andrea_exp.data.corpora import Documents, Package

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs Debian's dpkg-deb")


def make_deb(into: Path, package: str, version: str, files: dict[str, bytes]) -> Path:
    """A real .deb of `files` (paths inside the package), built with dpkg-deb as apt-get download names it."""
    root = into / f"build-{package}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
                                             "Maintainer: nobody <nobody@example.org>\nDescription: test\n")
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    deb = into / f"{package}_{version.replace(':', '%3a')}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)], check=True,
                   capture_output=True)
    shutil.rmtree(root)
    return deb


def tar_xz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


PAGE = (b"<html><head><title>Joins</title><style>p {}</style></head><body><h1>2.6. Joins</h1>"
        b"<p>Queries can access   \n several tables.</p><script>var x;</script><p>A &amp; B</p></body></html>")
SOURCE = tar_xz({
    "src-1/Documentation/admin/intro.rst": b"Linux is a kernel.\n",
    "src-1/Documentation/translations/it/intro.rst": b"Linux e un kernel.\n",
    "src-1/Documentation/notes.txt": b"Plain notes.\n",
    "src-1/kernel/fork.c": b"int fork(void);\n",
})
TINY = Documents((
    Package("tiny-src", "1.0", debian.Select(("*/Documentation/*.rst", "*/Documentation/*.txt"),
                                             ("*/Documentation/translations/*",), inner="usr/src/src-1.tar.xz")),
    Package("tiny-doc", "2:3.1-1", debian.Select(("usr/share/doc/tiny/*.txt", "usr/share/doc/tiny/*.pod"))),
    Package("tiny-html", "0.9", debian.Select(("usr/share/doc/tiny-html/*.html",), ("*/genindex.html",),
                                              html=True)),
))


@pytest.fixture
def debs(tmp_path) -> Path:
    into = tmp_path / "corpora"
    into.mkdir()
    make_deb(into, "tiny-src", "1.0", {"usr/src/src-1.tar.xz": SOURCE, "usr/share/doc/tiny-src/README": b"x\n"})
    make_deb(into, "tiny-doc", "2:3.1-1", {
        "usr/share/doc/tiny/b.txt": b"Second document.\n",
        "usr/share/doc/tiny/sub/a.pod": b"=head1 NAME\n\nperlfunc - functions\n",
        "usr/share/doc/tiny/empty.txt": b"  \n",
        "usr/share/doc/tiny/blob.txt": b"\x00\x01\x02 binary",
        "usr/share/doc/tiny/c.png": b"not a document",
    })
    make_deb(into, "tiny-html", "0.9", {"usr/share/doc/tiny-html/joins.html": PAGE,
                                        "usr/share/doc/tiny-html/genindex.html": b"<p>index</p>"})
    return into


def test_documents_are_read_out_of_the_packages_with_their_provenance(debs, capsys):
    out = corpora.fetch_documents("tiny", TINY, debs)
    assert out == debs / "tiny"
    written = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    provenance = json.loads(written.pop("provenance.json"))
    assert written == {
        "tiny-src/src-1/Documentation/admin/intro.rst.txt": b"Linux is a kernel.\n",
        "tiny-src/src-1/Documentation/notes.txt": b"Plain notes.\n",
        "tiny-doc/usr/share/doc/tiny/b.txt": b"Second document.\n",
        "tiny-doc/usr/share/doc/tiny/sub/a.pod.txt": b"=head1 NAME\n\nperlfunc - functions\n",
        # the <head> (its <title> too), <style> and <script> left out; a line break at each block
        "tiny-html/usr/share/doc/tiny-html/joins.html.txt": b"2.6. Joins\n\nQueries can access\n several tables.\n\n"
                                                            b"A & B\n",
    }
    rows = {p["package"]: p for p in provenance["packages"]}
    assert [p["package"] for p in provenance["packages"]] == ["tiny-src", "tiny-doc", "tiny-html"]
    assert rows["tiny-doc"]["version"] == "2:3.1-1" and rows["tiny-doc"]["deb"] == "tiny-doc_2%3a3.1-1_all.deb"
    assert (rows["tiny-doc"]["documents"], rows["tiny-doc"]["left_out"]) == (2, 2)  # the empty and binary files
    assert rows["tiny-doc"]["bytes"] == len(b"Second document.\n") + len(b"=head1 NAME\n\nperlfunc - functions\n")
    assert rows["tiny-src"]["inner"] == "usr/src/src-1.tar.xz" and rows["tiny-src"]["documents"] == 2
    assert rows["tiny-html"]["html"] is True
    deb = debs / rows["tiny-html"]["deb"]
    assert rows["tiny-html"]["deb_bytes"] == deb.stat().st_size and len(rows["tiny-html"]["deb_sha256"]) == 64
    assert provenance["command"] == "python -m andrea_exp.corpora tiny DIR"
    assert "note" not in capsys.readouterr().out  # every version is the one measured


def test_another_version_is_read_with_a_note_and_a_rerun_replaces_the_folder(debs, capsys):
    stale = debs / "tiny" / "old-package" / "gone.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier run")
    newer = Documents((Package("tiny-doc", "2:3.0-1", TINY.packages[1].select),))
    out = corpora.fetch_documents("tiny", newer, debs)
    assert "note: tiny-doc_2%3a3.1-1_all.deb is version 2:3.1-1, not the 2:3.0-1" in capsys.readouterr().out
    assert not stale.exists() and (out / "tiny-doc/usr/share/doc/tiny/b.txt").exists()
    assert not list(debs.glob(".tiny.tmp"))


def test_the_debian_docs_selection(debs):
    wants = {p.name: p.select.wants for p in corpora.CORPORA["debian-docs"].packages}
    linux = wants["linux-source-6.1"]
    assert linux("linux-source-6.1/Documentation/admin-guide/README.rst")
    assert linux("linux-source-6.1/Documentation/networking/ip-sysctl.txt")
    assert not linux("linux-source-6.1/Documentation/translations/zh_CN/index.rst")  # not English
    assert not linux("linux-source-6.1/Documentation/devicetree/bindings/arm/cpus.yaml")
    assert not linux("linux-source-6.1/kernel/fork.c")
    assert wants["python3.11-doc"]("usr/share/doc/python3.11/html/_sources/library/os.rst.txt")
    assert not wants["python3.11-doc"]("usr/share/doc/python3.11/html/library/os.html")
    django = wants["python-django-doc"]
    assert django("usr/share/doc/python-django-doc/html/intro/tutorial01.html")
    assert not django("usr/share/doc/python-django-doc/html/_modules/django/db/models/query.html")  # code
    assert not django("usr/share/doc/python-django-doc/html/genindex-A.html")


def test_two_debs_of_one_package_or_a_broken_deb_are_one_line(debs, tmp_path):
    (debs / "tiny-doc_9.0_all.deb").write_bytes(b"not a deb")
    with pytest.raises(ConfigError, match=r"holds 2 files tiny-doc_\*\.deb .*; keep one$"):
        corpora.fetch_documents("tiny", TINY, debs)
    (debs / "tiny-doc_2%3a3.1-1_all.deb").unlink()
    with pytest.raises(ConfigError) as err:
        corpora.fetch_documents("tiny", TINY, debs)
    assert "tiny-doc_9.0_all.deb" in str(err.value) and "\n" not in str(err.value)
    assert not (debs / "tiny").exists()  # nothing written before every package was read


def test_a_deb_without_the_documents_or_the_inner_archive_is_one_line(tmp_path):
    make_deb(tmp_path, "tiny-doc", "2:3.1-1", {"usr/share/doc/tiny/c.png": b"image"})
    with pytest.raises(ConfigError, match=r"holds no text file matching usr/share/doc/tiny/\*\.txt"):
        corpora.fetch_documents("tiny", Documents((TINY.packages[1],)), tmp_path)
    make_deb(tmp_path, "tiny-src", "1.0", {"usr/share/doc/tiny-src/README": b"x\n"})
    with pytest.raises(ConfigError, match=r"holds no usr/src/src-1.tar.xz$"):
        corpora.fetch_documents("tiny", Documents((TINY.packages[0],)), tmp_path)


def test_the_command_refuses_archive_for_a_corpus_of_documents(tmp_path, capsys):
    assert corpora.main(["debian-docs", str(tmp_path), "--archive", str(tmp_path / "x.tar.gz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --archive is read only by the corpora of one archive") and err.count("\n") == 1


def test_the_command_reads_every_package_of_debian_docs_already_downloaded(tmp_path, capsys):
    """Offline: a tiny .deb for each real package, at the paths the real ones use, one document each."""
    into = tmp_path / "corpora"
    into.mkdir()
    linux = tar_xz({"linux-source-6.1/Documentation/process/howto.rst": b"How to do kernel work.\n",
                    "linux-source-6.1/Documentation/translations/ja_JP/howto.rst": b"not English\n"})
    documents = {
        "linux-source-6.1": {"usr/src/linux-source-6.1.tar.xz": linux},
        "python3.11-doc": {"usr/share/doc/python3.11/html/_sources/tutorial/index.rst.txt": b"The tutorial.\n"},
        "perl-doc": {"usr/share/perl/5.36/pod/perlfunc.pod": b"=head1 NAME\n\nperlfunc\n"},
        "vim-runtime": {"usr/share/vim/vim90/doc/usr_01.txt": b"About the manuals.\n"},
        "git-doc": {"usr/share/doc/git-doc/git-commit.txt": b"git-commit(1)\n"},
        "postgresql-doc-15": {"usr/share/doc/postgresql-doc-15/html/tutorial.html": b"<p>The tutorial.</p>"},
        "python-django-doc": {"usr/share/doc/python-django-doc/html/intro/index.html": b"<p>Getting started</p>",
                              "usr/share/doc/python-django-doc/html/_modules/django.html": b"<p>def f(): pass</p>"},
        "sqlite3-doc": {"usr/share/doc/sqlite3/atomiccommit.html": b"<p>Atomic commit.</p>",
                        "usr/share/doc/sqlite3/requirements.html": b"<p>R-1 shall.</p>"},
        "debian-handbook": {"usr/share/doc/debian-handbook/html/en-US/apt.html": b"<p>APT.</p>",
                            "usr/share/doc/debian-handbook/html/fr-FR/apt.html": b"<p>APT, en francais.</p>"},
    }
    for package in corpora.CORPORA["debian-docs"].packages:
        make_deb(into, package.name, package.version, documents.pop(package.name))
    assert not documents  # every package of the corpus was built
    assert corpora.main(["debian-docs", str(into)]) == 0
    printed = capsys.readouterr().out
    out = into / "debian-docs"
    # 23 + 14 + 22 + 19 + 14 bytes of text files, 14 + 16 + 15 + 5 of HTML pages' text (with a final newline)
    assert printed == (f"[andrea-exp] wrote {out}/: 9 documents, 142 bytes from 9 Debian packages: python -m "
                       f"andrea_exp.prepare {out} --out {out}-bpe --tokenizer bpe --split documents "
                       "--val-fraction 0.05\n")
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.txt"))
    assert names == [
        "debian-handbook/usr/share/doc/debian-handbook/html/en-US/apt.html.txt",
        "git-doc/usr/share/doc/git-doc/git-commit.txt",
        "linux-source-6.1/linux-source-6.1/Documentation/process/howto.rst.txt",
        "perl-doc/usr/share/perl/5.36/pod/perlfunc.pod.txt",
        "postgresql-doc-15/usr/share/doc/postgresql-doc-15/html/tutorial.html.txt",
        "python-django-doc/usr/share/doc/python-django-doc/html/intro/index.html.txt",
        "python3.11-doc/usr/share/doc/python3.11/html/_sources/tutorial/index.rst.txt",
        "sqlite3-doc/usr/share/doc/sqlite3/atomiccommit.html.txt",
        "vim-runtime/usr/share/vim/vim90/doc/usr_01.txt",
    ]


def test_the_measured_version_is_fetched_where_the_archive_serves_it(tmp_path):
    """Through the real apt-get: a version the archive does not serve falls back to the one apt's lists name;
    a version it serves is the one fetched (here: the fallback's own version, asked for by number)."""
    if shutil.which("apt-get") is None:
        pytest.skip("no apt-get on this machine")
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    try:
        deb = corpora.debian_package("hello", first, version="0.0-not-in-the-archive")
    except ConfigError as err:
        pytest.skip(f"Debian's archive is not reachable here: {err}")
    version = debian.version(deb)
    assert version != "0.0-not-in-the-archive"
    again = corpora.debian_package("hello", second, version=version)
    assert debian.version(again) == version and again.read_bytes() == deb.read_bytes()
