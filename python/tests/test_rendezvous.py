"""The nccl_rs package against the Rust peer, over loopback, on the CPU.

`cargo xtask py` builds the wheel, installs it, builds the Rust peer
(crates/nccl-dist/examples/rendezvous_peer.rs) and runs these tests with
RENDEZVOUS_PEER naming it. Both sides run the same Rust rendezvous code;
these tests prove that a Python rank and a Rust rank agree on the id bytes
in both directions, and that bad input is a typed error on both sides
within its deadline.
"""

import os
import socket
import struct
import subprocess
import threading
import time
import unittest

import nccl_rs

SECRET = "python-and-rust-share-this-secret"
PEER = os.environ.get("RENDEZVOUS_PEER")
HAVE_NCCL = bool(os.environ.get("NCCL_LIBRARY"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Peer:
    """The Rust peer as a child process; its stdout lines."""

    def __init__(self, *args, secret=SECRET):
        env = dict(os.environ)
        env["NCCL_RS_SECRET"] = secret
        env.pop("NCCL_RS_SECRET_FILE", None)
        self.proc = subprocess.Popen(
            [PEER, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def port(self):
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["port"], line
        return int(line[1])

    def finish(self, timeout=30):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode, out.splitlines(), err


def frame(version, kind, payload):
    return b"NCRV" + struct.pack(">HBI", version, kind, len(payload)) + payload


def hello(rank, world, version):
    return frame(version, 1, struct.pack(">II", rank, world) + os.urandom(32))


class RawServer:
    """A listener that answers every first frame with a frame of another
    protocol version (what a future rank 0 would send)."""

    def __init__(self, version=3):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.version = version
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    conn.recv(1024)
                    conn.sendall(frame(self.version, 2, os.urandom(64)))
                except OSError:
                    pass

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


def in_thread(fn, *args, **kwargs):
    """Runs fn on a thread; returns a function that joins it and gives its
    result (or raises its exception)."""
    box = {}

    def body():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller
            box["error"] = e

    t = threading.Thread(target=body)
    t.start()

    def result(timeout=30):
        t.join(timeout)
        if t.is_alive():
            raise AssertionError(f"{fn.__name__} did not return in {timeout} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    return result


@unittest.skipUnless(PEER, "RENDEZVOUS_PEER is not set (run `cargo xtask py`)")
class PythonAndRust(unittest.TestCase):
    def test_python_serves_rust_joins(self):
        want = os.urandom(nccl_rs.UNIQUE_ID_BYTES)
        srv = nccl_rs.Server(2, SECRET, host="127.0.0.1", unique_id=want)
        peer = Peer("join", f"127.0.0.1:{srv.port}", 1, 2, "--show-id", "--timeout", 20)
        uid, rank, size = srv.wait(timeout=20)
        code, out, err = peer.finish()
        self.assertEqual((uid, rank, size), (want, 0, 2))
        self.assertEqual(code, 0, err)
        self.assertEqual(out[-1], f"id {want.hex()} rank 1 size 2")

    def test_rust_serves_python_joins(self):
        want = os.urandom(nccl_rs.UNIQUE_ID_BYTES)
        peer = Peer("serve", 2, 0, "--id", want.hex(), "--show-id", "--timeout", 20)
        uid, rank, size = nccl_rs.join(f"127.0.0.1:{peer.port()}", 1, 2, SECRET, timeout=20)
        code, out, err = peer.finish()
        self.assertEqual((uid, rank, size), (want, 1, 2))
        self.assertEqual(code, 0, err)
        self.assertEqual(out[-1], f"id {want.hex()} rank 0 size 2")

    def test_three_ranks_python_server_rust_and_python_members(self):
        srv = nccl_rs.Server(3, SECRET.encode(), host="127.0.0.1", unique_id=os.urandom(128))
        peer = Peer("join", f"127.0.0.1:{srv.port}", 2, 3, "--show-id", "--timeout", 20)
        member = in_thread(nccl_rs.join, f"127.0.0.1:{srv.port}", 1, 3, SECRET, timeout=20)
        uid, _, _ = srv.wait(timeout=20)
        self.assertEqual(member(), (uid, 1, 3))
        code, out, err = peer.finish()
        self.assertEqual(code, 0, err)
        self.assertEqual(out[-1], f"id {uid.hex()} rank 2 size 3")

    @unittest.skipUnless(HAVE_NCCL, "NCCL_LIBRARY is not set")
    def test_ids_made_by_libnccl_on_either_side(self):
        peer = Peer("serve", 2, 0, "--show-id", "--timeout", 20)
        uid, _, _ = nccl_rs.join(f"127.0.0.1:{peer.port()}", 1, 2, SECRET, timeout=20)
        code, out, err = peer.finish()
        self.assertEqual(code, 0, err)
        self.assertEqual(out[-1], f"id {uid.hex()} rank 0 size 2")
        srv = nccl_rs.Server(2, SECRET, host="127.0.0.1")
        peer = Peer("join", f"127.0.0.1:{srv.port}", 1, 2, "--show-id", "--timeout", 20)
        uid, _, _ = srv.wait(timeout=20)
        self.assertEqual(peer.finish()[1][-1], f"id {uid.hex()} rank 1 size 2")
        self.assertEqual(len(nccl_rs.new_unique_id()), nccl_rs.UNIQUE_ID_BYTES)


@unittest.skipUnless(PEER, "RENDEZVOUS_PEER is not set (run `cargo xtask py`)")
class BadInput(unittest.TestCase):
    def assertClosedUnanswered(self, sock):
        """Refused: the server closes (or resets) without a frame."""
        try:
            self.assertEqual(sock.recv(64), b"")
        except ConnectionResetError:
            pass

    def test_wrong_secret_python_server(self):
        srv = nccl_rs.Server(2, SECRET, host="127.0.0.1", unique_id=os.urandom(128))
        peer = Peer("join", f"127.0.0.1:{srv.port}", 1, 2, "--timeout", 2, secret="another-secret-16-bytes")
        started = time.monotonic()
        with self.assertRaises(nccl_rs.RendezvousTimeout):
            srv.wait(timeout=3)
        self.assertLess(time.monotonic() - started, 6)
        code, out, _ = peer.finish()
        self.assertEqual(code, 2)
        self.assertTrue(out[-1].startswith("error unauthenticated:"), out)

    def test_wrong_secret_rust_server(self):
        peer = Peer("serve", 2, 0, "--id", "ab" * 128, "--timeout", 3)
        port = peer.port()
        started = time.monotonic()
        with self.assertRaises(nccl_rs.UnauthenticatedError):
            nccl_rs.join(f"127.0.0.1:{port}", 1, 2, "another-secret-16-bytes", timeout=2)
        self.assertLess(time.monotonic() - started, 5)
        code, out, _ = peer.finish()
        self.assertEqual(code, 2)
        self.assertTrue(out[-1].startswith("error timeout:"), out)

    def test_another_protocol_version_to_a_python_server(self):
        srv = nccl_rs.Server(2, SECRET, host="127.0.0.1", unique_id=os.urandom(128))
        served = in_thread(srv.wait, timeout=10)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(hello(1, 2, version=3))
            self.assertClosedUnanswered(s)
        nccl_rs.join(f"127.0.0.1:{srv.port}", 1, 2, SECRET, timeout=10)
        served()
        self.assertTrue(any("protocol version 3" in r for r in srv.refused), srv.refused)

    def test_another_protocol_version_to_a_rust_server(self):
        peer = Peer("serve", 2, 0, "--id", "cd" * 128, "--timeout", 10)
        port = peer.port()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(hello(1, 2, version=3))
            self.assertClosedUnanswered(s)
        nccl_rs.join(f"127.0.0.1:{port}", 1, 2, SECRET, timeout=10)
        code, out, err = peer.finish()
        self.assertEqual(code, 0, err)
        self.assertTrue(any(l.startswith("refused protocol version 3") for l in out), out)

    def test_a_server_of_another_protocol_version(self):
        raw = RawServer(version=3)
        try:
            started = time.monotonic()
            with self.assertRaises(nccl_rs.ProtocolVersionError) as caught:
                nccl_rs.join(f"127.0.0.1:{raw.port}", 1, 2, SECRET, timeout=1.5)
            self.assertLess(time.monotonic() - started, 5)
            self.assertEqual((caught.exception.got, caught.exception.expected), (3, nccl_rs.PROTOCOL_VERSION))
            code, out, _ = Peer("join", f"127.0.0.1:{raw.port}", 1, 2, "--timeout", 1.5).finish()
            self.assertEqual(code, 2)
            self.assertTrue(out[-1].startswith("error version:"), out)
        finally:
            raw.close()

    def test_rejected_with_the_reason(self):
        srv = nccl_rs.Server(2, SECRET, host="127.0.0.1", unique_id=os.urandom(128))
        served = in_thread(srv.wait, timeout=3)
        with self.assertRaises(nccl_rs.RejectedError) as caught:
            nccl_rs.join(f"127.0.0.1:{srv.port}", 1, 3, SECRET, timeout=5)
        self.assertIn("world size", caught.exception.reason)
        code, out, _ = Peer("join", f"127.0.0.1:{srv.port}", 2, 3, "--timeout", 5).finish()
        self.assertEqual(code, 2)
        self.assertTrue(out[-1].startswith("error rejected:"), out)
        with self.assertRaises(nccl_rs.RendezvousTimeout):
            served()

    def test_nobody_serves_the_port(self):
        port = free_port()
        started = time.monotonic()
        with self.assertRaises(nccl_rs.RendezvousTimeout):
            nccl_rs.join(f"127.0.0.1:{port}", 1, 2, SECRET, timeout=1)
        self.assertLess(time.monotonic() - started, 4)
        code, out, _ = Peer("join", f"127.0.0.1:{port}", 1, 2, "--timeout", 1).finish()
        self.assertEqual(code, 2)
        self.assertTrue(out[-1].startswith("error timeout:"), out)

    def test_malformed_ids(self):
        for bad in (b"\0" * 127, b"\0" * 129, tuple(range(100)), (300,) * 128, "not bytes"):
            with self.assertRaises(nccl_rs.MalformedIdError):
                nccl_rs.Server(2, SECRET, host="127.0.0.1", unique_id=bad)
        for text in ("ab" * 127, "zz" * 128, "ab" * 129):
            with self.assertRaises(nccl_rs.MalformedIdError):
                nccl_rs.unique_id_from_hex(text)
        code, out, _ = Peer("serve", 2, 0, "--id", "ab" * 127).finish()
        self.assertEqual(code, 2)
        self.assertTrue(out[-1].startswith("error id:"), out)

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            nccl_rs.Server(2, "short", host="127.0.0.1", unique_id=os.urandom(128))
        with self.assertRaises(TypeError):
            nccl_rs.join("127.0.0.1:1", 1, 2, 12345)
        with self.assertRaises(ValueError):
            nccl_rs.join("127.0.0.1:1", 1, 2, SECRET, timeout=-1)
        with self.assertRaises(nccl_rs.RendezvousError):
            nccl_rs.join("127.0.0.1:1", 2, 2, SECRET, timeout=1)
        srv = nccl_rs.Server(1, SECRET, host="127.0.0.1", unique_id=os.urandom(128))
        self.assertEqual(srv.wait(timeout=1)[1:], (0, 1))
        with self.assertRaises(nccl_rs.RendezvousError):
            srv.wait(timeout=1)


class Ids(unittest.TestCase):
    def test_hex_and_cupy_forms_round_trip(self):
        raw = bytes(range(128))
        self.assertEqual(nccl_rs.unique_id_hex(raw), raw.hex())
        self.assertEqual(nccl_rs.unique_id_from_hex(raw.hex().upper()), raw)
        self.assertEqual(nccl_rs.unique_id_from_hex(f"  {raw.hex()}\n"), raw)
        self.assertEqual(nccl_rs.unique_id_to_cupy(raw, form="bytes"), raw)
        with self.assertRaises(ValueError):
            nccl_rs.unique_id_to_cupy(raw, form="list")
        cupy_form = nccl_rs.unique_id_to_cupy(bytes(range(256))[128:], form="tuple")
        self.assertIsInstance(cupy_form, tuple)
        self.assertEqual(len(cupy_form), 128)
        self.assertTrue(all(-128 <= v <= 255 for v in cupy_form))
        srv = nccl_rs.Server(1, SECRET, host="127.0.0.1", unique_id=cupy_form)
        self.assertEqual(srv.unique_id, bytes(range(256))[128:])
        self.assertEqual(nccl_rs.Server(1, SECRET, unique_id=bytearray(raw)).unique_id, raw)

    def test_exceptions_share_a_base(self):
        for name in ("UnauthenticatedError", "RejectedError", "RendezvousTimeout",
                     "ProtocolVersionError", "MalformedIdError"):
            self.assertTrue(issubclass(getattr(nccl_rs, name), nccl_rs.RendezvousError), name)


if __name__ == "__main__":
    unittest.main()
