"""mixle.utils.files: FIFOs, devices, sockets and directories are refused before a read."""

from __future__ import annotations

import os
import socket

import pytest

from mixle import SpecialFileError
from mixle.utils.files import open_regular_file, read_regular_file, require_regular_file


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
    for call in (require_regular_file, open_regular_file, read_regular_file):
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
