// The TypeScript client against a real daemon and real views.
//
// integration/daemon/clients_test.go starts condfs serve on a home made for these
// tests and runs this file with CONDFS_SOCKET, CONDFS_TEST_MNT (an empty
// directory for mountpoints) and CONDFS_BIN (the condfs that Session.run
// starts) set. Without them every test here fails: none passes by skipping.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomBytes, randomUUID } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { Client, Codes, CondfsError } from "../dist/index.js";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run these tests through integration/daemon/clients_test.go (make test)`);
  return v;
};

const DM = ["discord:dm", "discord:dm:7", "discord:channel:7"];
const GUILD = { kind: "discord", channel_id: "2", guild_id: "1" };

let client;
let mnt;
const opened = [];

before(() => {
  client = new Client({ socket: env("CONDFS_SOCKET"), timeout: 60_000, condfs: env("CONDFS_BIN") });
  mnt = env("CONDFS_TEST_MNT");
});

after(async () => {
  for (const s of opened) {
    await s.close().catch((e) => {
      if (e.code !== Codes.UNKNOWN_SESSION) throw e;
    });
  }
  await client.close();
});

async function open(context = DM) {
  const id = "ts-" + randomUUID().slice(0, 12);
  const s = await client.openSession(id, join(mnt, id), context);
  opened.push(s);
  return s;
}

async function rejectsWith(code, p) {
  await assert.rejects(p, (e) => {
    assert.ok(e instanceof CondfsError, `not a CondfsError: ${e}`);
    assert.equal(e.code, code, e.message);
    return true;
  });
}

test("open, list, switch context, close", async () => {
  const s = await open();
  assert.equal(s.mount, join(mnt, s.id));
  assert.ok(s.atoms.includes("discord:dm"));
  assert.equal(readFileSync(join(s.mount, "memories", "private", "p.md"), "utf8"), "dm secret\n");
  assert.ok((await client.sessions()).some((i) => i.id === s.id));
  assert.ok((await client.status()).sessions.some((i) => i.id === s.id));
  assert.deepEqual(await s.setContext(GUILD), ["discord:channel:2", "discord:guild:1"]);
  assert.equal(existsSync(join(s.mount, "memories", "private", "p.md")), false);
  assert.deepEqual(await client.session(s.id).getContext(), ["discord:channel:2", "discord:guild:1"]);
  await s.close();
  assert.ok(!(await client.sessions()).some((i) => i.id === s.id));
});

test("blocks, path and tool decisions follow the context; a deny is a result", async () => {
  const s = await open();
  const blocks = await s.blocks();
  assert.deepEqual(blocks.map((b) => b.name), ["dm"]);
  assert.equal(blocks[0].description, "DM etiquette");
  const d = await s.checkPath("memories", "/private/p.md");
  assert.equal(d.decision, "allow");
  assert.equal(d.rules[0].key, "/private/");
  assert.equal((await s.decide("web_fetch", { url: "https://example.com" })).decision, "allow");
  await s.setContext(GUILD);
  assert.deepEqual((await s.blocks()).map((b) => b.name), ["guild"]);
  assert.equal((await s.checkPath("memories", "/private/p.md")).decision, "deny");
  const denied = await s.decide("web_fetch", { url: "https://example.com" });
  assert.equal(denied.decision, "deny");
  assert.equal(denied.role, null);
  assert.ok(denied.reasons.length > 0);
  assert.equal((await s.decide("refund", {})).decision, "approval_required");
  assert.equal((await s.decide("refund", {}, { role: "billing" })).decision, "allow");
  assert.equal((await client.decide("web_fetch", {}, { context: DM })).decision, "allow");
  assert.equal((await client.decide("web_fetch")).decision, "deny");
  assert.deepEqual((await client.blocks(DM)).map((b) => b.name), ["dm"]);
  assert.equal((await client.checkPath("exec", "/usr/bin/cat", GUILD)).decision, "deny");
  assert.deepEqual(await client.toolsCallable(["web_fetch", "nope", "refund"]), ["web_fetch", "refund"]);
  const cfg = await client.reloadConfig();
  assert.ok(cfg.conditions.generation >= 1);
  assert.equal(cfg.policy.error, null);
});

test("errors carry the daemon's codes; a refused connection names the socket", async () => {
  await rejectsWith(Codes.UNKNOWN_SESSION, client.session("no-such-session").getContext());
  await rejectsWith(Codes.INVALID_PARAMS, client.openSession("bad id!", join(mnt, "x"), DM));
  await rejectsWith(Codes.METHOD_NOT_FOUND, client.call("no.such.method"));
  const s = await open();
  await rejectsWith(Codes.SESSION_EXISTS, client.openSession(s.id, join(mnt, s.id + "-2"), DM));
  const path = join(mnt, "no-daemon-here.sock");
  const none = new Client({ socket: path, condfs: env("CONDFS_BIN") });
  await assert.rejects(none.status(), (e) => e.code === Codes.CONNECTION_FAILED && e.message.includes(path) && e.data.socket === path);
  await assert.rejects(none.session("x").run(["true"]), (e) => e.code === Codes.CONNECTION_FAILED && e.message.includes(path));
});

