"""The protos are the product's face: buf-style naming and complete documentation,
the conventions of every RPC written once (protos/README.md)."""

import pathlib
import re

from google.api import field_behavior_pb2
from google.protobuf import descriptor_pb2

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "protos" / "README.md"

# Paths inside FileDescriptorProto source info (descriptor.proto field numbers).
PACKAGE, MESSAGE, ENUM, SERVICE = 2, 4, 5, 6
FIELD, NESTED_MESSAGE, NESTED_ENUM = 2, 3, 4
ENUM_VALUE, METHOD = 2, 2


def _comments(file) -> dict[tuple, str]:
    return {
        tuple(location.path): (location.leading_comments + location.trailing_comments).strip()
        for location in file.source_code_info.location
    }


def _words(text: str) -> str:
    """The text with its line breaks and comment wrapping undone."""
    return " ".join(text.split())


def _project_files(descriptor_set):
    return [f for f in descriptor_set.file if f.package.startswith("funnel.")]


def _walk_messages(messages, path):
    for index, message in enumerate(messages):
        here = path + (index,)
        yield message, here
        yield from _walk_messages(message.nested_type, here + (NESTED_MESSAGE,))


def test_packages_match_their_folders(descriptor_set):
    files = _project_files(descriptor_set)
    assert files
    for file in files:
        assert re.fullmatch(r"funnel\.[a-z]+\.v\d+", file.package), file.package
        assert file.name.rsplit("/", 1)[0] == file.package.replace(".", "/"), file.name


def _stem(file) -> str:
    return file.name.rsplit("/", 1)[1].removesuffix(".proto")


def test_every_name_is_in_the_file_of_its_kind(descriptor_set):
    """protos/README.md, "Where a name is defined": a service alone in its file, its
    requests and responses in the matching messages file with the parts only they
    carry, the resources in types.proto, the enums in enums.proto, the error reasons
    and their encoding in errors.proto."""
    files = _project_files(descriptor_set)
    by_stem = {(file.package, _stem(file)): file for file in files}
    uses = {}  # message or enum full name -> the files whose messages refer to it
    for file in files:
        for message, _ in _walk_messages(file.message_type, (MESSAGE,)):
            for field in message.field:
                uses.setdefault(field.type_name, set()).add(file.name)
    kinds = set()
    for file in files:
        stem = _stem(file)
        messages = [message.name for message in file.message_type]
        enums = [enum.name for enum in file.enum_type]
        if stem == "service" or stem.endswith("_service"):
            kinds.add("service")
            assert len(file.service) == 1 and not messages and not enums, file.name
            paired = by_stem[(file.package, stem.removesuffix("service") + "messages")]
            rpc_messages = {f"{m.name}{end}" for m in file.service[0].method for end in ("Request", "Response")}
            assert rpc_messages <= {message.name for message in paired.message_type}, file.name
        elif stem == "messages" or stem.endswith("_messages"):
            kinds.add("messages")
            assert not file.service and not enums, file.name
            service = by_stem[(file.package, stem.removesuffix("messages") + "service")].service[0]
            rpc_messages = {f"{m.name}{end}" for m in service.method for end in ("Request", "Response")}
            for name in set(messages) - rpc_messages:
                assert uses.get(f".{file.package}.{name}") == {file.name}, f"{file.name}: {name}"
        elif stem == "types":
            kinds.add(stem)
            assert not file.service and not enums, file.name
            assert not [name for name in messages if name.endswith(("Request", "Response"))], file.name
        elif stem == "enums":
            kinds.add(stem)
            assert not file.service and not messages and enums and "ErrorReason" not in enums, file.name
        elif stem == "errors":
            kinds.add(stem)
            assert not file.service and enums == ["ErrorReason"] and messages == ["ErrorDetails"], file.name
        else:
            raise AssertionError(f"{file.name} is none of the kinds of protos/README.md")
    assert kinds == {"service", "messages", "types", "enums", "errors"}


def test_every_rpc_has_its_own_request_and_response(descriptor_set):
    for file in _project_files(descriptor_set):
        for service in file.service:
            for method in service.method:
                assert method.input_type == f".{file.package}.{method.name}Request", method.name
                assert method.output_type == f".{file.package}.{method.name}Response", method.name


