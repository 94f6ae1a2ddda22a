"""The committed contract package must be exactly what scripts/generate_protos.py makes."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("generate_protos", ROOT / "scripts" / "generate_protos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_equal_freshly_generated_ones(tmp_path):
    generated = _generator().generate(tmp_path)
    assert generated, "the generator produced nothing"
    stale = []
    for fresh in generated:
        relative = fresh.relative_to(tmp_path)
        committed = ROOT / relative
        if not committed.exists() or committed.read_bytes() != fresh.read_bytes():
            stale.append(str(relative))
    assert not stale, f"stale or missing stubs, run scripts/generate_protos.py: {stale}"


def test_every_proto_has_stubs(descriptor_set):
    """Messages and enums for every file, service stubs for the files of services
    and for no other (their `_pb2_grpc.py` would hold nothing)."""
    generator = _generator()
    protos = sorted((ROOT / "protos").rglob("*.proto"))
    assert protos
    with_services = {file.name for file in descriptor_set.file if file.service}
    assert with_services
    for proto in protos:
        name = proto.relative_to(ROOT / "protos").as_posix()
        assert generator.declares_service(proto) == (name in with_services), name
        stem = ROOT / proto.relative_to(ROOT / "protos").with_suffix("")
        assert stem.with_name(stem.name + "_pb2.py").exists(), proto
        assert stem.with_name(stem.name + "_pb2_grpc.py").exists() == (name in with_services), proto
