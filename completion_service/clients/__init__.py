"""Outbound calls: the lifecycle service (lifecycle_client, settle_batches), the
workspace's external gates (external_gates) and the channels both ride on
(outbound). Called by the shell (completion_service.authority), never from a
unit of work."""
