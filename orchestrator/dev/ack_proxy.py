"""The ack proxy: the embedded broker's advertised address, in front of its real listener.

Every client of the stack's broker talks to it through this process, which passes the bytes on
unchanged, with one exception: a Produce response is held until the ends it acknowledges are
durable in the ack ledger (ack_ledger.py). Acknowledgements that arrive together are synced
together, so the wait is one fsync per group, not per batch. A DeleteTopics response that
deleted a topic forgets its ends (a topic of that name starts again at offset 0) and notes the
deletion, with the topic's id read from the broker just before the request went on, durable
before the client hears of it, so that a restore after a crash does not bring the topic back
(unless the restore itself deleted it: its clients' ids say so).

Run as ``python -m orchestrator.dev.ack_proxy LISTEN_PORT BROKER_PORT LEDGER [HELD]``; `kappa
dev up` starts it. While the file HELD names a client id, only connections whose first request
carries it are passed on: a restore runs (held_clients.py). When the broker goes, its
connections close and so do the clients'; new ones are taken and closed until it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import struct
import sys
import time
from pathlib import Path

from orchestrator.dev.ack_ledger import AckLedger
from orchestrator.dev.held_clients import held_client_id
from orchestrator.failpoints import fail_point
from orchestrator.kafka import wire
from orchestrator.kafka.endpoint import RESTORE_CLIENT_ID_PREFIX

HOST = "127.0.0.1"
_SIZE = struct.Struct(">i")
_API_KEY = struct.Struct(">h")
_CONNECT_TIMEOUT_S = 5.0
_DRAIN_S = 5.0
# How long a deletion waits for the broker to name the ids of the topics it deletes; without
# them, the restore falls back to the deletion's time (archive_model/deletion.py).
_IDS_TIMEOUT_S = 5.0

log = logging.getLogger("kappa.ack_proxy")


class _Group:
    """One fsync for all the acknowledgements noted while the previous one ran."""

    def __init__(self, ledger: AckLedger):
        self.ledger = ledger
        self._waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()

    async def durable(self) -> None:
        # Even with nothing new noted: an end noted by another connection may be in the sync
        # that runs now, and the next one starts only after it.
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._wake.set()
        await waiter

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            waiters, self._waiters = self._waiters, []
            try:
                lines, snapshot = self.ledger.take()
                fail_point("ack_proxy.ledger_write")
                await loop.run_in_executor(None, self.ledger.write, lines, snapshot)
            except Exception as exc:
                # Nothing is acknowledged that is not noted: the producers' connections close,
                # and they retry. Any error, not only the disk's: this loop ending would leave
                # every later Produce unanswered while the proxy still looked alive.
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(exc)
                log.error("the ack ledger %s cannot be written: %s", self.ledger.path, exc)
                continue
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)


async def _frame(reader: asyncio.StreamReader) -> bytes:
    size = _SIZE.unpack(await reader.readexactly(4))[0]
    return await reader.readexactly(size)


class _Connection:
    def __init__(self, group: _Group, broker_port: int):
        self.group, self.broker_port = group, broker_port
        # correlation id -> Produce version and (topic, partition) -> offsets it takes
        self.produces: dict[int, tuple[int, dict[tuple[str, int], int]]] = {}
        # correlation id -> DeleteTopics version, whether a restore's client sent it, and the
        # ids of the topics it deletes as the broker named them just before
        self.deletes: dict[int, tuple[int, bool, dict[str, str]]] = {}

    async def requests(self, client: asyncio.StreamReader, broker: asyncio.StreamWriter,
                       first: bytes | None = None) -> None:
        while True:
            message, first = (first, None) if first is not None else (await _frame(client), None)
            api_key = _API_KEY.unpack_from(message)[0]
            if api_key == wire.PRODUCE:
                header, acks, counts = wire.produce_counts(message)
                if acks != 0:  # acks=0 gets no response, and promises nothing
                    self.produces[header.correlation_id] = (header.api_version, counts)
            elif api_key == wire.DELETE_TOPICS:
                header, _ = wire.request_header(message)
                # A version it cannot read closes the connection.
                topics = wire.deleted_topics(message)
                by_restore = (wire.request_client_id(message) or "").startswith(
                    RESTORE_CLIENT_ID_PREFIX)
                ids = {} if by_restore else await asyncio.get_running_loop().run_in_executor(
                    None, topic_ids, self.broker_port, topics)
                self.deletes[header.correlation_id] = (header.api_version, by_restore, ids)
            broker.write(_SIZE.pack(len(message)) + message)
            await broker.drain()

    async def responses(self, broker: asyncio.StreamReader, client: asyncio.StreamWriter
                        ) -> None:
        ledger = self.group.ledger
        while True:
            message = await _frame(broker)
            correlation_id = _SIZE.unpack_from(message)[0]
            produced = self.produces.pop(correlation_id, None)
            if produced is not None:
                version, counts = produced
                for ack in wire.produce_acks(message, version)[1]:
                    taken = counts.get((ack.topic, ack.partition), 0)
                    if ack.error_code == 0 and ack.base_offset >= 0 and taken:
                        ledger.note(ack.topic, ack.partition, ack.base_offset + taken)
                await self.group.durable()
                fail_point("ack_proxy.before_forward")
            deleting = self.deletes.pop(correlation_id, None)
            if deleting is not None:
                await self._note_deletions(message, *deleting)
            client.write(_SIZE.pack(len(message)) + message)
            await client.drain()


    async def _note_deletions(self, message: bytes, version: int, by_restore: bool,
                              ids: dict[str, str]) -> None:
        ledger = self.group.ledger
        at_ms = int(time.time() * 1000)
        deleted = [t for t, error in wire.delete_outcomes(message, version).items() if not error]
        for topic in deleted:
            # A topic a restore deleted (to restore it again) is the archive's still.
            if by_restore:
                ledger.forget(topic)
            else:
                ledger.deleted(topic, at_ms, ids.get(topic))
        if deleted:
            await self.group.durable()


def topic_ids(broker_port: int, topics: list[str]) -> dict[str, str]:
    """The ids the broker gives ``topics`` now; those it could not name are left out (a
    deletion then falls back to its time)."""
    from orchestrator.errors import KappaError
    from orchestrator.kafka.admin import log_identity

    try:
        found = log_identity(f"{HOST}:{broker_port}", topics, timeout_s=_IDS_TIMEOUT_S)
    except KappaError as exc:
        log.warning("the broker did not name the ids of %s (%s): their deletion is noted with "
                    "its time only", ", ".join(topics), exc)
        return {}
    return {topic: topic_id for topic, topic_id in found.topics.items() if topic_id}


async def _serve(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                 broker_port: int, group: _Group, held: Path | None = None) -> None:
    first = None
    allowed = held_client_id(held) if held is not None else None
    if allowed is not None:
        # A restore runs (held_clients.py): only its own clients may reach the broker.
        try:
            first = await asyncio.wait_for(_frame(client_reader), _CONNECT_TIMEOUT_S)
            client_id = wire.request_client_id(first)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, wire.WireError):
            client_id = None
        if client_id != allowed:
            log.info("held off a client (%s) while the restore runs", client_id)
            client_writer.close()
            return
    try:
        broker_reader, broker_writer = await asyncio.wait_for(
            asyncio.open_connection(HOST, broker_port), _CONNECT_TIMEOUT_S)
    except (TimeoutError, OSError):
        client_writer.close()
        return
    connection = _Connection(group, broker_port)
    requests = asyncio.create_task(connection.requests(client_reader, broker_writer, first))
    responses = asyncio.create_task(connection.responses(broker_reader, client_writer))
    await asyncio.wait((requests, responses), return_when=asyncio.FIRST_COMPLETED)
    if not responses.done():
        # The client left, or the broker went: what the broker answered before still reaches
        # the client, so that it is told of every acknowledgement the ledger holds.
        with contextlib.suppress(OSError, RuntimeError):
            broker_writer.write_eof()
        await asyncio.wait((responses,), timeout=_DRAIN_S)
    for task in (requests, responses):
        task.cancel()
    for ended in await asyncio.gather(requests, responses, return_exceptions=True):
        if isinstance(ended, wire.WireError):
            log.error("closing a connection on a message not understood: %s", ended)
    broker_writer.close()
    await _close_after_the_client_read(client_reader, client_writer)


async def _close_after_the_client_read(reader: asyncio.StreamReader,
                                       writer: asyncio.StreamWriter) -> None:
    # A socket closed with requests still unread in it sends a reset, and the client's kernel
    # then drops the responses the client had not read yet: acknowledgements the ledger holds
    # would never reach the producer. Half-close instead, and read until the client closes.
    try:
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(_DRAIN_S):
                while await reader.read(1 << 16):
                    pass
    finally:
        writer.close()


async def serve(listen_port: int, broker_port: int, ledger_path: Path,
                held: Path | None = None) -> None:
    group = _Group(AckLedger(ledger_path))
    server = await asyncio.start_server(
        lambda r, w: _serve(r, w, broker_port, group, held), HOST, listen_port,
        reuse_address=True, limit=1 << 20)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    flusher = asyncio.create_task(group.run())
    async with server:
        # A sync loop that ended anyway ends the proxy: `kappa dev status` then shows it gone,
        # rather than a proxy that holds every Produce for ever.
        await asyncio.wait((asyncio.create_task(stopping.wait()), flusher),
                           return_when=asyncio.FIRST_COMPLETED)
    if flusher.done():
        raise RuntimeError(f"the ack ledger's sync loop ended: {flusher.exception()!r}")
    flusher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flusher
    group.ledger.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    listen_port, broker_port, ledger = int(argv[0]), int(argv[1]), Path(argv[2])
    held = Path(argv[3]) if len(argv) > 3 else None
    asyncio.run(serve(listen_port, broker_port, ledger, held))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