test("a connection the daemon closed is opened again", async () => {
  const c = new Client({ socket: env("CONDFS_SOCKET"), timeout: 30_000 });
  const version = (await c.status()).version;
  const conn = await c["conn"];
  // A line over 1 MiB: the daemon answers with an error and closes the
  // connection.
  conn.sock.write(Buffer.alloc((1 << 20) + 10, "x"));
  conn.sock.write("\n");
  for (let i = 0; i < 1000 && !conn.dead; i++) await new Promise((r) => setTimeout(r, 10));
  assert.ok(conn.dead, "the daemon kept the connection");
  assert.equal((await c.status()).version, version);
  assert.notEqual(await c["conn"], conn);
  await c.close();
});

test("runs: exit code, bytes, input, refusals, timeout", async () => {
  const s = await open();
  let r = await s.run(["sh", "-c", "printf '\\000\\377abc'; printf 'to stderr' >&2; exit 3"]);
  assert.equal(r.exitCode, 3);
  assert.deepEqual(r.stdout, Buffer.from([0, 0xff, 0x61, 0x62, 0x63]));
  assert.equal(r.stderr.toString(), "to stderr");
  const data = randomBytes(3 << 20);
  r = await s.run(["cat"], { input: data });
  assert.equal(r.exitCode, 0);
  assert.ok(r.stdout.equals(data));
  assert.equal((await s.run(["cat", "/memories/private/p.md"])).stdout.toString(), "dm secret\n");
  r = await s.run(["sh", "-c", "echo $X $CONDFS_SESSION; pwd"], { env: { X: "y" }, cwd: "/memories" });
  assert.equal(r.stdout.toString(), `y ${s.id}\n/memories\n`);
  await rejectsWith(Codes.RUN_DENIED, s.run(["ls", "forbidden"]));
  await rejectsWith(Codes.RUN_NOT_FOUND, s.run(["no-such-program-anywhere"]));
  await rejectsWith(Codes.UNKNOWN_SESSION, client.session("no-such-session").run(["true"]));
  r = await s.run(["sleep", "30"], { timeout: 300 });
  assert.equal(r.exitCode, 124);
  assert.match(r.message, /timed out/);
  // A command's own exit 126 with output of its own is its result.
  r = await s.run(["sh", "-c", "echo mine >&2; exit 126"]);
  assert.equal(r.exitCode, 126);
  assert.equal(r.stderr.toString(), "mine\n");
  await s.setContext(GUILD);
  await rejectsWith(Codes.RUN_DENIED, s.run(["cat", "/etc/hostname"]));
});

test("an aborted run is killed", async () => {
  const s = await open();
  const ac = new AbortController();
  const start = Date.now();
  const p = s.run(["sleep", "30"], { signal: ac.signal });
  setTimeout(() => ac.abort(), 500);
  await assert.rejects(p, (e) => e.name === "AbortError");
  assert.ok(Date.now() - start < 10_000);
});

test("many requests at once on one connection are matched by id", async () => {
  const s = await open();
  const paths = Array.from({ length: 300 }, (_, i) => `/c/${i}`);
  const got = await Promise.all(paths.map((p) => s.checkPath("workspace", p)));
  assert.deepEqual(got.map((d) => d.path), paths);
  const tools = Array.from({ length: 100 }, (_, i) => (i % 2 ? "web_fetch" : "nope"));
  const decisions = await Promise.all(tools.map((t, i) => s.decide(t, { i })));
  assert.deepEqual(
    decisions.map((d) => d.decision),
    tools.map((t) => (t === "web_fetch" ? "allow" : "deny")),
  );
  const runs = await Promise.all([0, 1, 2, 3].map((n) => s.run(["cat"], { input: String(n).repeat(1000) })));
  assert.deepEqual(runs.map((r) => r.stdout.toString()), [0, 1, 2, 3].map((n) => String(n).repeat(1000)));
});

test("checkpoints: take one, see the change, roll it back", async () => {
  const s = await open();
  const name = `${s.id}.txt`;
  const file = join(s.mount, "workspace", name);
  const cp = await s.checkpoint("before");
  assert.equal(cp.name, "before");
  writeFileSync(file, "new\n");
  assert.deepEqual((await s.checkpoints()).map((c) => [c.id, c.name]), [[cp.id, "before"]]);
  const d = await s.diff({ content: true });
  assert.deepEqual(d.changes.map((c) => [c.space, c.path, c.change]), [["workspace", "/" + name, "added"]]);
  assert.equal(d.hidden, 0);
  const r = await s.rollback("before");
  assert.deepEqual([r.restored, r.conflicts], [1, []]);
  // In force when it answers: the view shows the restored state.
  assert.equal(existsSync(file), false);
  await rejectsWith(Codes.UNKNOWN_CHECKPOINT, s.rollback("no-such-checkpoint"));
});
