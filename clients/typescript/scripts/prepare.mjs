// Builds dist/ (the ES module and its .d.ts) from src/. npm runs this as
// `prepare`: on `npm install` in this folder, on `npm pack`, and in the
// folder itself when another project runs `npm install ./clients/typescript`
// (npm 11 links the folder and runs its prepare there, without installing
// its devDependencies). So when TypeScript is not here yet, it is installed
// here first (devDependencies only, no scripts: this one is not run again).
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(root, "node_modules", "typescript", "bin", "tsc");
// The outer install's settings (its prefix, --omit=dev, --global) must not
// steer the install of this folder's own devDependencies.
const env = Object.fromEntries(
  Object.entries(process.env).filter(([k]) => !/^npm_(config|package|lifecycle)_/i.test(k) || /^npm_config_(registry|cache|userconfig|proxy|https_proxy|noproxy|cafile|strict_ssl)$/i.test(k)),
);
if (!existsSync(tsc)) {
  execFileSync("npm", ["install", "--no-save", "--ignore-scripts", "--include=dev", "--no-audit", "--no-fund"], {
    cwd: root,
    env,
    stdio: ["ignore", "inherit", "inherit"],
  });
}
execFileSync(process.execPath, [tsc, "-p", "tsconfig.json"], { cwd: root, stdio: ["ignore", "inherit", "inherit"] });
