"""The completion service's gRPC face: the servicers (service, transcript_service),
request validation (requests, event_rules, jsonl), the proto mapping (convert) and
the streamed transcript import (imports). Only the server wires it, and the
outbound clients use its proto mapping for the messages they send."""
