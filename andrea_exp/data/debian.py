"""Text documents read out of Debian binary packages (.deb), as `apt-get download` fetches them.

A package's files are streamed from `dpkg-deb --fsys-tarfile` (nothing is installed or unpacked to disk);
a tar archive inside the package (linux-source's tree) is streamed in turn. HTML pages become plain text
with the standard library's parser: the text outside <head>, <script> and <style>, with a line break at
each block element.
"""

from __future__ import annotations

import fnmatch
import html.parser
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from andrea_exp.config.errors import ConfigError


@dataclass(frozen=True)
class Select:
    """Which files of a package make documents."""

    members: tuple[str, ...]  # globs of paths inside the package (or inside `inner`), any of them
    exclude: tuple[str, ...] = ()  # globs of paths left out
    inner: str | None = None  # a tar archive inside the package whose own files are read instead
    html: bool = False  # the files are HTML pages, read as their text

    def wants(self, name: str) -> bool:
        return any(fnmatch.fnmatch(name, g) for g in self.members) and not any(
            fnmatch.fnmatch(name, g) for g in self.exclude)


_BLOCK = {"address", "blockquote", "br", "dd", "div", "dl", "dt", "figcaption", "h1", "h2", "h3", "h4", "h5", "h6",
          "hr", "li", "ol", "p", "pre", "section", "table", "td", "th", "title", "tr", "ul"}
_HIDDEN = {"head", "script", "style"}


class _Text(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag, attrs):
        if tag in _HIDDEN:
            self.hidden += 1
        elif tag in _BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in _HIDDEN:
            self.hidden = max(0, self.hidden - 1)
        elif tag in _BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.hidden:
            self.parts.append(data)


def html_text(page: bytes) -> bytes:
    """The page's text as UTF-8: trailing spaces dropped, at most one blank line in a row."""
    parser = _Text()
    parser.feed(page.decode("utf-8", errors="replace"))
    parser.close()
    text = re.sub(r"[ \t]+\n", "\n", "".join(parser.parts))
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    return (text + "\n").encode("utf-8") if text else b""


def version(deb: Path) -> str:
    return _dpkg_deb(["-f", str(deb), "Version"]).decode().strip()


def _need_dpkg_deb() -> None:
    if shutil.which("dpkg-deb") is None:
        raise ConfigError("reading a Debian package needs dpkg-deb (Debian's dpkg), which is not on PATH")


def _dpkg_deb(args: list[str]) -> bytes:
    _need_dpkg_deb()
    done = subprocess.run(["dpkg-deb", *args], capture_output=True)
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"dpkg-deb {' '.join(args)} failed: {last}")
    return done.stdout


def _files(tar: tarfile.TarFile) -> Iterator[tuple[str, tarfile.TarFile, tarfile.TarInfo]]:
    for member in tar:
        if member.isfile():
            yield member.name.removeprefix("./"), tar, member


def documents(deb: Path, select: Select) -> list[tuple[str, bytes]]:
    """(path, content) of the package's files chosen by `select`, in path order (HTML as its text)."""
    _need_dpkg_deb()
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    found, inner_seen = [], False
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as outer:
            for name, tar, member in _files(outer):
                if select.inner is None:
                    if select.wants(name):
                        found.append((name, tar.extractfile(member).read()))
                elif name == select.inner:
                    inner_seen = True
                    with tarfile.open(fileobj=tar.extractfile(member), mode="r|*") as inner:
                        found += [(n, t.extractfile(m).read()) for n, t, m in _files(inner) if select.wants(n)]
        proc.stdout.read()  # the tar's padding: dpkg-deb must not die writing to a closed pipe
    except (tarfile.TarError, EOFError) as err:
        proc.kill()
        raise ConfigError(f"cannot read {deb} as a Debian package: {err}") from None
    finally:
        proc.stdout.close()
        stderr = proc.stderr.read().decode(errors="replace").strip()
        proc.stderr.close()
        code = proc.wait()
    if code != 0:
        raise ConfigError(f"cannot read {deb} as a Debian package: {(stderr.splitlines() or ['dpkg-deb failed'])[-1]}")
    if select.inner is not None and not inner_seen:
        raise ConfigError(f"{deb} holds no {select.inner}")
    if select.html:
        found = [(name, html_text(page)) for name, page in found]
    return sorted(found)
