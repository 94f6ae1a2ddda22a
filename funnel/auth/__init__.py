"""Who may call what: callers and their roles, the one authorization table of
both services, bearer tokens (JWT verified against a JWKS), TLS material and a
local certificate authority for `funnel up`.

`principal` and `table` are pure; `tokens`, `tls` and `pki` wrap maintained
libraries (PyJWT, cryptography, gRPC's TLS) and never implement crypto here.
"""