def test_enums_start_with_a_prefixed_unspecified_zero(descriptor_set):
    for file in _project_files(descriptor_set):
        enums = list(file.enum_type)
        for message, _ in _walk_messages(file.message_type, (MESSAGE,)):
            enums += list(message.enum_type)
        for enum in enums:
            prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper()
            assert enum.value[0].number == 0 and enum.value[0].name == f"{prefix}_UNSPECIFIED", enum.name
            if enum.name != "ErrorReason":  # reason names are the wire strings, unprefixed on purpose
                for value in enum.value:
                    assert value.name.startswith(prefix + "_"), f"{enum.name}.{value.name}"


def test_every_service_rpc_message_field_and_enum_is_documented(descriptor_set):
    undocumented = []
    for file in _project_files(descriptor_set):
        comments = _comments(file)
        for s, service in enumerate(file.service):
            if not comments.get((SERVICE, s)):
                undocumented.append(service.name)
            for m, method in enumerate(service.method):
                if not comments.get((SERVICE, s, METHOD, m)):
                    undocumented.append(f"{service.name}.{method.name}")
        for e, enum in enumerate(file.enum_type):
            if not comments.get((ENUM, e)):
                undocumented.append(enum.name)
        for message, path in _walk_messages(file.message_type, (MESSAGE,)):
            if message.options.map_entry:  # synthesized by protoc for map fields
                continue
            for f, field in enumerate(message.field):
                if not comments.get(path + (FIELD, f)):
                    undocumented.append(f"{message.name}.{field.name}")
    assert not undocumented, f"{len(undocumented)} undocumented: {undocumented}"


def test_every_rpc_comment_names_its_errors_or_says_it_has_none(descriptor_set):
    missing = []
    for file in _project_files(descriptor_set):
        comments = _comments(file)
        for s, service in enumerate(file.service):
            for m, method in enumerate(service.method):
                text = comments.get((SERVICE, s, METHOD, m), "")
                if "Errors:" not in text:
                    missing.append(f"{service.name}.{method.name}")
    assert not missing, missing


def test_every_request_id_documents_its_scope_and_retention(descriptor_set):
    undocumented = []
    for file in _project_files(descriptor_set):
        comments = _comments(file)
        for message, path in _walk_messages(file.message_type, (MESSAGE,)):
            for f, field in enumerate(message.field):
                if field.name == "request_id" and message.name.endswith("Request"):
                    text = comments.get(path + (FIELD, f), "")
                    if "scoped to the caller" not in text or "retention" not in text:
                        undocumented.append(f"{message.name}.request_id")
    assert not undocumented, undocumented


# Phrases of the conventions of every RPC: in protos/README.md, once, and in no proto.
SHARED_CONVENTIONS = [
    "Unicode code points in NFC",
    "scoped to the caller (token subject), the RPC and the workspace, and kept for the server's retention",
    "Integer inputs",
    "points in time are RFC 3339 strings in UTC",
    "Not repeated there: any RPC can also fail with",
]


def test_the_conventions_of_every_rpc_are_written_once(descriptor_set):
    readme = _words(README.read_text(encoding="utf-8"))
    for phrase in SHARED_CONVENTIONS:
        assert readme.count(phrase) == 1, phrase
    repeated = []
    for file in _project_files(descriptor_set):
        comments = [
            _words(
                " ".join([location.leading_comments, location.trailing_comments, *location.leading_detached_comments])
            )
            for location in file.source_code_info.location
        ]
        repeated += [(file.name, phrase) for phrase in SHARED_CONVENTIONS if any(phrase in c for c in comments)]
    assert repeated == []


def test_every_service_file_points_to_the_conventions(descriptor_set):
    """Its file comment keeps the service's own laws and names protos/README.md."""
    service_files = [file for file in _project_files(descriptor_set) if file.service]
    assert len(service_files) >= 3
    for file in service_files:
        assert "protos/README.md" in _comments(file).get((PACKAGE,), ""), file.name


def test_the_reasons_any_rpc_can_fail_with_are_reasons_of_every_package(descriptor_set):
    readme = _words(README.read_text(encoding="utf-8"))
    common = readme.split("any RPC can also fail with", 1)[1].split("; nothing is applied then", 1)[0]
    reasons = re.findall(r"`([A-Z][A-Z_]+)`", common)
    assert len(reasons) >= 10, common
    catalogues = {
        file.package: {value.name for value in enum.value}
        for file in _project_files(descriptor_set)
        for enum in file.enum_type
        if enum.name == "ErrorReason"
    }
    assert set(catalogues) == {file.package for file in _project_files(descriptor_set)}
    for package, catalogue in catalogues.items():
        assert set(reasons) <= catalogue, f"{package}.ErrorReason lacks {sorted(set(reasons) - catalogue)}"


