"""Units of work: each function runs in one storage transaction over the port
(completion_service.storage.port), decides with the pure core and writes; no
protobuf, gRPC or asyncio here, and nothing of api/ or clients/."""
