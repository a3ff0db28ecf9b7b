"""The hand-off socket between front-end workers and the store's process (plugmq.server.handoff).

Frames cut anywhere by the byte stream come out whole and in order; the frames one read brings
are stored with one store call and each is answered with its own calls' responses (also when the
store answers later, and when it fails); when the owner goes away, every call in flight fails
with a status that says the message may or may not be stored, and the next send is refused."""

from __future__ import annotations

import asyncio
import marshal
import socket
import struct
import sys
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("grpc", reason="needs the serve extra (grpcio)")

from plugmq.server.auth import Authenticator
from plugmq.server.handoff import HandoffClient, StoreCalls, _frame, _Frames, encode_call, serve_handoff
from plugmq.server.options import AclOptions
from plugmq.server.protocol import Code, MessageType, service_pb2
from plugmq.server.send import CheckedSend, SendRequest, check_send
from plugmq.server.status import RpcFailure

_HEADER = struct.Struct(">I")


class _Collected(_Frames):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[list[Any]] = []

    def received(self, frames: list[Any]) -> None:
        self.reads.append(frames)


_VALUES = st.lists(st.tuples(st.integers(0, 1 << 40), st.lists(st.binary(max_size=300) | st.text(max_size=40),
                                                                max_size=5)), min_size=1, max_size=8)


@settings(max_examples=80, deadline=None)
@given(_VALUES, st.data())
def test_frames_cut_anywhere_come_out_whole_and_in_order(values: list[Any], data: st.DataObject) -> None:
    stream = b"".join(_frame(value) for value in values)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    frames = _Collected()
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        if end > start:
            frames.data_received(stream[start:end])
    assert [value for read in frames.reads for value in read] == values
    assert all(read for read in frames.reads)  # a read that completes no frame calls nobody


def _checked(message_id: str, topic: str = "Handed") -> CheckedSend:
    request = service_pb2.SendMessageRequest()
    message = request.messages.add(body=message_id.encode())
    message.topic.name = topic
    message.system_properties.message_id = message_id
    message.system_properties.message_type = MessageType.NORMAL
    return check_send(SendRequest(request.messages, None, "client-1"), Authenticator(AclOptions()), 1 << 20)


def _answer(call: CheckedSend) -> bytes:
    response = service_pb2.SendMessageResponse(status={"code": Code.OK})
    for item in call.items:
        response.entries.add(message_id=item.message_id)
    return response.SerializeToString()


def _exchange(store: StoreCalls, frames: list[tuple[int, list[Any]]]) -> list[tuple[int, list[bytes]]]:
    """An owner's end with ``store``; ``frames`` written to it in one write (as a busy front-end's
    reach a busy owner); the answer frames it writes back."""
    async def run(path: str) -> list[tuple[int, list[bytes]]]:
        server = await serve_handoff(path, store)
        try:
            return await asyncio.to_thread(_write_and_read, path, b"".join(_frame(frame) for frame in frames),
                                           len(frames))
        finally:
            server.close()
            await server.wait_closed()

    with tempfile.TemporaryDirectory() as tmp:
        return asyncio.run(run(str(Path(tmp) / "sends.sock")))


def _write_and_read(path: str, payload: bytes, count: int) -> list[tuple[int, list[bytes]]]:
    answers: list[tuple[int, list[bytes]]] = []
    buffer = b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(payload)
        while len(answers) < count:
            chunk = sock.recv(1 << 16)
            assert chunk, "the owner closed the connection"
            buffer += chunk
            while len(buffer) >= _HEADER.size and len(buffer) >= _HEADER.size + _HEADER.unpack_from(buffer)[0]:
                end = _HEADER.size + _HEADER.unpack_from(buffer)[0]
                answers.append(marshal.loads(buffer[_HEADER.size:end]))
                buffer = buffer[end:]
    return answers


def _ids(response: bytes) -> list[str]:
    return [entry.message_id for entry in service_pb2.SendMessageResponse.FromString(response).entries]


@pytest.mark.parametrize("later", [False, True], ids=["on the loop", "answered later"])
def test_the_frames_of_one_read_are_stored_together_and_each_answered(later: bool) -> None:
    """Three frames written at once (a busy front-end's, as the owner reads them when behind) go
    to one store call, in order; each frame gets back exactly its own calls' answers."""
    stores: list[list[str]] = []

    def store(calls: list[CheckedSend]) -> list[bytes] | Awaitable[list[bytes]]:
        stores.append([item.message_id for call in calls for item in call.items])
        answers = [_answer(call) for call in calls]
        if not later:
            return answers

        async def stored() -> list[bytes]:
            await asyncio.sleep(0)
            return answers
        return stored()

    answers = _exchange(store, [(7, [encode_call(_checked("a")), encode_call(_checked("b"))]),
                                (8, [encode_call(_checked("c"))]), (9, [encode_call(_checked("d"))])])
    assert [frame_id for frame_id, _responses in answers] == [7, 8, 9]
    assert [[_ids(r) for r in responses] for _id, responses in answers] == [[["a"], ["b"]], [["c"]], [["d"]]]
    assert [id_ for batch in stores for id_ in batch] == ["a", "b", "c", "d"]
    assert len(stores) == 1  # one write of a few hundred bytes is one read on the owner: one store call


def test_a_store_that_fails_answers_every_call_of_the_read() -> None:
    def store(calls: list[CheckedSend]) -> list[bytes]:
        raise OSError("No space left on device")

    answers = _exchange(store, [(1, [encode_call(_checked("x"))]), (2, [encode_call(_checked("y"))] * 2)])
    assert [(frame_id, len(responses)) for frame_id, responses in answers] == [(1, 1), (2, 2)]
    for _frame_id, responses in answers:
        for raw in responses:
            status = service_pb2.SendMessageResponse.FromString(raw).status
            assert status.code == Code.INTERNAL_SERVER_ERROR and "No space left on device" in status.message


_OWNER = """
import asyncio, sys
from plugmq.server.handoff import serve_handoff

async def main():
    def store(calls):
        print("storing", len(calls), flush=True)
        return asyncio.get_running_loop().create_future()  # never answered: killed first
    await serve_handoff(sys.argv[1], store)
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_a_front_end_fails_its_calls_in_flight_when_the_owner_is_killed() -> None:
    """The owner is SIGKILLed while a call waits for its store: the call fails and says the
    message may or may not be stored, the client reports the owner gone, no later send is taken."""
    async def run(path: str) -> None:
        owner = await asyncio.create_subprocess_exec(sys.executable, "-c", _OWNER, path, stdout=asyncio.subprocess.PIPE)
        assert owner.stdout is not None
        try:
            assert await asyncio.wait_for(owner.stdout.readline(), 30) == b"ready\n"
            client = await HandoffClient.connect(path)
            first = client.send(_checked("in-flight"))
            assert await asyncio.wait_for(owner.stdout.readline(), 30) == b"storing 1\n"
            owner.kill()
            with pytest.raises(RpcFailure) as failed:
                await asyncio.wait_for(first, 30)
            assert failed.value.code == Code.INTERNAL_SERVER_ERROR and "may or may not be stored" in str(failed.value)
            await asyncio.wait_for(asyncio.shield(client.closed), 30)
            with pytest.raises(RpcFailure, match="cannot be reached"):
                client.send(_checked("after"))
            await client.close()
        finally:
            if owner.returncode is None:
                owner.kill()
            await owner.wait()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(str(Path(tmp) / "sends.sock")))
