import pathlib

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def descriptor_set(tmp_path_factory) -> descriptor_pb2.FileDescriptorSet:
    """Every project proto, compiled with its comments (source info)."""
    import grpc_tools

    out = tmp_path_factory.mktemp("descriptors") / "all.pb"
    protos = sorted(str(p.relative_to(ROOT / "protos")) for p in (ROOT / "protos").rglob("*.proto"))
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    status = protoc.main(
        [
            "protoc",
            f"-I{ROOT / 'protos'}",
            f"-I{ROOT / 'third_party' / 'googleapis'}",
            f"-I{well_known}",
            f"--descriptor_set_out={out}",
            "--include_source_info",
            *protos,
        ]
    )
    assert status == 0
    files = descriptor_pb2.FileDescriptorSet()
    files.ParseFromString(out.read_bytes())
    return files
