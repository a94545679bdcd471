"""Bearer tokens for ``hiermem mcp --http``: who may use which namespaces.

A tokens file is a JSON object mapping each bearer token to the namespaces it may use::

    {
      "3q2-h8Zk0cYh0B1dS2l6sE6b1Ck7m9Yt2yO6a1xZ4sA": ["alice"],
      "T5o0v3xF8m2Qe9Wc1Lr7Hn4Kj6Pb0Ys3Ua8Zd2Gi5Xw": ["bob", "team-x"],
      "Mx1Qa9Zr4Lk7Wc2Tn8Vb5Hy0Gd3Ps6Ju1Fe4Ri7Oq0Y": ["*"]
    }

``"*"`` (alone in its list) means every namespace. Over HTTP the server then answers only requests with
``Authorization: Bearer <token>`` for a configured token (HTTP 401 otherwise, from the MCP SDK's own
bearer middleware, :class:`TokenTableVerifier` being its ``TokenVerifier``), and a token's tool calls
reach only its namespaces.

Namespaces are matched exactly, as the store keys them: the store does not fold case, trim spaces or
normalise Unicode, so ``"alice"``, ``"Alice"``, ``"alice "`` and a decomposed ``"alic\\u0327e"`` are
four different memories, and a token for one reaches none of the others.

Tokens are never kept, logged or echoed: the table holds their SHA-256 digests, compared in constant
time (:func:`hmac.compare_digest` against every configured token), and an error about a token names it
by its position in the file (``token #2``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..stores.namespace import normalize_namespace
from ..types import InvalidInputError

try:
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.auth.provider import AccessToken
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.transport_security import TransportSecuritySettings
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError(
        'The MCP server needs the official MCP SDK (mcp >= 2.3): pip install "hiermem[mcp]".'
    ) from _e

__all__ = [
    "ALL_NAMESPACES",
    "MAX_TOKENS_FILE_BYTES",
    "MIN_TOKEN_CHARS",
    "Grant",
    "TokenTable",
    "TokenTableVerifier",
    "TokensFileError",
    "UnauthenticatedBindError",
    "auth_settings",
    "current_grant",
    "is_loopback",
    "transport_security",
    "url_host",
]

#: The namespace entry that grants every namespace (alone in a token's list).
ALL_NAMESPACES = "*"
#: Shortest accepted token. 32 characters of the token alphabet carry at least 192 bits when random
#: (``secrets.token_urlsafe(32)`` gives 43 characters, 256 bits).
MIN_TOKEN_CHARS = 32
#: Largest tokens file read (a file this big is not a tokens file).
MAX_TOKENS_FILE_BYTES = 1 << 20
#: RFC 6750 ``b64token``: the characters a bearer token may have in an Authorization header.
_TOKEN_RE = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_TOKEN_HINT = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


class TokensFileError(InvalidInputError):
    """A tokens file that cannot be read or is malformed (the message says where; never a token)."""


class UnauthenticatedBindError(InvalidInputError):
    """``--http`` on an address other than loopback without ``--tokens``."""


@dataclass(frozen=True)
class Grant:
    """What one token may use.

    Attributes:
        label: the token's non-secret name, ``"token-<n>"`` for the n-th token of the file; the MCP
            SDK's ``client_id`` of its requests (a session belongs to the token that opened it).
        namespaces: the namespaces it may use (empty when ``every``).
        every: ``True`` for a ``"*"`` token: every namespace.
    """

    label: str
    namespaces: frozenset[str]
    every: bool = False

    def allows(self, namespace: str) -> bool:
        """Whether the token may use ``namespace`` (exact match, as the store keys namespaces)."""
        return self.every or namespace in self.namespaces

    def describe(self) -> str:
        """The token's namespaces for an error message (its own, never another token's)."""
        if self.every:
            return "every namespace"
        return ", ".join(repr(n) for n in sorted(self.namespaces))


class TokenTable:
    """Configured bearer tokens and their grants; holds only the tokens' SHA-256 digests.

    Build it with :meth:`load` (a file) or :meth:`from_mapping` (a parsed object); both validate.
    """

    def __init__(self, entries: list[tuple[bytes, Grant]], source: str) -> None:
        if not entries:
            raise TokensFileError(f"{source}: no tokens.")
        self._entries = entries
        self._by_label = {g.label: g for _, g in entries}
        self.source = source

    # ------------------------------------------------------------------ building
    @classmethod
    def load(cls, path: str | Path) -> TokenTable:
        """Read and validate a tokens file.

        Raises:
            TokensFileError: the path is not a regular file (a FIFO, a device, a socket or a
                directory: refused before it is opened, so start-up never waits on a pipe), the file
                cannot be read, is not UTF-8 JSON, or its content is malformed (see
                :meth:`from_mapping`); the message names the file and the token's position.
        """
        p = Path(path).expanduser()
        where = f"tokens file {p}"
        try:
            _check_regular(os.stat(p).st_mode, where)
            # O_NONBLOCK: should the path become a FIFO after the check, opening it does not wait for
            # a writer, and the check of the opened file below refuses it
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
            with open(fd, "rb") as f:
                _check_regular(os.fstat(f.fileno()).st_mode, where)
                raw = f.read(MAX_TOKENS_FILE_BYTES + 1)
        except OSError as e:
            raise TokensFileError(f"{where}: cannot read it ({e.strerror or e}).") from None
        if len(raw) > MAX_TOKENS_FILE_BYTES:
            raise TokensFileError(f"{where}: larger than {MAX_TOKENS_FILE_BYTES} bytes; not a tokens file.")
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise TokensFileError(f"{where}: not UTF-8 text (byte {e.start}).") from None
        try:
            obj = json.loads(text, object_pairs_hook=_pairs)
        except json.JSONDecodeError as e:
            # e.msg and the position only: the text around the error may be a token
            raise TokensFileError(
                f"{where}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})."
            ) from None
        except RecursionError:
            raise TokensFileError(f"{where}: not valid JSON (nested too deeply).") from None
        return cls.from_mapping(obj, source=where)

    @classmethod
    def from_mapping(cls, obj: Any, *, source: str = "tokens") -> TokenTable:
        """Validate a parsed tokens object ``{"<token>": ["<namespace>", ...]}``.

        Raises:
            TokensFileError: not an object; no tokens; a token twice, shorter than
                :data:`MIN_TOKEN_CHARS` or with characters outside the RFC 6750 token alphabet; a value
                that is not a non-empty list; a namespace that is not a valid namespace string; ``"*"``
                with other namespaces.
        """
        pairs: list[tuple[Any, Any]]
        if isinstance(obj, _Pairs):
            pairs = list(obj.pairs)
        elif isinstance(obj, Mapping):
            pairs = list(obj.items())
        else:
            raise TokensFileError(
                f'{source}: must be a JSON object {{"<token>": ["<namespace>", ...]}}, got {_json_type(obj)}.'
            )
        if not pairs:
            raise TokensFileError(
                f'{source}: no tokens; add at least one, e.g. {{"<token>": ["alice"]}} '
                f"(make a token with: {_TOKEN_HINT})."
            )
        entries: list[tuple[bytes, Grant]] = []
        seen: dict[bytes, int] = {}
        for i, (token, value) in enumerate(pairs, start=1):
            name = f"token #{i}"
            if not isinstance(token, str):
                raise TokensFileError(f"{source}: {name} is a {type(token).__name__}; tokens are strings.")
            if len(token) < MIN_TOKEN_CHARS:
                raise TokensFileError(
                    f"{source}: {name} has {len(token)} characters; a token needs at least "
                    f"{MIN_TOKEN_CHARS} (make one with: {_TOKEN_HINT})."
                )
            if not _TOKEN_RE.fullmatch(token):
                raise TokensFileError(
                    f"{source}: {name} has characters a bearer token cannot have; use only "
                    "A-Z a-z 0-9 - . _ ~ + / (and '=' at the end)."
                )
            digest = _digest(token)
            if digest in seen:
                raise TokensFileError(f"{source}: {name} is the same token as token #{seen[digest]}.")
            seen[digest] = i
            entries.append((digest, _grant(value, f"token-{i}", f"{source}: {name}")))
        return cls(entries, source)

    # ------------------------------------------------------------------ use
    def lookup(self, token: str) -> Grant | None:
        """The grant of a presented token, or ``None``; compared in constant time against every token."""
        presented = _digest(token)
        found: Grant | None = None
        for digest, grant in self._entries:  # no early exit: every token is compared
            if hmac.compare_digest(presented, digest) and found is None:
                found = grant
        return found

    def grant(self, label: str) -> Grant | None:
        """The grant of the token named ``label`` (see :attr:`Grant.label`)."""
        return self._by_label.get(label)

    def __iter__(self) -> Iterator[Grant]:
        return iter(g for _, g in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"TokenTable({len(self)} tokens from {self.source})"


class TokenTableVerifier:
    """The MCP SDK's ``TokenVerifier`` over a :class:`TokenTable` (static bearer tokens).

    The ``AccessToken`` it returns carries the token's label, never the token itself, in both
    ``client_id`` and ``token`` (nothing downstream needs the secret).
    """

    def __init__(self, table: TokenTable) -> None:
        self.table = table

    async def verify_token(self, token: str) -> AccessToken | None:
        grant = self.table.lookup(token)
        if grant is None:
            return None
        return AccessToken(token=grant.label, client_id=grant.label, scopes=[])


def current_grant(table: TokenTable) -> Grant | None:
    """The grant of the request being served (from the SDK's ``get_access_token()``), or ``None``."""
    tok = get_access_token()
    return None if tok is None else table.grant(tok.client_id)


# --------------------------------------------------------------------------- addresses
def is_loopback(host: str) -> bool:
    """Whether a bind host is loopback only: ``localhost``, 127.0.0.0/8 or ``::1`` (also IPv4-mapped).

    Any other name (even one that resolves to 127.0.0.1) and the unspecified addresses (``0.0.0.0``,
    ``::``) are not.
    """
    h = host.strip().lower()
    if h == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def url_host(host: str) -> str:
    """``host`` as it appears in a URL or a Host header (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host else host


def transport_security(host: str) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding protection for a bind host.

    Loopback: on, accepting the loopback names (the SDK's own list) and the bind host itself, so a
    page a browser loaded from elsewhere cannot reach the server through a rebound DNS name. The SDK
    enables this only for exactly ``127.0.0.1``, ``localhost`` and ``::1``; this covers e.g.
    ``127.0.0.2`` too. Any other host: off, the SDK's default there. The names clients use for a
    public server (a DNS name, a proxy's) are not known, and the bearer token is what protects it: a
    browser page cannot present one.
    """
    if not is_loopback(host):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    names = ["127.0.0.1", "localhost", "[::1]"]
    bound = url_host(host.strip().lower())
    if bound not in names:
        names.append(bound)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{n}:*" for n in names],
        allowed_origins=[f"http://{n}:*" for n in names],
    )


