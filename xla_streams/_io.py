"""Writing files so that a reader never sees a half-written one.

Each file is written to a temporary file in the destination's own folder and
then moved over the destination with ``os.replace``, which is atomic on POSIX
and Windows when both names are on one file system (the same folder is). On any
error the temporary files are removed and the destinations are left as they
were: absent if they were absent, unchanged if they existed.

Imports only ``os`` and ``stat``, which every Python process has loaded already: the
command line writes its outputs with this, and its start-up time counts.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text is encoded as UTF-8) to ``path`` atomically."""
    atomic_write_many([(path, data)])


def atomic_write_many(items: Iterable[tuple[str | os.PathLike[str], str | bytes]]) -> None:
    """Write several files, none of them unless every one could be staged.

    All temporary files are written and flushed first; only then are they moved
    into place, so an error while writing any of them (a missing folder, a full
    disk) leaves every destination untouched. The moves themselves can only fail
    for reasons that would also have failed the staging, in practice never.
    """
    staged: list[tuple[str, str]] = []
    through: list[tuple[int, str | bytes]] = []  # (open descriptor, data)
    try:
        for path, data in items:
            # A link is written through, to its target (replacing the link would cut
            # it); a device or FIFO is written into, never replaced by a file. It is
            # opened now, so that one nobody reads fails before any file is moved.
            target = os.path.realpath(os.fspath(path))
            if _is_special(target):
                through.append((_open_into(target), data))
            else:
                staged.append((_stage(target, data), target))
        for temporary, target in staged:
            os.replace(temporary, target)
    except BaseException:
        for temporary, _ in staged:
            _remove(temporary)
        for fd, _ in through:
            os.close(fd)
        raise
    try:
        for fd, data in through:
            _write_into(fd, data)
    finally:
        for fd, _ in through:
            os.close(fd)


def _is_special(path: str) -> bool:
    """True for an existing file that is neither regular nor a folder (a device, a FIFO)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _open_into(target: str) -> int:
    """Open a device or FIFO for writing, as a shell redirection would; a FIFO nobody
    reads is an error (ENXIO), not a hang."""
    fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
    os.set_blocking(fd, True)
    return fd


def _write_into(fd: int, data: str | bytes) -> None:
    payload = data.encode("utf-8") if isinstance(data, str) else data
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]


def _stage(target: str, data: str | bytes) -> str:
    """Write ``data`` to a new file beside ``target``; return the file's name."""
    folder, base = os.path.split(target)
    if not base:
        raise IsADirectoryError(f"not a file name: '{target}'")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    existing_mode = _mode_of(target)
    while True:
        temporary = os.path.join(folder, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            # 0o666 lets the umask decide, as for any file the user creates.
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # pragma: no cover - a 32-bit random collision
            continue
        except OSError as e:  # name the file the caller asked for, not the temporary
            raise OSError(e.errno, e.strerror, target) from e
        break
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        if existing_mode is not None:
            os.chmod(temporary, existing_mode)  # replacing a file keeps its permissions
    except BaseException as e:
        _remove(temporary)
        if isinstance(e, OSError):
            raise OSError(e.errno, e.strerror, target) from e
        raise
    return temporary


def _remove(temporary: str) -> None:
    try:  # noqa: SIM105 - not contextlib.suppress: contextlib is one more import
        os.unlink(temporary)
    except OSError:
        pass


def _mode_of(path: str) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"'{path}' is a directory")
    return stat.S_IMODE(st.st_mode)
