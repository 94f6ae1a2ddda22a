"""Operator papercuts (issue 23, item 7), each as the command a user runs: the
installed `funnel` CLI as a subprocess, against real service processes where a
server is involved."""

from __future__ import annotations

import importlib
import json
import logging
import os
import pkgutil
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import jwt
import pytest
from google.protobuf.descriptor import Descriptor
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from funnel.runtime import logs
from funnel_cli import supervisor
from tests.funnel_up import funnel_up
from tests.reliability.harness import unused_port

FUNNEL = Path(sys.executable).parent / "funnel"


def funnel(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(FUNNEL), *args], capture_output=True, text=True, timeout=60, **kwargs)


# -- `funnel token issue` never makes a key ------------------------------------


def test_token_issue_without_a_key_refuses_and_names_the_directory_it_looked_in(tmp_path):
    result = funnel("token", "issue", "--workspace", "acme", "--role", "host", cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    looked_in = tmp_path / "funnel-data" / "tls"
    assert f"no token signing key in {looked_in}" in result.stderr, result.stderr
    assert "funnel up" in result.stderr
    # Nothing was made: no key pair whose tokens every running service would reject.
    assert not (tmp_path / "funnel-data").exists()

    elsewhere = tmp_path / "elsewhere"
    result = funnel("token", "issue", "--workspace", "acme", "--role", "host", "--data-dir", str(elsewhere))
    assert result.returncode == 1 and str(elsewhere / "tls") in result.stderr
    assert not elsewhere.exists()


def test_pki_init_makes_the_key_that_token_issue_then_signs_with(tmp_path):
    made = funnel("pki", "init", "--data-dir", str(tmp_path / "data"))
    assert (
        made.returncode == 0
        and f"made the local PKI and token signing key in {tmp_path / 'data' / 'tls'}" in made.stdout
    )
    key = (tmp_path / "data" / "tls" / "token-signing.key").read_bytes()
    again = funnel("pki", "init", "--data-dir", str(tmp_path / "data"))
    assert again.returncode == 0 and again.stdout.startswith("kept ")
    assert (tmp_path / "data" / "tls" / "token-signing.key").read_bytes() == key
    issued = funnel("token", "issue", "--workspace", "acme", "--role", "host", "--data-dir", str(tmp_path / "data"))
    assert issued.returncode == 0 and issued.stdout.count(".") == 2


# -- against `funnel up --demo` --------------------------------------------------


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    """`funnel up --demo` as a user starts it: one task of workspace demo walked to COMPLETED."""
    directory = tmp_path_factory.mktemp("papercuts")
    with funnel_up(directory, "--demo", "--data-dir", str(directory / "data"), ready="Demo finished", wait=90) as up:
        task = next(line.split()[3] for line in up.lines if line.startswith("1. register"))
        yield {
            "data": directory / "data",
            "lifecycle": up.lifecycle,
            "completion": up.completion,
            "task": task,
            "output": "".join(up.lines),
        }


def against(up) -> list[str]:
    return ["--data-dir", str(up["data"]), "--lifecycle", up["lifecycle"], "--completion", up["completion"]]


# -- piping to `head` ends quietly -------------------------------------------------


@pytest.mark.parametrize("reader", ["head -n 0", "true"])
@pytest.mark.parametrize(
    "command",
    [
        ["task", "list"],
        ["task", "events", "{task}"],
        ["run", "list", "-o", "json"],
        ["task", "watch", "--count", "2", "-o", "json"],
    ],
)
def test_a_reader_that_stops_reading_ends_the_command_quietly(up, command, reader):
    argv = " ".join(shlex.quote(a.format(task=up["task"])) for a in [str(FUNNEL), *command, *against(up)])
    # The reader is gone before the command writes: its first write meets a closed pipe.
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {argv} | {reader}"], capture_output=True, text=True, timeout=60
    )
    assert done.stderr == "" and done.stdout == ""
    assert done.returncode == 141  # 128 + SIGPIPE, as a Unix tool ended by SIGPIPE reports it


