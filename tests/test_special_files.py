"""mixle.utils.files: FIFOs, devices, sockets and directories are refused before a read."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from mixle import SpecialFileError
from mixle.utils.files import (
    open_regular_fd,
    open_regular_file,
    read_fd,
    read_fd_into,
    read_regular_file,
    require_regular_file,
)


def test_a_regular_file_reads(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    assert require_regular_file(path).st_size == 3
    with open_regular_file(path) as file:
        assert file.read() == b"abc"
    assert read_regular_file(path, limit=3) == b"abc"


def test_a_file_over_the_limit_is_refused(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"abcd")
    with pytest.raises(ValueError, match=r"'.*f\.bin' is larger than 3 bytes"):
        read_regular_file(path, "header", limit=3)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "chunk"
    os.mkfifo(fifo)
    for call in (require_regular_file, open_regular_file, open_regular_fd, read_regular_file):
        with pytest.raises(SpecialFileError, match=r"chunk '.*chunk' is a FIFO"):
            call(fifo, "chunk")


def test_a_symlink_to_dev_zero_is_refused_as_a_device(tmp_path):
    link = tmp_path / "c.0"
    link.symlink_to("/dev/zero")
    with pytest.raises(SpecialFileError, match="character device"):
        read_regular_file(link, "chunk")
    with pytest.raises(OSError, match="character device"):  # SpecialFileError is an OSError
        open_regular_file(link)


def test_a_directory_and_a_socket_are_refused(tmp_path):
    with pytest.raises(SpecialFileError, match="a directory"):
        open_regular_file(tmp_path)
    sock_path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(SpecialFileError, match="a socket"):
            require_regular_file(sock_path)
        with pytest.raises(SpecialFileError, match="a socket"):  # open() itself: ENXIO
            open_regular_file(sock_path)


def test_a_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        open_regular_file(tmp_path / "absent")


def test_a_descriptor_reads_the_whole_file_and_shows_one_that_grew(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")
    fd, info = open_regular_fd(path)
    try:
        assert info.st_size == 10
        view = memoryview(bytearray(11))  # one byte over the size fstat gave
        assert read_fd_into(fd, view, 10) == 10 and bytes(view[:10]) == b"0123456789"
        os.lseek(fd, 0, os.SEEK_SET)
        assert read_fd(fd, 11, 10) == b"0123456789"
        # a file larger than fstat said (it grew): the byte over shows it
        os.lseek(fd, 0, os.SEEK_SET)
        assert read_fd_into(fd, memoryview(bytearray(6)), 5) == 6
        os.lseek(fd, 0, os.SEEK_SET)
        assert read_fd(fd, 6, 5) == b"012345"
        # an empty file (fstat said 0 bytes) reads nothing
        assert read_fd_into(fd, memoryview(bytearray(1)), 0) == 0
        assert read_fd(fd, 1, 0) == b""
    finally:
        os.close(fd)


def _write_and_close(fd: int, data: bytes) -> None:
    os.write(fd, data)
    os.close(fd)


def test_a_descriptor_that_would_block_is_made_blocking_and_read(tmp_path):
    # a file system honouring O_NONBLOCK on regular files is stood in for by a pipe
    def into(fd: int) -> bytes:
        buf = bytearray(4)
        return bytes(buf[: read_fd_into(fd, memoryview(buf), 3)])

    for read in (into, lambda fd: read_fd(fd, 4, 3)):
        rd, wr = os.pipe()
        os.set_blocking(rd, False)
        late = threading.Timer(0.2, _write_and_close, (wr, b"abc"))
        late.start()
        try:
            assert read(rd) == b"abc"
            assert os.get_blocking(rd)
        finally:
            late.join()
            os.close(rd)


def test_a_descriptor_is_closed_when_the_file_is_refused(tmp_path):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(SpecialFileError):
            open_regular_fd(fifo)
    assert len(os.listdir("/proc/self/fd")) == before
