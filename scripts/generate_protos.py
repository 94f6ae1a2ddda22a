"""Regenerates the Python contract package `funnel/` from `protos/`.

Usage: python scripts/generate_protos.py [--out DIR]

The committed stubs must equal this script's output; tests/contract/test_stubs_fresh.py
fails otherwise. grpcio-tools is pinned in pyproject.toml so the output is reproducible.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

# grpcio-tools ships neither a py.typed marker nor a stubs package.
from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
# google/rpc and google/api, imported by the contract; Python takes their stubs from
# googleapis-common-protos.
THIRD_PARTY = ROOT / "third_party" / "googleapis"


def proto_files() -> list[pathlib.Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def declares_service(proto: pathlib.Path) -> bool:
    """Whether the file declares a service (formatted protos start it on its own line):
    only such a file gets a `_pb2_grpc.py`, which would otherwise be empty."""
    return re.search(r"^service \w+ \{", proto.read_text(encoding="utf-8"), re.M) is not None


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Writes the stubs under out_dir and returns the generated files."""
    import grpc_tools

    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    generated: list[pathlib.Path] = []
    for proto in proto_files():
        services = declares_service(proto)
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"-I{THIRD_PARTY}",
                f"-I{well_known}",
                f"--python_out={out_dir}",
                f"--pyi_out={out_dir}",
                *([f"--grpc_python_out={out_dir}"] if services else []),
                str(proto.relative_to(PROTO_ROOT)),
            ]
        )
        if status != 0:
            raise SystemExit(f"protoc failed for {proto}")
        stem = out_dir / proto.relative_to(PROTO_ROOT).with_suffix("")
        suffixes = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py") if services else ("_pb2.py", "_pb2.pyi")
        generated += [stem.with_name(stem.name + suffix) for suffix in suffixes]
        # Every directory on the way to a generated module is a regular package, so
        # the contract installs with the services' wheels like any other package.
        package = stem.parent
        while package != out_dir:
            (package / "__init__.py").touch()
            generated.append(package / "__init__.py")
            package = package.parent
    return sorted(set(generated))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT)
    args = parser.parse_args(argv)
    written = generate(args.out)
    print(f"generated {len(written)} files under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