def test_a_command_piped_to_head_prints_its_first_lines(up):
    argv = " ".join(shlex.quote(a) for a in [str(FUNNEL), "task", "list", *against(up)])
    done = subprocess.run(["bash", "-c", f"{argv} | head -n 1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split()[:2] == ["TASK", "GEN"] and done.stderr == ""


# -- `funnel task register` and `funnel audit list` -------------------------------


def run_json(up, *args: str) -> tuple[int, object, str]:
    done = funnel(*args, *against(up), "-o", "json")
    return done.returncode, json.loads(done.stdout) if done.stdout else None, done.stderr


def test_task_register_makes_a_task_and_a_retry_with_its_request_id_is_the_first_answer(up):
    code, made, err = run_json(up, "task", "register", "cli-registered", "--request-id", "op-register-1")
    assert code == 0, err
    assert (made["task"]["task_id"], made["task"]["generation"], made["task"]["state"]) == (
        "cli-registered",
        "1",
        "GENERATION_STATE_REGISTERED",
    )
    assert made["event"]["intent"] == "INTENT_REGISTER_TASK"
    assert made["event"]["cause"] == {"source": "funnel-cli", "reason": "registered by an operator"}
    assert run_json(up, "task", "register", "cli-registered", "--request-id", "op-register-1")[:2] == (0, made)
    code, _, err = run_json(up, "task", "register", "cli-registered")
    assert code == 1 and "TASK_ALREADY_EXISTS" in err
    # An attached child needs an active parent; a detached one any existing generation.
    code, _, err = run_json(up, "task", "register", "cli-child", "--parent", "cli-registered")
    assert code == 1 and "PARENT_NOT_ACTIVE" in err
    code, child, err = run_json(up, "task", "register", "cli-child", "--parent", "cli-registered", "--detached")
    assert code == 0, err
    assert child["task"]["parent"] == {
        "task_id": "cli-registered",
        "generation": "1",
        "mode": "PARENT_LINK_MODE_DETACHED",
    }
    code, _, err = run_json(up, "task", "register", "cli-orphan", "--parent", "no-such-parent")
    assert code == 3 and "TASK_NOT_FOUND" in err
    table = funnel("task", "register", "cli-table", *against(up))
    assert table.returncode == 0 and table.stdout.split()[:2] == ["task", "cli-table"]
    assert "REGISTERED" in table.stdout
    code, listed, _ = run_json(up, "task", "list", "--parent", "cli-registered")
    assert [t["task_id"] for t in listed["tasks"]] == ["cli-child"]


def test_audit_list_shows_the_run_the_demo_closed(up):
    code, audit, err = run_json(up, "audit", "list", "--task", up["task"])
    assert code == 0, err
    (entry,) = audit["entries"]
    assert (entry["action"], entry["task_id"]) == ("task.completed", up["task"])
    assert entry["metadata"]["outcome"] and entry["metadata"]["closed_by"] == "agent"
    code, runs, _ = run_json(up, "run", "list", "--task", up["task"])
    assert entry["run_id"] == runs["runs"][0]["run_id"]
    assert entry in run_json(up, "audit", "list")[1]["entries"]
    assert run_json(up, "audit", "list", "--run", entry["run_id"])[1] == audit
    assert run_json(up, "audit", "list", "--task", "cli-registered")[1] == {"entries": []}
    table = funnel("audit", "list", "--run", entry["run_id"], *against(up))
    lines = table.stdout.splitlines()
    assert table.returncode == 0 and lines[0].split()[:4] == ["AUDIT", "ACTION", "TASK", "RUN"]
    assert lines[1].split()[1:4] == ["task.completed", up["task"], entry["run_id"]]


# -- the environment variables every command honours ----------------------------


def test_every_command_reads_the_addresses_workspace_and_data_directory_from_the_environment(up, tmp_path):
    env = {
        **os.environ,
        "FUNNEL_DATA_DIR": str(up["data"]),
        "FUNNEL_LIFECYCLE": up["lifecycle"],
        "FUNNEL_COMPLETION": up["completion"],
        "FUNNEL_WORKSPACE": "demo",
    }

    def bare(*args: str, **more: str) -> subprocess.CompletedProcess:
        return funnel(*args, env={**env, **more}, cwd=tmp_path)  # no ./funnel-data here: only the variables tell

    for command, key in [
        (("task", "list"), "tasks"),
        (("run", "list"), "runs"),
        (("completion", "list"), "completions"),
        (("audit", "list"), "entries"),
        (("outbox",), "completions"),
    ]:
        done = bare(*command, "-o", "json")
        assert done.returncode == 0, (command, done.stderr)
        assert up["task"] in done.stdout or command == ("outbox",), command
        assert key in json.loads(done.stdout)
    assert bare("task", "get", up["task"], "-o", "json").returncode == 0
    exported = bare("transcript", "export", up["task"])
    assert exported.returncode == 0, exported.stderr  # the demo's task has no transcript: nothing written
    assert bare("transcript", "export", up["task"], FUNNEL_COMPLETION=f"127.0.0.1:{unused_port()}").returncode == 1
    # FUNNEL_WORKSPACE names the workspace: another one holds none of the demo's tasks.
    assert json.loads(bare("task", "list", "-o", "json", FUNNEL_WORKSPACE="elsewhere").stdout) == {"tasks": []}
    # A flag wins over its variable.
    assert (
        bare(
            "task", "list", "--lifecycle", up["lifecycle"], "-o", "json", FUNNEL_LIFECYCLE=f"127.0.0.1:{unused_port()}"
        ).returncode
        == 0
    )
    unreachable = bare("task", "list", FUNNEL_LIFECYCLE=f"127.0.0.1:{unused_port()}")
    assert unreachable.returncode == 5 and "UNAVAILABLE" in unreachable.stderr
    # `funnel token issue` reads the data directory, issuer and audience as `funnel mcp` and the services do.
    token = bare(
        "token",
        "issue",
        "--workspace",
        "demo",
        "--role",
        "viewer",
        FUNNEL_TOKEN_ISSUER="https://issuer.example",
        FUNNEL_TOKEN_AUDIENCE="funnel-api",
    )
    assert token.returncode == 0, token.stderr
    claims = jwt.decode(token.stdout.strip(), options={"verify_signature": False})
    assert (claims["iss"], claims["aud"]) == ("https://issuer.example", "funnel-api")
    # `funnel demo` and `funnel up` read them too, and every --help says which.
    for command in (
        ["task", "list"],
        ["task", "register"],
        ["audit", "list"],
        ["run", "get"],
        ["outbox"],
        ["demo"],
        ["transcript", "export"],
        ["transcript", "import"],
        ["token", "issue"],
        ["pki", "init"],
        ["up"],
        ["mcp"],
        ["ui"],
    ):
        text = bare(*command, "--help").stdout
        assert "FUNNEL_DATA_DIR" in text, command
        if command[0] not in ("token", "pki", "up"):
            assert "FUNNEL_COMPLETION" in text, command
        if command[0] not in ("token", "pki", "up", "demo", "transcript"):
            assert "FUNNEL_LIFECYCLE" in text, command
        if command[0] not in ("demo", "token", "pki", "up"):
            assert "FUNNEL_WORKSPACE" in text, command


# -- a token caller without a client certificate is told that one is needed --------


def test_a_token_caller_without_a_client_certificate_is_told_the_lifecycle_service_needs_one(up):
    tls = up["data"] / "tls"
    token = funnel("token", "issue", "--workspace", "demo", "--role", "host", "--data-dir", str(up["data"])).stdout
    # --ca alone: the services' CA and a token, no client certificate (a token caller from elsewhere).
    caller = [
        "--ca",
        str(tls / "ca.pem"),
        "--token",
        token.strip(),
        "--lifecycle",
        up["lifecycle"],
        "--completion",
        up["completion"],
    ]
    for command in (["task", "list"], ["task", "register", "cli-no-certificate"], ["demo"]):
        done = funnel(*command, *caller)
        assert done.returncode in (1, 5), (command, done.stderr)
        assert "without a client certificate, and the lifecycle service requires one" in done.stderr, done.stderr
        assert "--cert and --key" in done.stderr and "Traceback" not in done.stderr
    # The completion service asks for none: the same caller reads runs there.
    assert funnel("run", "list", *caller).returncode == 0
    # With the certificate the same call works; a port nobody listens on is no handshake and gets no such hint.
    certificate = ["--cert", str(tls / "client.pem"), "--key", str(tls / "client.key")]
    assert funnel("task", "list", *caller, *certificate).returncode == 0
    nobody = funnel("task", "list", *caller[:4], "--lifecycle", f"127.0.0.1:{unused_port()}")
    assert nobody.returncode == 5 and "client certificate" not in nobody.stderr


# -- reflection under `funnel up`, complete enough for grpcurl-like clients ---------


def reflection_channel(up, service: str) -> grpc.Channel:
    tls = up["data"] / "tls"
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(tls / "ca.pem").read_bytes(),
        # The lifecycle service's handshake requires a client certificate (docs/security.md, "Transport").
        private_key=(tls / "client.key").read_bytes() if service == "lifecycle" else None,
        certificate_chain=(tls / "client.pem").read_bytes() if service == "lifecycle" else None,
    )
    return grpc.secure_channel(up[service], credentials)


def resolve_fully(message: Descriptor, seen: set[str]) -> None:
    """Every field's type, down to the last nested message and enum."""
    if message.full_name in seen:
        return
    seen.add(message.full_name)
    for field in message.fields:
        assert field.type != field.TYPE_MESSAGE or field.message_type is not None, field.full_name
        assert field.type != field.TYPE_ENUM or field.enum_type.values, field.full_name
        if field.message_type is not None:
            resolve_fully(field.message_type, seen)


@pytest.mark.parametrize(
    "service, method, expected",
    [
        (
            "completion",
            "funnel.completion.v1.CompletionService.CompleteRun",
            {"funnel.completion.v1.CompleteRunRequest"},
        ),
        ("completion", "funnel.completion.v1.CompletionService.ClaimTask", {"google.protobuf.Duration"}),
        ("completion", "funnel.completion.v1.TranscriptService.ImportTranscript", set()),
        (
            "lifecycle",
            "funnel.lifecycle.v1.TaskLifecycleService.RegisterTask",
            {"funnel.lifecycle.v1.Cause", "funnel.lifecycle.v1.ParentLink"},
        ),
    ],
)
def test_reflection_is_on_under_funnel_up_and_describes_a_method_down_to_every_type(up, service, method, expected):
    assert "gRPC reflection on both" in up["output"]
    with reflection_channel(up, service) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = database.get_services()
        assert method.rsplit(".", 1)[0] in services
        # Every service listed is described (grpc.reflection.v1 too, which grpcio-reflection lacks).
        assert all(database.FindFileContainingSymbol(name).service for name in services)
        assert "grpc.reflection.v1.ServerReflection" in services
        # What `grpcurl describe Service.Method` asks first: the file containing the method's name
        # (grpcio-reflection alone answered "not found": grpc/grpc#34743).
        file = database.FindFileContainingSymbol(method)
        assert file.package == method.rsplit(".", 2)[0]
        # A fresh pool, fed only by reflection, resolves the method and its input type completely:
        # the files it imports (google/protobuf/*, google/rpc/*) came with the answer.
        pool = DescriptorPool(database)
        found = pool.FindMethodByName(method)
        seen: set[str] = set()
        resolve_fully(found.input_type, seen)
        resolve_fully(found.output_type, seen)
        assert {found.input_type.full_name, *expected} <= seen
        # The other names a client may ask for: an enum value, a field, the error details, health.
        for symbol in (
            "funnel.completion.v1.RUN_OUTCOME_SUCCEEDED"
            if service == "completion"
            else "funnel.lifecycle.v1.TERMINAL_OUTCOME_COMPLETED",
            f"{found.input_type.full_name}.{found.input_type.fields[0].name}",
            "google.rpc.ErrorInfo",
            "grpc.health.v1.Health",
            "grpc.health.v1.Health.Check",
        ):
            assert database.FindFileContainingSymbol(symbol).name, symbol
        with pytest.raises(KeyError):
            database.FindFileContainingSymbol(f"{method}.NoSuchThing")


def contract_symbols(package: str) -> list[str]:
    """Every service, message and enum that the files of `package` (e.g.
    `funnel.lifecycle.v1`) define, read from the generated modules."""
    found = []
    module_package = importlib.import_module(package)
    for module in pkgutil.iter_modules(module_package.__path__):
        if not module.name.endswith("_pb2"):
            continue
        file = importlib.import_module(f"{package}.{module.name}").DESCRIPTOR
        for kind in (file.services_by_name, file.message_types_by_name, file.enum_types_by_name):
            found += [descriptor.full_name for descriptor in kind.values()]
    return found


@pytest.mark.parametrize(
    "service, package", [("lifecycle", "funnel.lifecycle.v1"), ("completion", "funnel.completion.v1")]
)
def test_reflection_describes_every_symbol_of_its_contract(up, service, package):
    """Whichever file of its package defines a name, also the files the stubs do
    not import (those that declare the services, errors.proto, the gate's service)."""
    symbols = contract_symbols(package)
    assert {f"{package}.ErrorReason", f"{package}.ErrorDetails"} <= set(symbols)
    with reflection_channel(up, service) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        unresolved = []
        for symbol in symbols:
            try:
                file = database.FindFileContainingSymbol(symbol)
            except KeyError:
                unresolved.append(symbol)
                continue
            assert file.package == package, symbol
        assert unresolved == []


# -- the gRPC core's own lines go through the JSON formatter ---------------------


def test_the_grpc_cores_own_lines_are_json_lines_of_the_service_log(up):
    log = up["data"] / "lifecycle.log"
    # A handshake without a client certificate: the core itself logs its failure.
    tls = up["data"] / "tls"
    funnel("task", "list", "--lifecycle", up["lifecycle"], "--ca", str(tls / "ca.pem"), "--token", "not-a-token")
    deadline = time.monotonic() + 30
    while True:
        lines = log.read_text(encoding="utf-8").splitlines()
        entries = [json.loads(line) for line in lines]  # every line is a JSON object, or this fails
        core = [e for e in entries if e["logger"] == "grpc.core" and "Handshake failed" in e["message"]]
        if core:
            break
        assert time.monotonic() < deadline, lines[-5:]
        time.sleep(0.2)
    entry = core[-1]
    assert entry["level"] == "INFO" and "PEER_DID_NOT_RETURN_A_CERTIFICATE" in entry["message"]
    assert entry["source"].startswith("ssl_transport_security.cc:") and entry["native_thread"] > 0
    assert entry["time"].endswith("Z") and not entry["message"].startswith("I1")


def test_a_core_line_is_parsed_from_absls_format():
    assert logs.native_record("E1202 00:07:26.678545   20824 chttp2_transport.cc:1234] Something broke: details") == (
        logging.ERROR,
        "Something broke: details",
        {"source": "chttp2_transport.cc:1234", "native_thread": 20824},
    )
    assert logs.native_record("W0101 23:59:59.000001 7 a/b.cc:1] careful")[0] == logging.WARNING
    assert logs.native_record("F0101 23:59:59.000001 7 a.cc:1] gone")[0] == logging.CRITICAL
    assert logs.native_record("some other library's line") == (
        logging.WARNING,
        "some other library's line",
        {"source": "stderr"},
    )


def test_funnel_up_no_reflection_serves_none(tmp_path):
    process = subprocess.Popen(
        [
            str(FUNNEL),
            "up",
            "--no-reflection",
            "--data-dir",
            str(tmp_path / "data"),
            "--lifecycle-port",
            "0",
            "--completion-port",
            "0",
            "--lifecycle-metrics-port",
            "-1",
            "--completion-metrics-port",
            "-1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        while not (lines and "both SERVING" in lines[-1]):
            line = process.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        output = "".join(lines)
        assert "gRPC reflection" not in output
        address = next(line.split()[1] for line in lines if line.startswith("completion_service"))
        up = {"data": tmp_path / "data", "completion": address}
        with reflection_channel(up, "completion") as channel, pytest.raises(grpc.RpcError) as refused:
            ProtoReflectionDescriptorDatabase(channel).get_services()
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=30)


# -- `funnel up` never waits for a service forever -----------------------------------


def test_a_service_stuck_before_serving_fails_the_start_at_the_deadline(tmp_path, monkeypatch):
    (tmp_path / "stuck_service.py").write_text("import sys, time\nprint('starting', flush=True)\ntime.sleep(120)\n")
    (tmp_path / "two_lines.py").write_text(
        "import sys, time\nsys.stdout.write('x metrics on http://127.0.0.1:1/metrics\\nx serving on 127.0.0.1:9\\n')\n"
        "sys.stdout.flush()\ntime.sleep(120)\n"
    )
    monkeypatch.setattr(supervisor, "READY_TIMEOUT", 2.0)
    env = {"PYTHONPATH": str(tmp_path)}
    started = time.monotonic()
    with pytest.raises(supervisor.StartupFailed, match="did not start within"):
        supervisor.spawn("stuck", "stuck_service", [], tmp_path / "stuck.log", env)
    assert time.monotonic() - started < 15
    # Both lines in one read: the second is not lost waiting for more.
    service = supervisor.spawn("two", "two_lines", [], tmp_path / "two.log", env)
    try:
        assert (service.address, service.metrics_url) == ("127.0.0.1:9", "http://127.0.0.1:1/metrics")
    finally:
        service.kill()
