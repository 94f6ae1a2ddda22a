"""The lifecycle service's gRPC face: the servicer (service), request validation
into typed intents (requests), the proto mapping (convert) and the rule for resumes
the completion service relays for its caller (relay). Nothing below it imports it."""
