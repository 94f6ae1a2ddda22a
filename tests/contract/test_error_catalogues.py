"""One catalogue of error reasons per service, equal to the contract's ErrorReason enum."""

import pytest

from completion_service import errors as completion_errors
from funnel.completion.v1 import errors_pb2 as completion_errors_pb2
from funnel.lifecycle.v1 import errors_pb2 as lifecycle_errors_pb2
from lifecycle_service import errors as lifecycle_errors

# Each service's catalogue, the generated module of its errors.proto, its ErrorInfo domain.
CATALOGUES = [
    pytest.param(lifecycle_errors, lifecycle_errors_pb2, "funnel.lifecycle.v1", id="lifecycle"),
    pytest.param(completion_errors, completion_errors_pb2, "funnel.completion.v1", id="completion"),
]


@pytest.mark.parametrize("module, contract, domain", CATALOGUES)
def test_catalogue_equals_the_contract_enum(module, contract, domain):
    contract_reasons = [v.name for v in contract.ErrorReason.DESCRIPTOR.values if v.number != 0]
    assert [reason.name for reason in module.Reason] == contract_reasons
    assert domain == module.DOMAIN == contract.DESCRIPTOR.package


@pytest.mark.parametrize("module, contract, domain", CATALOGUES)
def test_each_reason_documents_the_code_it_is_sent_with(module, contract, domain, descriptor_set):
    [file] = [f for f in descriptor_set.file if f.name == contract.DESCRIPTOR.name]
    enum_index = [e.name for e in file.enum_type].index("ErrorReason")
    comments = {tuple(loc.path): loc.leading_comments.strip() for loc in file.source_code_info.location}
    values = list(file.enum_type[enum_index].value)
    for value_index, value in enumerate(values):
        if value.number == 0:
            continue
        comment = comments.get((5, enum_index, 2, value_index), "")
        expected_code = module.Reason[value.name].value.code.name
        assert comment.startswith(f"{expected_code}:"), f"{value.name}: {comment!r} should start with {expected_code}:"


@pytest.mark.parametrize("module, contract, domain", CATALOGUES)
def test_every_service_has_the_generic_reasons_the_runtime_relies_on(module, contract, domain):
    for name in (
        "FIELD_REQUIRED",
        "FIELD_MALFORMED",
        "FIELD_TOO_LONG",
        "ENUM_UNSPECIFIED",
        "VALUE_OUT_OF_RANGE",
        "REQUEST_ID_REUSED",
        "WATCH_OVERFLOW",
        "STORAGE_UNAVAILABLE",
        "DEADLINE_EXPIRED",
        "INTERNAL_FAULT",
    ):
        assert name in module.Reason.__members__
