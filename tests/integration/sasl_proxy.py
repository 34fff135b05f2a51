"""SASL/PLAIN authentication in front of a broker that cannot do it here.

Tansu 0.6.0 refuses SASL unless started with ``--authentication``, and its ``user create``
stores no credential (the broker then answers "unknown-user"). So, as socat does for TLS, this
process terminates SASL in front of it: it answers the SaslHandshake and SaslAuthenticate
requests itself, checking the password, and then pipes the connection to the broker untouched.
The broker advertises this proxy's port. A wrong password gets SASL_AUTHENTICATION_FAILED, and
nothing else passes before authentication.

Run: python sasl_proxy.py LISTEN_PORT BROKER_PORT USER (the password on stdin).
"""

from __future__ import annotations

import asyncio
import struct
import sys

SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 17, 36, 18
AUTHENTICATION_FAILED, UNSUPPORTED_MECHANISM, ILLEGAL_STATE = 58, 33, 34


async def _frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def _send(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(struct.pack(">i", len(payload)) + payload)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _header(frame: bytes) -> tuple[int, int, int, int]:
    """(api key, api version, correlation id, offset of the body) of a non-flexible header."""
    key, version, correlation = struct.unpack(">hhi", frame[:8])
    (client_len,) = struct.unpack(">h", frame[8:10])
    return key, version, correlation, 10 + max(client_len, 0)


def _auth_bytes(frame: bytes, version: int, body: int) -> bytes:
    if version >= 2:  # flexible: tagged fields after the header, compact bytes
        tags, at = _varint(frame, body)
        for _ in range(tags):
            _, at = _varint(frame, at)
            size, at = _varint(frame, at)
            at += size
        size, at = _varint(frame, at)
        return frame[at:at + size - 1]
    (size,) = struct.unpack(">i", frame[body:body + 4])
    return frame[body + 4:body + 4 + size]


def _authenticate_reply(correlation: int, version: int, error: int, message: str | None) -> bytes:
    text = None if message is None else message.encode()
    if version >= 2:
        out = struct.pack(">i", correlation) + b"\x00" + struct.pack(">h", error)
        out += b"\x00" if text is None else bytes([len(text) + 1]) + text
        out += b"\x01"  # empty auth bytes
        return out + struct.pack(">q", 0) + b"\x00"
    out = struct.pack(">ih", correlation, error)
    out += struct.pack(">h", -1) if text is None else struct.pack(">h", len(text)) + text
    out += struct.pack(">i", 0)
    return out + (struct.pack(">q", 0) if version >= 1 else b"")


async def _session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   broker_port: int, user: str, password: str) -> None:
    upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", broker_port)
    try:
        while True:  # until authenticated: ApiVersions passes, SASL is answered here
            frame = await _frame(reader)
            key, version, correlation, body = _header(frame)
            if key == API_VERSIONS:
                _send(upstream_w, frame)
                _send(writer, await _frame(upstream_r))
            elif key == SASL_HANDSHAKE:
                (size,) = struct.unpack(">h", frame[body:body + 2])
                mechanism = frame[body + 2:body + 2 + size].decode()
                error = 0 if mechanism == "PLAIN" else UNSUPPORTED_MECHANISM
                _send(writer, struct.pack(">ihi", correlation, error, 1)
                      + struct.pack(">h", 5) + b"PLAIN")
            elif key == SASL_AUTHENTICATE:
                _, given_user, given_password = _auth_bytes(frame, version, body).split(b"\0", 2)
                ok = (given_user.decode(), given_password.decode()) == (user, password)
                _send(writer, _authenticate_reply(
                    correlation, version, 0 if ok else AUTHENTICATION_FAILED,
                    None if ok else "Authentication failed: invalid username or password"))
                await writer.drain()
                if not ok:
                    return
                break
            else:
                return  # nothing passes before authentication
            await writer.drain()

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(1 << 16):
                dst.write(data)
                await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, upstream_w), pipe(upstream_r, writer))
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        upstream_w.close()
        writer.close()


async def main() -> None:
    listen_port, broker_port, user = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    password = sys.stdin.readline().rstrip("\n")
    server = await asyncio.start_server(
        lambda r, w: _session(r, w, broker_port, user, password), "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
