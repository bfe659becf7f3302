"""Who is calling: JWT bearer tokens, roles, acting for users, revocation, tickets.

- `config`: what tokens are checked against (secrets, the host app's public keys, claims);
- `verify`: one token checked by PyJWT; `jwks`: the host app's public keys, cached;
- `gate`: `Identity`, from request headers to a `Principal`, with its cache;
- `revocation`: revoked users, kept in Redis and copied into every API process;
- `tickets`: short-lived event-stream tickets; `mint`: the HS256 tokens hongbao issues;
- `redact`: keeps token= and ticket= values out of the access log.

The service layer below never sees a token, only the `Principal` it yields. The
package imports nothing itself, so that the CLI can read the configuration without
loading PyJWT and the storage.
"""
