// The TypeScript types against docs/control.schema.json: every method the
// schema names is in Methods with the params and result types the schema
// names, and has a Client or Session method that sends it; every field of
// every $def is a key of the interface of the same name. The type checks
// are a generated file that tsc must accept: it fails when the schema and
// the client drift.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { CLIENT_METHODS, Client, Session } from "../dist/index.js";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const schemaPath = process.env.CONDFS_SCHEMA || join(root, "..", "..", "docs", "control.schema.json");
const schema = JSON.parse(readFileSync(schemaPath, "utf8"));
const refName = (node) => node.$ref.replace(/^#\/\$defs\//, "");

test("every method of the schema has a Client or Session method", () => {
  for (const method of Object.keys(schema.methods)) {
    const where = CLIENT_METHODS[method];
    assert.ok(where, `method ${method} of the schema is missing from CLIENT_METHODS`);
    const [cls, name] = where.split(".");
    const proto = { Client: Client.prototype, Session: Session.prototype }[cls];
    assert.equal(typeof proto?.[name], "function", `${where} for ${method}`);
  }
});

test("every method and field of the schema is in the types", () => {
  const lines = [
    `import type * as T from ${JSON.stringify(join(root, "src", "types.js"))};`,
    "type Has<O, K extends string> = K extends keyof O ? true : false;",
    "type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;",
  ];
  let n = 0;
  const check = (expr, what) => lines.push(`// ${what}\nexport const c${n++}: ${expr} = true;`);
  for (const [method, entry] of Object.entries(schema.methods)) {
    const m = JSON.stringify(method);
    check(`Has<T.Methods, ${m}>`, `method ${method} is in Methods`);
    check(`Same<T.Methods[${m}]["params"], T.${refName(entry.params)}>`, `${method} params are ${refName(entry.params)}`);
    check(`Same<T.Methods[${m}]["result"], T.${refName(entry.result)}>`, `${method} result is ${refName(entry.result)}`);
  }
  for (const [method, entry] of Object.entries(schema.notifications)) {
    check(`Same<T.Notifications[${JSON.stringify(method)}]["params"], T.${refName(entry.params)}>`, `notification ${method}`);
  }
  for (const [name, def] of Object.entries(schema.$defs)) {
    if (!def.properties || Object.keys(def.properties).length === 0) continue;
    for (const field of Object.keys(def.properties)) {
      check(`Has<T.${name}, ${JSON.stringify(field)}>`, `${name}.${field} of the schema`);
    }
    for (const field of def.required ?? []) {
      check(`{} extends Pick<T.${name}, ${JSON.stringify(field)}> ? false : true`, `${name}.${field} is required`);
    }
  }
  const dir = mkdtempSync(join(tmpdir(), "condfs-schema-"));
  try {
    const file = join(dir, "check.ts");
    writeFileSync(file, lines.join("\n") + "\n");
    const options = { strict: true, noEmit: true, target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", types: [] };
    writeFileSync(join(dir, "tsconfig.json"), JSON.stringify({ compilerOptions: options, files: ["check.ts"] }));
    const tsc = join(root, "node_modules", "typescript", "bin", "tsc");
    try {
      execFileSync(
        process.execPath,
        [tsc, "-p", dir],
        { encoding: "utf8", stdio: "pipe" },
      );
    } catch (e) {
      // Each failing line is preceded by a comment saying what it checks.
      const src = lines.join("\n").split("\n");
      const why = String(e.stdout)
        .split("\n")
        .map((l) => /check\.ts\((\d+),/.exec(l))
        .filter(Boolean)
        .map((m) => src[Number(m[1]) - 2]);
      assert.fail(`the types lack what the schema has:\n${why.join("\n") || e.stdout}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