def auth_settings(host: str, port: int) -> AuthSettings:
    """The SDK's auth settings for static bearer tokens served at ``http://host:port``.

    The SDK requires an issuer URL: the server's own base URL (nothing is published under it). No
    resource server URL: that would publish OAuth protected-resource metadata naming an authorization
    server, and there is none (the tokens are static), so OAuth clients would try a flow that cannot
    work; without it a 401 simply says a bearer token is required.
    """
    return AuthSettings(issuer_url=f"http://{url_host(host)}:{port}", resource_server_url=None)


def tokens_file_notice(path: str | Path) -> str | None:
    """A warning when the tokens file can be read by other users (POSIX), else ``None``."""
    if os.name != "posix":
        return None
    try:
        mode = Path(path).expanduser().stat().st_mode
    except OSError:
        return None
    if mode & (stat.S_IRGRP | stat.S_IROTH | stat.S_IWGRP | stat.S_IWOTH):
        return f"warning: the tokens file {path} is readable by other users; chmod 600 it."
    return None


# --------------------------------------------------------------------------- helpers
_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _check_regular(mode: int, where: str) -> None:
    """Refuse a tokens path that is not a regular file (``mode``: its ``st_mode``).

    Raises:
        TokensFileError: a directory, a FIFO, a socket, a device or any other non-regular file.
    """
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "a special file")
    raise TokensFileError(
        f"{where}: cannot read it: it is {kind}, not a regular file; give the path of a JSON file."
    )


