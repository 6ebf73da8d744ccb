"""The node daemon's frames and socket location (``perseus_common.gpud_wire``), for both ends.

Frames go through a real Unix socket pair: what one end encodes, the other reads back whole, in
pieces or not at all when the length is over the bound.
"""

from __future__ import annotations

import socket
import threading

import pytest

from perseus_common.gpud_wire import (
    DEFAULT_SOCKET,
    HEADER_SIZE,
    MAX_FRAME,
    SOCKET_ENV,
    FrameTooLargeError,
    encode_frame,
    frame_size,
    read_frame,
    socket_path,
)
from perseus_common.proto import gpud_pb2


def test_a_message_framed_at_one_end_is_read_whole_at_the_other() -> None:
    request = gpud_pb2.Request(id=7, set_clock=gpud_pb2.SetClock(uuid="GPU-1", mhz=1005))
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        frame = encode_frame(request.SerializeToString())
        sender = threading.Thread(
            target=lambda: [a.sendall(frame[i : i + 3]) for i in range(0, len(frame), 3)]
        )
        sender.start()  # three bytes at a time: the reader waits for the rest
        body = read_frame(b)
        sender.join()
        a.sendall(encode_frame(b""))
        assert read_frame(b) == b""  # an empty message is a frame too
    assert gpud_pb2.Request.FromString(body) == request
    assert frame[:HEADER_SIZE] == len(body).to_bytes(4, "big")


def test_a_frame_over_the_bound_is_refused_at_both_ends() -> None:
    with pytest.raises(FrameTooLargeError, match=f"{MAX_FRAME + 1} bytes"):
        encode_frame(b"x" * (MAX_FRAME + 1))
    assert len(encode_frame(b"x" * MAX_FRAME)) == HEADER_SIZE + MAX_FRAME
    with pytest.raises(FrameTooLargeError) as refused:
        frame_size((MAX_FRAME + 1).to_bytes(4, "big"))
    assert refused.value.size == MAX_FRAME + 1


def test_a_stream_that_ends_inside_a_frame_is_an_error() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with b:
        a.sendall(encode_frame(b"abcdef")[:-2])
        a.close()
        with pytest.raises(ConnectionError):
            read_frame(b)


def test_the_socket_is_the_explicit_one_else_the_environments_else_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    assert socket_path() == DEFAULT_SOCKET == "/run/perseus/gpud.sock"
    monkeypatch.setenv(SOCKET_ENV, "/tmp/env.sock")
    assert socket_path() == "/tmp/env.sock"
    assert socket_path("/tmp/given.sock") == "/tmp/given.sock"
    monkeypatch.setenv(SOCKET_ENV, "")
    assert socket_path() == DEFAULT_SOCKET
