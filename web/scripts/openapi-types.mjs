// Puts the TypeScript types generated from the OpenAPI document (web/openapi/lingstream.d.ts, committed and checked
// against the API by its own test) into @lingstream/client as src/openapi.gen.d.ts (not committed), and with
// `--dist` beside the built declarations in dist/, so the package's REST and control-protocol types are those types
// and ship with it: the package holds no hand-written copy of the API's shapes. The build scripts run it.
//
//   node scripts/openapi-types.mjs [--dist] [CLIENT_DIR]      (from web/; CLIENT_DIR: a copy of packages/client)
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const web = fileURLToPath(new URL("..", import.meta.url));
const given = process.argv.slice(2).find((arg) => !arg.startsWith("--"));
const client = given ? `${given.replace(/\/+$/, "")}/` : `${web}packages/client/`;
const text =
  "// Copied from web/openapi/lingstream.d.ts by web/scripts/openapi-types.mjs: do not edit.\n" +
  readFileSync(`${web}openapi/lingstream.d.ts`, "utf8");
const into = process.argv.includes("--dist") ? `${client}dist/` : `${client}src/`;
mkdirSync(into, { recursive: true });
let current = null;
try {
  current = readFileSync(`${into}openapi.gen.d.ts`, "utf8");
} catch {
  current = null;
}
if (current !== text) writeFileSync(`${into}openapi.gen.d.ts`, text);
