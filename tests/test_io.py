"""Outputs onto links, FIFOs and devices (xla_streams._io, and the command line's -o).

A symlink is written through: the link stays, its target is replaced atomically
(a new file renamed over it). A FIFO or a character device is written into, never
replaced by a regular file; a FIFO nobody reads is an error (exit 2), not a hang.
Everything here lives in tmp_path: no test touches /dev.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import hlo_module

from xla_streams._io import atomic_write, atomic_write_many

MODULE = hlo_module(
    "HloModule m, is_scheduled=true, num_partitions=2",
    """\
ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %s = f32[8]{0} all-reduce-start(%p), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add
  %w = f32[8]{0} exponential(%p)
  %d = f32[8]{0} all-reduce-done(%s)
  ROOT %r = f32[8]{0} add(%d, %w)
}
""",
)


def xla_streams(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xla_streams", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# -- symlinks --------------------------------------------------------------------------


def test_a_symlink_stays_a_link_and_its_target_is_replaced_atomically(tmp_path: Path) -> None:
    target = tmp_path / "real" / "out.hlo"
    target.parent.mkdir()
    target.write_text("old\n")
    target.chmod(0o640)
    before = target.stat().st_ino
    link = tmp_path / "link.hlo"
    link.symlink_to(target)

    atomic_write(link, "new\n")

    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"
    # Renamed over the target (a new inode: a reader sees the old file or the new one,
    # never half of it), with the target's permissions kept.
    assert target.stat().st_ino != before
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert leftovers(tmp_path) == [] and leftovers(target.parent) == []


def test_a_relative_symlink_chain_is_followed_to_the_end(tmp_path: Path) -> None:
    (tmp_path / "final.txt").write_text("old")
    (tmp_path / "middle").symlink_to("final.txt")
    (tmp_path / "first").symlink_to("middle")
    atomic_write(tmp_path / "first", "new")
    assert (tmp_path / "first").is_symlink() and (tmp_path / "middle").is_symlink()
    assert (tmp_path / "final.txt").read_text() == "new"


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "made.txt")
    atomic_write(link, "made")
    assert link.is_symlink() and (tmp_path / "made.txt").read_text() == "made"


@pytest.mark.slow
def test_the_cli_writes_through_a_symlinked_output(tmp_path: Path) -> None:
    source = tmp_path / "in.hlo"
    source.write_text(MODULE)
    target = tmp_path / "target.hlo"
    target.write_text("old")
    link = tmp_path / "out.hlo"
    link.symlink_to(target)
    json_target = tmp_path / "target.json"
    json_link = tmp_path / "out.json"
    json_link.symlink_to(json_target)

    result = xla_streams("assign", source, "--streams=2", "-o", link, "--json", json_link)

    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and json_link.is_symlink()
    assert '_xla_stream_annotation="0"' in target.read_text()
    assert json_target.read_text().startswith("{")


# -- FIFOs -----------------------------------------------------------------------------


def test_a_fifo_with_a_reader_gets_the_data_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # A reader is there before the write (opened without waiting for a writer);
    # the payload fits the pipe's buffer, so nothing needs a second thread.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        atomic_write(fifo, "through the fifo\n")
        os.set_blocking(reader, True)
        assert os.read(reader, 1 << 16) == b"through the fifo\n"
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_the_cli_writes_into_a_fifo_with_a_reader(tmp_path: Path) -> None:
    source = tmp_path / "in.hlo"
    source.write_text(MODULE)
    fifo = tmp_path / "module.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        result = xla_streams("opt", source, "-p", "", "-o", fifo)
        assert result.returncode == 0, result.stderr
        os.set_blocking(reader, True)
        received = b""
        while chunk := os.read(reader, 1 << 16):
            received += chunk
    finally:
        os.close(reader)
    assert received.decode() == MODULE
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_nobody_reads_is_an_error_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as err:
        atomic_write(fifo, "nobody reads this")
    assert err.value.errno == errno.ENXIO
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.slow
def test_the_cli_says_nobody_reads_the_fifo_and_exits_2(tmp_path: Path) -> None:
    source = tmp_path / "in.hlo"
    source.write_text(MODULE)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)

    result = xla_streams("opt", source, "-p", "", "-o", fifo)

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"cannot write '{fifo}'" in result.stderr
    assert "nothing is reading" in result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_nobody_reads_leaves_the_other_outputs_unwritten(tmp_path: Path) -> None:
    """All or nothing holds with a FIFO among the outputs: it is opened (and found
    unread) before any file is renamed into place."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    other = tmp_path / "out.json"
    other.write_text("old")
    with pytest.raises(OSError):
        atomic_write_many([(other, "new"), (fifo, "data")])
    assert other.read_text() == "old"
    assert leftovers(tmp_path) == []


# -- character devices -----------------------------------------------------------------


def _null_device(tmp_path: Path) -> Path:
    """A character device (1, 3), the kernel's null, made inside tmp_path, or a skip."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError as e:  # a container without CAP_MKNOD
        pytest.skip(f"cannot make a device node here: {e}")
    return node


def test_a_character_device_is_written_into_and_stays_a_device(tmp_path: Path) -> None:
    node = _null_device(tmp_path)
    atomic_write(node, "discarded\n")
    st = os.lstat(node)
    assert stat.S_ISCHR(st.st_mode)
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_the_cli_writes_into_a_character_device(tmp_path: Path) -> None:
    node = _null_device(tmp_path)
    source = tmp_path / "in.hlo"
    source.write_text(MODULE)
    json_out = tmp_path / "out.json"
    result = xla_streams("assign", source, "--streams=2", "-o", node, "--json", json_out)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert json_out.read_text().startswith("{")
