// Builds the example from the *packed* SDK packages, as an app that installed them from a registry would get them:
// the two tarballs (`npm pack` of web/packages/client and web/packages/react) are unpacked into this build's own
// node_modules/@lingstream/, react, react-dom and livekit-client come from web/node_modules (the versions
// package.json names), and esbuild bundles src/main.jsx with them into OUT/app.js beside index.html.
//
//   node build.mjs CLIENT.tgz REACT.tgz OUT      (tests/e2e/test_browser.py packs, builds and serves it)
import { execFileSync } from "node:child_process";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = fileURLToPath(new URL(".", import.meta.url));
const [clientTarball, reactTarball, out] = process.argv.slice(2);
if (!out) {
  console.error("usage: node build.mjs CLIENT.tgz REACT.tgz OUT");
  process.exit(2);
}
const modules = `${out}/node_modules`;
rmSync(modules, { recursive: true, force: true });
for (const [tarball, name] of [[clientTarball, "client"], [reactTarball, "react"]]) {
  const into = `${modules}/@lingstream/${name}`;
  mkdirSync(into, { recursive: true });
  execFileSync("tar", ["-xzf", tarball, "-C", into, "--strip-components=1"]);
}
await build({
  absWorkingDir: here,
  entryPoints: ["src/main.jsx"],
  bundle: true,
  format: "esm",
  target: "es2022",
  jsx: "automatic",
  nodePaths: [modules, `${here}../../node_modules`],
  define: { "process.env.NODE_ENV": '"production"' },
  minify: true,
  outfile: `${out}/app.js`,
  logLevel: "warning",
});
copyFileSync(`${here}index.html`, `${out}/index.html`);
