#!/usr/bin/env bash
# Writes the buf image of a released contract: the protos/ (and the vendored
# third_party/googleapis/, when that ref has it) of a git ref, compiled by buf into
# contract/releases/VERSION.binpb. `buf breaking` checks the current protos against
# the newest image there (tests/contract/test_buf.py), so a release adds its image
# with this script and records its ref in contract/releases/README.md.
#
# Usage: scripts/release_contract_image.sh REF VERSION [OUT]
#   REF      a commit or tag of this repository, e.g. 590c314
#   VERSION  the release, e.g. 0.1.0 (the image is contract/releases/VERSION.binpb)
#   OUT      write the image here instead (an existing release image is never
#            overwritten: a released contract does not change)
#
# Needs git and buf: `npm ci` at the repository root installs buf into
# node_modules/.bin (or set BUF to a buf binary). Works offline; the image is the
# same, byte for byte, for the same ref.
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
  sed -n '8,13p' "$0" >&2
  exit 2
fi
ref=$1
version=$2
root=$(cd "$(dirname "$0")/.." && pwd)
out=${3:-$root/contract/releases/$version.binpb}
buf=${BUF:-$root/node_modules/.bin/buf}

[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "VERSION must be MAJOR.MINOR.PATCH, got '$version'" >&2; exit 2; }
[[ -x $buf ]] || { echo "no buf at $buf: run 'npm ci' at the repository root (or set BUF)" >&2; exit 1; }
commit=$(git -C "$root" rev-parse --verify --quiet "$ref^{commit}") || { echo "unknown git ref '$ref'" >&2; exit 1; }
[[ -e $out ]] && { echo "$out exists: a released image is never rewritten" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Only the protos of that commit and what they import, in a workspace of their own:
# nothing of the current checkout (its buf.yaml, its protos) leaks into the image.
git -C "$root" archive "$commit" protos | tar -x -C "$work"
printf 'version: v2\nmodules:\n  - path: protos\n' > "$work/buf.yaml"
if git -C "$root" cat-file -e "$commit:third_party/googleapis" 2>/dev/null; then
  git -C "$root" archive "$commit" third_party/googleapis | tar -x -C "$work"
  printf '  - path: third_party/googleapis\n' >> "$work/buf.yaml"
fi
mkdir -p "$(dirname "$out")"
# The image holds the protos as its files and what they import (google/protobuf,
# google/rpc) marked as imports, with source info so that breaks name their lines.
(cd "$work" && "$buf" build protos -o "$work/image.binpb")
mv "$work/image.binpb" "$out"
echo "wrote $out from $commit"
if [[ -z ${3:-} ]]; then
  echo "now add this row to contract/releases/README.md:"
  echo "| $version | \`$commit\` |"
fi
