"""Who may use the dashboard: loopback by default, a token for any other address.

The dashboard can switch a live run's kernel paths, so serving it beyond this machine is a decision: an
address that is not loopback is refused unless a token is given (`rlkit dashboard RUN --address 0.0.0.0
--token T`). With a token, the page must be opened as `http://host:port/?token=T` (a session opened without
it shows only a refusal), every toggle request the page sends is checked against the token the session was
opened with, and the HTTP endpoints (`/api/status`, `/api/toggle`) want it in the `X-Rlkit-Token` header
(the only place they read it). Tokens are compared in constant time.

Every request must also name, in its Host header, an address the dashboard serves (`served_hosts`): a
page of another site whose name an attacker points at 127.0.0.1 (DNS rebinding) sends its own name as
Host and is refused, and Bokeh's websocket accepts the same names as origins.

    check_serve_policy("127.0.0.1", None)       # fine: loopback
    check_serve_policy("0.0.0.0", None)         # AccessError: ... give --token
    check_token("s3cret", presented="nope")     # TokenRefused
    host_allowed("evil.example:5006", served_hosts("127.0.0.1", 5006))   # False
"""

from __future__ import annotations

import hmac
import ipaddress
import socket

DEFAULT_PORT = 5006
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
TOKEN_PARAM = "token"
TOKEN_HEADER = "X-Rlkit-Token"


class AccessError(ValueError):
    """A serving set-up the dashboard refuses (one line: what to do instead)."""


class TokenRefused(PermissionError):
    """A page or a request without the dashboard's token (or with a wrong one)."""


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and the usual names of localhost."""
    if address.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")


def served_hosts(address: str, port: int) -> list[str]:
    """The `host:port` names a request to this dashboard may carry in its Host header (and a websocket in its
    Origin): the loopback names and addresses for a loopback address; the address itself for another one;
    for a wildcard address (which needs a token), this machine's names and addresses as well."""
    names = {address}
    if is_loopback(address) or address in WILDCARD_ADDRESSES:
        names.update(LOOPBACK_NAMES + ("127.0.0.1", "::1"))
    if address in WILDCARD_ADDRESSES:
        names.discard(address)
        hostname = socket.gethostname()
        names.update({hostname, socket.getfqdn()})
        try:
            names.update(info[4][0] for info in socket.getaddrinfo(hostname, None))
        except OSError:
            pass
    return sorted(f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in names if n)


def host_allowed(host: str | None, allowed: list[str]) -> bool:
    """True when a Host header (or an Origin's netloc) names one of `allowed` (case-insensitive; a Host
    without a port means port 80)."""
    if not host:
        return False
    host = host.strip().lower()
    has_port = "]:" in host if host.startswith("[") else ":" in host
    return (host if has_port else f"{host}:80") in {a.lower() for a in allowed}


def check_serve_policy(address: str, token: str | None) -> None:
    """Refuse to serve a non-loopback address without a token, and refuse a weak token."""
    if token is not None and len(token) < 8:
        raise AccessError("--token must be at least 8 characters (e.g. the output of "
                          "`python -c 'import secrets; print(secrets.token_urlsafe())'`)")
    if not is_loopback(address) and not token:
        raise AccessError(f"--address {address} is not loopback: anyone who reaches it could switch a live run's "
                          f"kernel paths; give --token T (the page and every toggle request must then carry it), "
                          f"or serve on 127.0.0.1 and tunnel (ssh -L)")


def token_matches(required: str | None, presented: str | None) -> bool:
    """No token required: always True. Otherwise the presented token must equal it (constant time)."""
    if not required:
        return True
    if not presented:
        return False
    return hmac.compare_digest(required.encode(), presented.encode())


def check_token(required: str | None, presented: str | None, what: str = "request") -> None:
    if not token_matches(required, presented):
        how = "without a token" if not presented else "with a wrong token"
        raise TokenRefused(f"{what} refused: this dashboard was started with --token and the {what} came {how}; "
                           f"open the page as /?{TOKEN_PARAM}=<token> (or send the {TOKEN_HEADER} header)")


def session_token(session_args: dict) -> str | None:
    """The token a Bokeh/Panel session was opened with (`?token=...`), or None."""
    values = session_args.get(TOKEN_PARAM) or []
    if not values:
        return None
    v = values[0]
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