# --- (google.api.field_behavior), AIP-203: protos/README.md, "Field behavior" --------

REQUIRED, OUTPUT_ONLY = field_behavior_pb2.REQUIRED, field_behavior_pb2.OUTPUT_ONLY
# Served by gates, not by funnel: what its requests carry is funnel's output.
SERVED_ELSEWHERE = {"CompletionGate"}


def _behavior(field) -> list[int]:
    """The field's (google.api.field_behavior) values, read from its options (parsed
    again, in case the set was read before the extension was known)."""
    options = descriptor_pb2.FieldOptions()
    options.ParseFromString(field.options.SerializeToString())
    return list(options.Extensions[field_behavior_pb2.field_behavior])


def _messages(descriptor_set) -> dict[str, tuple]:
    """Full name (`.pkg.Name`) -> (file, index, message) of every top-level message."""
    return {
        f".{file.package}.{message.name}": (file, index, message)
        for file in _project_files(descriptor_set)
        for index, message in enumerate(file.message_type)
    }


def _inputs(descriptor_set) -> set[str]:
    """The messages a request to a funnel service can carry: the requests and every
    message reachable from their fields."""
    messages = _messages(descriptor_set)
    pending = [
        method.input_type
        for file in _project_files(descriptor_set)
        for service in file.service
        if service.name not in SERVED_ELSEWHERE
        for method in service.method
    ]
    found: set[str] = set()
    while pending:
        name = pending.pop()
        if name in messages and name not in found:
            found.add(name)
            pending += [f.type_name for f in messages[name][2].field if f.type == f.TYPE_MESSAGE]
    return found


def _assigned_by_the_service(file, field, comment: str) -> bool:
    return (
        field.name in ("sequence", "revision", "epoch")
        or (field.name.endswith("_time") and field.name != "authoritative_time")
        or comment.startswith("Assigned by this service")
        or field.type_name == f".{file.package}.Caller"
    )


def test_required_fields_are_annotated_where_their_comments_say_so(descriptor_set):
    wrong = []
    for name, (file, index, message) in _messages(descriptor_set).items():
        comments = _comments(file)
        for f, field in enumerate(message.field):
            comment = _words(comments.get((MESSAGE, index, FIELD, f), ""))
            documented = comment.startswith("Required") or "(required" in comment
            if documented != (REQUIRED in _behavior(field)):
                wrong.append(f"{name}.{field.name}")
    assert wrong == []


def test_required_is_only_on_input_and_output_only_never(descriptor_set):
    inputs = _inputs(descriptor_set)
    assert ".funnel.lifecycle.v1.ParentLink" in inputs and ".funnel.completion.v1.TurnEnd" in inputs
    wrong = []
    for name, (_, _, message) in _messages(descriptor_set).items():
        for field in message.field:
            behavior = _behavior(field)
            if (REQUIRED in behavior and name not in inputs) or (OUTPUT_ONLY in behavior and name in inputs):
                wrong.append(f"{name}.{field.name}")
    assert wrong == []


def test_what_the_service_assigns_in_its_resources_is_output_only(descriptor_set):
    inputs = _inputs(descriptor_set)
    wrong, annotated = [], 0
    for name, (file, index, message) in _messages(descriptor_set).items():
        comments = _comments(file)
        for f, field in enumerate(message.field):
            comment = _words(comments.get((MESSAGE, index, FIELD, f), ""))
            expected = (
                file.name.endswith("/types.proto")
                and name not in inputs
                and _assigned_by_the_service(file, field, comment)
            )
            annotated += expected
            if expected != (OUTPUT_ONLY in _behavior(field)):
                wrong.append(f"{name}.{field.name}")
    assert wrong == []
    assert annotated >= 20


def test_the_annotations_reach_the_generated_python():
    """The generated modules import google.api.field_behavior_pb2 (from
    googleapis-common-protos) and carry the options."""
    from funnel.completion.v1 import types_pb2 as completion_types
    from funnel.lifecycle.v1 import messages_pb2 as lifecycle_messages

    def behavior(message, field: str) -> list[int]:
        return list(message.DESCRIPTOR.fields_by_name[field].GetOptions().Extensions[field_behavior_pb2.field_behavior])

    assert behavior(lifecycle_messages.RegisterTaskRequest, "workspace_id") == [REQUIRED]
    assert behavior(lifecycle_messages.RegisterTaskRequest, "request_id") == []
    assert behavior(completion_types.CompletionEvent, "sequence") == [OUTPUT_ONLY]
