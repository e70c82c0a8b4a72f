"""The error every module raises for a bad setting or bad input data: its message is the one line the user sees;
and the one line for a failure of the file system (a full disk, a directory that cannot be written).

A module of its own so that the data checks, the schema, the settings validation, the command line and the
report can all use them without importing one another."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


class ConfigError(ValueError):
    """A bad setting; its message is the one line the user sees."""


def describe_os_error(err: OSError) -> str:
    """One line naming the path and the cause: `cannot write /x/metrics.jsonl: No space left on device`.
    The first OSError of a chain that names a file is the cause (a full disk also fails the summary written
    after it, through a temporary file that names nothing)."""
    chain = [err]
    while isinstance(chain[-1].__context__, OSError):
        chain.append(chain[-1].__context__)
    err = next((e for e in reversed(chain) if e.filename is not None), err)
    cause = err.strerror or str(err) or type(err).__name__
    if err.filename is None:
        return f"{type(err).__name__}: {cause}"
    verb = "write" if err.errno in WRITE_ERRNOS else "read" if err.errno == errno.ENOENT else "access"
    target = f"{err.filename} -> {err.filename2}" if err.filename2 else str(err.filename)
    return f"cannot {verb} {target}: {cause}"


def unwritable(where: Path) -> OSError | None:
    """Why the directory `where` (there or still to be made) cannot be written, or None: tested on its nearest
    part that exists by creating a temporary file there, so nothing is left behind."""
    existing = Path(where).expanduser().absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:  # named by the directory tested: the temporary file's name means nothing to a user
        named = type(err)(err.errno, err.strerror or str(err), str(existing))
        return named
    return None


def describe_unwritable(err: OSError) -> str:
    """unwritable()'s error as words: `no file can be created in /proc (No such file or directory)`."""
    return f"no file can be created in {err.filename} ({err.strerror or type(err).__name__})"
