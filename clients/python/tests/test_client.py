"""The Python client against a real daemon and real views.

integration/daemon/clients_test.go starts condfs serve on a home made for these
tests (its rules and policy are there, in clientRules and clientPolicy) and
runs this file with CONDFS_SOCKET and CONDFS_TEST_MNT (an empty directory
for mountpoints) set. Without them every test here fails: they never pass
by skipping.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import unittest
import uuid

from condfs import (
    CONNECTION_FAILED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    RUN_DENIED,
    RUN_NOT_FOUND,
    SESSION_EXISTS,
    UNKNOWN_CHECKPOINT,
    UNKNOWN_SESSION,
    AsyncClient,
    Client,
    CondfsError,
    Session,
)

DM = ["discord:dm", "discord:dm:7", "discord:channel:7"]
GUILD = {"kind": "discord", "channel_id": "2", "guild_id": "1"}


def env(name: str) -> str:
    v = os.environ.get(name)
    if not v:
        raise RuntimeError(f"{name} is not set: run these tests through integration/daemon/clients_test.go (make test)")
    return v


class Live(unittest.TestCase):
    client: Client
    mnt: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.client = Client(env("CONDFS_SOCKET"), timeout=60)
        cls.mnt = env("CONDFS_TEST_MNT")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.client.close()

    def open(self, context: object = DM) -> Session:
        sid = "py-" + uuid.uuid4().hex[:12]
        s = self.client.open_session(sid, os.path.join(self.mnt, sid), context)  # type: ignore[arg-type]
        self.addCleanup(self.close_quietly, s)
        return s

    @staticmethod
    def close_quietly(s: Session) -> None:
        try:
            s.close()
        except CondfsError as e:
            if e.code != UNKNOWN_SESSION:
                raise

    def code(self, code: int, f: object, *args: object, **kw: object) -> CondfsError:
        with self.assertRaises(CondfsError) as cm:
            f(*args, **kw)  # type: ignore[operator]
        self.assertEqual(cm.exception.code, code, cm.exception.message)
        return cm.exception


class SessionMethods(Live):
    def test_open_list_context_close(self) -> None:
        s = self.open()
        self.assertEqual(s.mount, os.path.join(self.mnt, s.id))
        self.assertIn("discord:dm", s.atoms)
        self.assertTrue(os.path.ismount(s.mount or ""))
        self.assertIn(s.id, [i["id"] for i in self.client.sessions()])
        self.assertIn(s.id, [i["id"] for i in self.client.status()["sessions"]])
        atoms = s.set_context(GUILD)
        self.assertEqual(sorted(atoms), ["discord:channel:2", "discord:guild:1"])
        self.assertEqual(self.client.session(s.id).get_context(), atoms)
        s.close()
        self.assertNotIn(s.id, [i["id"] for i in self.client.sessions()])
        self.assertFalse(os.path.ismount(s.mount or ""))

    def test_context_follows_the_message_in_the_view(self) -> None:
        s = self.open()
        private = os.path.join(s.mount or "", "memories", "private", "p.md")
        with open(private) as f:
            self.assertEqual(f.read(), "dm secret\n")
        s.set_context(GUILD)
        self.assertFalse(os.path.exists(private))
        self.assertEqual(s.check_path("memories", "/private/p.md")["decision"], "deny")
        s.set_context(DM)
        self.assertEqual(s.check_path("memories", "/private/p.md")["decision"], "allow")

    def test_blocks_follow_the_context(self) -> None:
        s = self.open()
        blocks = s.blocks()
        self.assertEqual([b["name"] for b in blocks], ["dm"])
        self.assertEqual(blocks[0]["description"], "DM etiquette")
        self.assertIn("discreet", blocks[0]["body"])
        s.set_context(GUILD)
        self.assertEqual([b["name"] for b in s.blocks()], ["guild"])
        self.assertEqual([b["name"] for b in self.client.blocks(["discord:dm"])], ["dm"])

    def test_path_decisions(self) -> None:
        s = self.open()
        d = s.check_path("memories", "/private/p.md")
        self.assertEqual(d["decision"], "allow")
        self.assertEqual(d["path"], "/private/p.md")
        self.assertEqual(d["rules"][0]["key"], "/private/")
        self.assertTrue(d["rules"][0]["holds"])
        self.assertEqual(s.check_path("exec", "/usr/bin/cat")["decision"], "allow")
        self.assertEqual(self.client.check_path("exec", "/usr/bin/cat", GUILD)["decision"], "deny")

    def test_tool_decisions_deny_is_a_result(self) -> None:
        s = self.open()
        self.assertEqual(s.decide("web_fetch", {"url": "https://example.com"})["decision"], "allow")
        s.set_context(GUILD)
        d = s.decide("web_fetch", {"url": "https://example.com"})
        self.assertEqual(d["decision"], "deny")
        self.assertIsNone(d["role"])
        self.assertTrue(d["reasons"])
        self.assertEqual(s.decide("refund", {})["decision"], "approval_required")
        self.assertEqual(s.decide("refund", {}, role="billing")["decision"], "allow")
        self.assertEqual(s.decide("refund", {}, roles=["nobody-role", "billing"])["role"], "billing")
        self.assertEqual(self.client.decide("web_fetch", {}, context=DM)["decision"], "allow")
        self.assertEqual(self.client.decide("web_fetch", {})["decision"], "deny")  # when() unknown
        self.assertEqual(self.client.decide("nope", {}, ctx={"user": "x"})["decision"], "deny")

    def test_tools_callable_and_reload(self) -> None:
        self.assertEqual(self.client.tools_callable(["web_fetch", "nope", "refund"]), ["web_fetch", "refund"])
        self.assertIn("refund", self.client.tools_callable(["refund"], roles=["billing"]))
        cfg = self.client.reload_config()
        self.assertGreaterEqual(cfg["conditions"]["generation"], 1)
        self.assertIsNone(cfg["policy"]["error"])
        st = self.client.status()
        self.assertEqual(st["version"], st["version"].strip())
        self.assertIn(st["limits"]["connections"], ("shared", "per-session"))


class Errors(Live):
    def test_daemon_errors_carry_codes(self) -> None:
        self.code(UNKNOWN_SESSION, self.client.session("no-such-session").get_context)
        self.code(INVALID_PARAMS, self.client.open_session, "bad id!", os.path.join(self.mnt, "x"), DM)
        self.code(INVALID_PARAMS, self.client.open_session, "relative", "not/absolute", DM)
        self.code(METHOD_NOT_FOUND, self.client.call, "no.such.method")
        s = self.open()
        e = self.code(SESSION_EXISTS, self.client.open_session, s.id, os.path.join(self.mnt, s.id + "-2"), DM)
        self.assertIn(s.id, e.message)
        self.code(INVALID_PARAMS, s.set_context, {"kind": "discord", "bogus": 1})

    def test_a_refused_connection_names_the_socket(self) -> None:
        path = os.path.join(self.mnt, "no-daemon-here.sock")
        with Client(path) as c:
            e = self.code(CONNECTION_FAILED, c.status)
            self.assertIn(path, e.message)
            self.assertEqual(e.data["socket"], path)
            e = self.code(CONNECTION_FAILED, c.session("x").run, ["true"])
            self.assertIn(path, e.message)

    def test_a_connection_the_daemon_closed_is_opened_again(self) -> None:
        c = Client(env("CONDFS_SOCKET"), timeout=30)
        self.addCleanup(c.close)
        c.status()
        conn = c._conn
        assert conn is not None
        # A line over 1 MiB: the daemon answers with an error and closes
        # the connection.
        conn.sock.sendall(b"x" * ((1 << 20) + 10) + b"\n")
        deadline = time.monotonic() + 10
        while conn.dead is None and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertIsNotNone(conn.dead, "the daemon kept the connection")
        self.assertEqual(c.status()["version"], self.client.status()["version"])
        self.assertIsNot(c._conn, conn)


class Runs(Live):
    def test_exit_code_and_bytes(self) -> None:
        s = self.open()
        r = s.run(["sh", "-c", "printf '\\000\\377abc'; printf 'to stderr' >&2; exit 3"])
        self.assertEqual(r.exit_code, 3)
        self.assertEqual(r.stdout, b"\x00\xffabc")
        self.assertEqual(r.stderr, b"to stderr")
        self.assertFalse(r.ok)
        self.assertTrue(s.run(["true"]).ok)
        self.assertEqual(s.run(["sh", "-c", "kill -TERM $$"]).exit_code, 143)

    def test_input_and_the_view(self) -> None:
        s = self.open()
        data = os.urandom(3 << 20)  # more than any pipe holds
        r = s.run(["cat"], input=data)
        self.assertEqual(r.exit_code, 0)
        self.assertEqual(r.stdout, data)
        self.assertEqual(s.run(["cat", "/memories/private/p.md"]).stdout, b"dm secret\n")
        r = s.run(["ls"], cwd="/memories", env={"X": "1"})
        self.assertIn(b"private", r.stdout)
        self.assertEqual(s.run(["sh", "-c", "echo $X $CONDFS_SESSION"], env={"X": "y"}).stdout, f"y {s.id}\n".encode())
        # A command that reads none of its input.
        self.assertEqual(s.run(["true"], input=os.urandom(1 << 20)).exit_code, 0)

    def test_refusals_are_errors(self) -> None:
        s = self.open()
        self.code(RUN_DENIED, s.run, ["ls", "forbidden"])
        self.code(RUN_NOT_FOUND, s.run, ["no-such-program-anywhere"])
        s.set_context(GUILD)
        self.code(RUN_DENIED, s.run, ["cat", "/etc/hostname"])
        self.code(UNKNOWN_SESSION, self.client.session("no-such-session").run, ["true"])

    def test_timeout_kills_the_run(self) -> None:
        s = self.open()
        start = time.monotonic()
        r = s.run(["sleep", "30"], timeout=0.3)
        self.assertEqual(r.exit_code, 124)
        self.assertIn("timed out", r.message)
        self.assertLess(time.monotonic() - start, 10)

    def test_closing_the_session_ends_its_runs(self) -> None:
        s = self.open()
        out: list[object] = []
        marker = os.path.join(s.mount or "", "workspace", "running-" + s.id)
        t = threading.Thread(target=lambda: out.append(s.run(["/bin/sh", "-c", f"echo > /workspace/running-{s.id}; exec sleep 30"])))
        t.start()
        # The close must find the command running (a close before its
        # sandbox is built answers the run an error instead).
        deadline = time.monotonic() + 20
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertTrue(os.path.exists(marker), "the command never started")
        s.close()
        t.join(20)
        self.assertFalse(t.is_alive())
        self.assertEqual(getattr(out[0], "exit_code", None), 137, out)


class Concurrency(Live):
    def test_threads_share_one_connection(self) -> None:
        s = self.open()
        errors: list[str] = []

        def work(n: int) -> None:
            for i in range(40):
                path = f"/t{n}/f{i}"
                d = s.check_path("workspace", path)
                if d["path"] != path:
                    errors.append(f"asked {path}, answered for {d['path']}")
                tool = "web_fetch" if (n + i) % 2 else "nope"
                want = "allow" if tool == "web_fetch" else "deny"
                got = s.decide(tool, {"i": i})["decision"]
                if got != want:
                    errors.append(f"{tool}: {got}")

        threads = [threading.Thread(target=work, args=(n,)) for n in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])

    def test_large_requests_from_many_threads(self) -> None:
        # Lines larger than the socket's buffers, written while answers
        # come back: neither side waits for the other.
        s = self.open()
        errors: list[str] = []

        def work(n: int) -> None:
            for i in range(4):
                d = s.decide("web_fetch", {"blob": ["x" * 60_000] * 5, "n": n, "i": i})
                if d["decision"] != "allow":
                    errors.append(str(d))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])

    def test_runs_in_parallel(self) -> None:
        s = self.open()
        results: dict[int, bytes] = {}

        def work(n: int) -> None:
            results[n] = s.run(["cat"], input=str(n).encode() * 1000).stdout

        threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(results, {n: str(n).encode() * 1000 for n in range(6)})


class Changes(Live):
    def test_checkpoint_diff_rollback(self) -> None:
        s = self.open()
        name = f"{s.id}.txt"
        path = os.path.join(s.mount or "", "workspace", name)
        cp = s.checkpoint("before")
        self.assertEqual(cp["name"], "before")
        with open(path, "w") as f:
            f.write("new\n")
        self.assertEqual([(c["id"], c["name"]) for c in s.checkpoints()], [(cp["id"], "before")])
        d = s.diff(content=True)
        self.assertEqual([(c["space"], c["path"], c["change"]) for c in d["changes"]], [("workspace", "/" + name, "added")])
        self.assertEqual(d["hidden"], 0)
        r = s.rollback("before")
        self.assertEqual((r["restored"], r["conflicts"]), (1, []))
        # In force when it answers: the view shows the restored state.
        self.assertFalse(os.path.exists(path))
        self.code(UNKNOWN_CHECKPOINT, s.rollback, "no-such-checkpoint")


class Async(Live):
    def test_async_client(self) -> None:
        asyncio.run(self.async_body())

    async def async_body(self) -> None:
        async with AsyncClient(env("CONDFS_SOCKET"), timeout=60) as c:
            sid = "pya-" + uuid.uuid4().hex[:12]
            s = await c.open_session(sid, os.path.join(self.mnt, sid), DM)
            try:
                self.assertEqual([b["name"] for b in await s.blocks()], ["dm"])
                paths = [f"/a/{i}" for i in range(200)]
                got = await asyncio.gather(*(s.check_path("memories", p) for p in paths))
                self.assertEqual([d["path"] for d in got], paths)
                self.assertEqual((await s.decide("web_fetch", {}))["decision"], "allow")
                self.assertEqual(await s.set_context(GUILD), ["discord:channel:2", "discord:guild:1"])
                self.assertEqual(await c.session(sid).get_context(), ["discord:channel:2", "discord:guild:1"])
                self.assertEqual((await s.decide("web_fetch", {}))["decision"], "deny")
                r1, r2 = await asyncio.gather(s.run(["sh", "-c", "exit 5"]), s.run(["head", "-c", "1"], input=b"xy"))
                self.assertEqual((r1.exit_code, r2.exit_code, r2.stdout), (5, 0, b"x"))
                with self.assertRaises(CondfsError) as cm:
                    await c.call("no.such.method")
                self.assertEqual(cm.exception.code, METHOD_NOT_FOUND)
                self.assertIn(sid, [i["id"] for i in await c.sessions()])
                self.assertTrue((await c.status())["version"])
                self.assertEqual(await c.tools_callable(["web_fetch"]), ["web_fetch"])
                # A run cancelled is killed.
                task = asyncio.ensure_future(s.run(["sleep", "30"]))
                await asyncio.sleep(0.5)
                task.cancel()
                start = time.monotonic()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                self.assertLess(time.monotonic() - start, 10)
            finally:
                await s.close()
            # The daemon closes a connection: the next call opens another.
            conn = c._conn
            assert conn is not None
            conn.writer.write(b"x" * ((1 << 20) + 10) + b"\n")
            for _ in range(500):
                if conn.dead is not None:
                    break
                await asyncio.sleep(0.01)
            self.assertIsNotNone(conn.dead)
            self.assertTrue((await c.status())["version"])
            with self.assertRaises(CondfsError) as cm:
                await AsyncClient(os.path.join(self.mnt, "none.sock")).status()
            self.assertEqual(cm.exception.code, CONNECTION_FAILED)
            self.assertIn("none.sock", cm.exception.message)


if __name__ == "__main__":
    unittest.main()
