// Generates src/gen/ from the repository's protos with the buf CLI and the local
// protoc-gen-es plugin (buf.gen.yaml): no Buf Schema Registry, no network.
// Runs on every build, so the client always matches protos/ as checked out.
import { execFileSync } from "node:child_process";
import { rmSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const here = join(dirname(fileURLToPath(import.meta.url)), "..");
const root = join(here, "..", "..");
// One buf workspace over the repository: the funnel protos and the vendored
// google/rpc protos they import (google/protobuf comes with buf and
// @bufbuild/protobuf/wkt). Given inline so that a buf.yaml elsewhere in the
// repository (for lint) cannot change what is generated here.
const config = JSON.stringify({
  version: "v2",
  modules: [{ path: "protos" }, { path: "third_party/googleapis" }],
});
// buf.gen.yaml's `clean` empties src/gen/; dist/ goes too, so that nothing
// compiled from a removed proto or test lingers.
rmSync(join(here, "dist"), { recursive: true, force: true });
execFileSync(
  join(here, "node_modules", ".bin", "buf"),
  ["generate", relative(here, root) || ".", "--template", "buf.gen.yaml", "--config", config],
  { cwd: here, stdio: "inherit" },
);
