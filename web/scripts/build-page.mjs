// Builds the served page's copy of @lingstream/client: one ES module from packages/client/src (livekit-client left
// out: the page loads the vendored bundle itself), written to service/http/web/lingstream-client.js, which is
// committed (the service ships it as package data and needs no npm at run time or install time). A test builds it
// again into a temporary file and checks the committed one is the same (tests/unit/web/test_packages.py).
//
//   node scripts/build-page.mjs [OUTFILE]      (from web/; npm run build:page)
import { build } from "esbuild";
import { fileURLToPath } from "node:url";

const web = fileURLToPath(new URL("..", import.meta.url));
const outfile = process.argv[2] ?? `${web}../service/http/web/lingstream-client.js`;
await build({
  absWorkingDir: web,
  entryPoints: ["packages/client/src/index.ts"],
  bundle: true,
  format: "esm",
  target: "es2022",
  external: ["livekit-client"],
  legalComments: "none",
  banner: {
    js:
      "// @lingstream/client for the served page, generated from web/packages/client/src by `npm run build:page` in web/\n" +
      "// (tests/unit/web/test_packages.py checks it equals a fresh build): do not edit.",
  },
  outfile,
  logLevel: "warning",
});