class _Pairs:
    """A JSON object as its key/value pairs in order (duplicate keys kept, to be refused)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def _pairs(pairs: list[tuple[str, Any]]) -> _Pairs:
    return _Pairs(pairs)


def _json_type(obj: Any) -> str:
    if isinstance(obj, list):
        return "a list"
    if isinstance(obj, str):
        return "a string"
    if isinstance(obj, bool):
        return "a boolean"
    if isinstance(obj, (int, float)):
        return "a number"
    if obj is None:
        return "null"
    if isinstance(obj, _Pairs):
        return "an object"
    return f"a {type(obj).__name__}"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _grant(value: Any, label: str, where: str) -> Grant:
    """A token's namespaces list, validated as the store validates a namespace."""
    if not isinstance(value, list):
        raise TokensFileError(
            f'{where}: its value must be a list of namespaces such as ["alice"] (or ["*"]), '
            f"got {_json_type(value)}."
        )
    if not value:
        raise TokensFileError(f'{where}: no namespaces; list at least one, or "*" for every namespace.')
    names: set[str] = set()
    for j, ns in enumerate(value, start=1):
        if not isinstance(ns, str):
            raise TokensFileError(f"{where}: namespace {j} is {_json_type(ns)}; namespaces are strings.")
        if ns == ALL_NAMESPACES:
            continue
        try:
            normalize_namespace((ns,))
        except InvalidInputError as e:
            msg = str(e).replace("Namespace part 0", "it")
            raise TokensFileError(f"{where}: namespace {j} is not a valid namespace: {msg}") from None
        names.add(ns)
    if ALL_NAMESPACES in value:
        if names or value.count(ALL_NAMESPACES) > 1:
            raise TokensFileError(f'{where}: "*" already means every namespace; list it alone (["*"]).')
        return Grant(label, frozenset(), every=True)
    return Grant(label, frozenset(names))
