#!/usr/bin/env python3
"""Writes the seed corpora of the store fuzz targets: fuzz/corpus/store_server/ and
fuzz/corpus/store_client/, a few valid and invalid sessions each, in the schedules that
store_server_fuzz.cc and store_client_fuzz.cc read. Run from anywhere; the files are
checked in, so this is only needed when the formats change."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = b"fuzz-token"

# Ops and statuses (src/rendezvous/tcp_wire.h).
HELLO, SET, GET, ADD, CAS, WAIT, CHECK, DELETE, NUM_KEYS = range(9)
OK, REFUSED, NOT_FOUND, TIMEOUT, ERROR = range(5)


def u32(v):
    return struct.pack("<I", v)


def i64(v):
    return struct.pack("<q", v)


def s(b):
    return u32(len(b)) + b


def strs(items):
    return u32(len(items)) + b"".join(s(i) for i in items)


def frame(body):
    return u32(len(body)) + body


PROOF = 9  # names the reply to the client's proof (Op::kProof)


def hello():
    """A version-2 hello (Note [Handshake]): nonce and run digest; its bytes need not verify."""
    return frame(b"DPST" + bytes([2]) + s(b"\xc1" * 16) + s(b"\x00" * 32))


def hello_v1(token):
    return frame(b"DPST" + bytes([1]) + s(token))


# store_server_fuzz.cc's schedule.
def connect():
    return bytes([0])


def receive(slot, data):
    out = b""
    while data:  # command 2 takes up to 65535 bytes at once
        piece, data = data[:65535], data[65535:]
        out += bytes([2, slot, len(piece) & 255, len(piece) >> 8]) + piece
    return out


def send_all(slot):
    return bytes([3, slot, 0])


def disconnect(slot):
    return bytes([4, slot])


def tick(steps):
    return bytes([5, steps])


def good_hello(slot):
    return bytes([6, slot])


def bad_hello(slot, variant=0):
    return bytes([7, slot, variant])


def request(op, body=b""):
    return frame(bytes([op]) + body)


SERVER = {
    "every_op": connect() + good_hello(0) + receive(0, request(SET, s(b"k") + s(b"v"))
                + request(GET, s(b"k")) + request(ADD, s(b"n") + i64(5)) + request(CAS, s(b"c") + s(b"") + s(b"x"))
                + request(CHECK, strs([b"k", b"c"])) + request(DELETE, s(b"k")) + request(NUM_KEYS))
                + send_all(0),
    "wait_woken": connect() + connect() + good_hello(0) + good_hello(1)
                  + receive(0, request(WAIT, strs([b"late"]) + i64(10000))) + receive(1, request(SET, s(b"late") + s(b"1")))
                  + send_all(0) + send_all(1),
    "wait_times_out": connect() + good_hello(0) + receive(0, request(WAIT, strs([b"never"]) + i64(100))) + tick(3)
                      + send_all(0),
    "huge_wait": connect() + good_hello(0) + receive(0, request(WAIT, strs([b"never"]) + i64(1 << 62))) + tick(255),
    "add_overflow": connect() + good_hello(0) + receive(0, request(SET, s(b"n") + s(b"9223372036854775807"))
                                                        + request(ADD, s(b"n") + i64(1))) + send_all(0),
    "pipelined_gets": connect() + good_hello(0) + receive(0, request(SET, s(b"big") + s(b"x" * 3000)))
                      + receive(0, request(GET, s(b"big")) * 20) + send_all(0) + send_all(0) + send_all(0),
    "wrong_token": connect() + bad_hello(0) + receive(0, request(NUM_KEYS)) + send_all(0),
    "another_run": connect() + bad_hello(0, 1) + send_all(0),
    "version_1": connect() + bad_hello(0, 2) + send_all(0) + connect() + receive(1, hello_v1(TOKEN)) + send_all(1),
    "oversized_first_frame": connect() + receive(0, u32(64 << 20) + b"x" * 100),
    "garbage": connect() + receive(0, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    "half_hello_then_deadline": connect() + receive(0, hello()[:7]) + tick(120),
    "hello_without_proof": connect() + receive(0, hello()) + send_all(0) + tick(120),
    "strangers_evicted": connect() * 6 + good_hello(5) + receive(5, request(NUM_KEYS)) + send_all(5),
    "malformed_request": connect() + good_hello(0) + receive(0, request(SET, s(b"k")) + request(99)),
}


# store_client_fuzz.cc's session: a request byte, then the server's bytes for its reply.
def reply(op, body):
    return bytes([op]) + frame(body)


CLIENT = {
    "session": reply(HELLO, bytes([OK]) + s(b"\x5e" * 16) + s(b"\x01" * 32)) + reply(PROOF, bytes([OK]))
               + reply(SET, bytes([OK])) + reply(GET, bytes([OK]) + s(b"value"))
               + reply(GET, bytes([NOT_FOUND])) + reply(ADD, bytes([OK]) + i64(7))
               + reply(ADD, bytes([ERROR]) + s(b"overflow")) + reply(CAS, bytes([OK]) + s(b"x"))
               + reply(WAIT, bytes([OK])) + reply(WAIT, bytes([TIMEOUT]) + strs([b"a", b"b"]))
               + reply(CHECK, bytes([OK, 1])) + reply(DELETE, bytes([OK, 0])) + reply(NUM_KEYS, bytes([OK]) + i64(3)),
    "refused": reply(HELLO, bytes([REFUSED]) + s(b"this store belongs to another job"))
               + reply(PROOF, bytes([REFUSED]) + s(b"the store token does not match this job's")),
    "oversized_length": bytes([HELLO]) + u32(0xFFFFFFFF) + b"garbage",
    "announced_but_short": bytes([GET]) + u32(64 << 20) + b"x" * 100,
    "wrong_status": reply(SET, bytes([NOT_FOUND])) + reply(HELLO, bytes([ERROR]) + s(b"x")),
    "trailing_bytes": reply(NUM_KEYS, bytes([OK]) + i64(1) + b"extra"),
    "http": bytes([HELLO]) + b"HTTP/1.1 400 Bad Request\r\n\r\n",
}


def write(directory, seeds):
    path = os.path.join(HERE, "corpus", directory)
    os.makedirs(path, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    write("store_server", SERVER)
    write("store_client", CLIENT)
