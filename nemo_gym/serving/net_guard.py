"""SSRF guard: refuse outbound URLs that resolve to loopback, link-local, private or other internal addresses.

A URL that a dataset row, a tool argument or a remote endpoint's config hands to a server must not let it
reach the machine's own services (the head server and the other servers of the run on 127.0.0.1, the cloud
metadata service at 169.254.169.254) or the local network. `check_url` resolves the host
(`socket.getaddrinfo`) and checks every address it gets with `ipaddress`:

- always refused: link-local (169.254.0.0/16, fe80::/10, the metadata services), unspecified (0.0.0.0, ::),
  multicast and reserved addresses, unless an `allowed` entry covers them;
- refused unless `allow_private=True`: loopback (127.0.0.0/8, ::1) and private ranges (10/8, 172.16/12,
  192.168/16, 100.64/10, fc00::/7, ...);
- `allowed`: host names or CIDR blocks that pass whatever they resolve to.

IPv4-mapped IPv6 addresses (::ffff:127.0.0.1) are checked as the IPv4 address they carry.
`guard_hook` checks every request an `httpx` client sends, redirects included; `guard_middleware` does the same
for an `aiohttp` client. The check and the connection resolve the name separately, so a DNS answer that changes
in between (rebinding) is not covered; a fixed IP address in the URL is.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import aiohttp
import httpx

from nemo_gym.common.errors import ConfigError

__all__ = [
    "BlockedAddressError",
    "check_url",
    "check_url_async",
    "address_problem",
    "guard_hook",
    "guard_middleware",
    "guarded_async_client",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: not global, not `is_private` in Python 3.11


class BlockedAddressError(ConfigError, ValueError):
    """A URL whose host is (or resolves to) an address the guard refuses; the message names the URL."""

    failure_class = "blocked_address"


def address_problem(address: IPAddress, *, allow_private: bool = False) -> str | None:
    """Why `address` is refused (e.g. "link-local"), or None when it may be reached."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_link_local:
        return "link-local (metadata services live there)"
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if address.is_loopback:
        return None if allow_private else "loopback"
    if address.is_private or (isinstance(address, ipaddress.IPv4Address) and address in _SHARED):
        return None if allow_private else "private"
    if address.is_reserved or not address.is_global:
        return "reserved"
    return None


def _parse_allowed(allowed: Iterable[str]) -> tuple[set[str], list[IPNetwork]]:
    hosts: set[str] = set()
    networks: list[IPNetwork] = []
    for entry in allowed:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            hosts.add(entry.strip().lower().rstrip("."))
    return hosts, networks


def _host_of(url: str) -> str:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise BlockedAddressError(f"URL {url!r} is not a valid URL: {exc}") from None
    if parsed.scheme not in {"http", "https"}:
        raise BlockedAddressError(
            f"URL {url!r}: only http and https URLs may be fetched, not {parsed.scheme or 'no scheme'!r}"
        )
    if not parsed.host:
        raise BlockedAddressError(f"URL {url!r} has no host")
    return parsed.host.lower().rstrip(".")


def _check_addresses(
    url: str, host: str, addresses: Sequence[str], allow_private: bool, networks: list[IPNetwork]
) -> None:
    if not addresses:
        raise BlockedAddressError(f"URL {url!r}: host {host!r} resolves to no address")
    for text in addresses:
        address = ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone id (fe80::1%eth0)
        if any(address in network for network in networks if network.version == address.version):
            continue
        problem = address_problem(address, allow_private=allow_private)
        if problem:
            hint = (
                ""
                if problem.startswith(("link-local", "unspecified", "multicast", "reserved"))
                else " (set allow_private_addresses, or list it in the allow-list)"
            )
            raise BlockedAddressError(
                f"URL {url!r} is refused: host {host!r} resolves to {address}, a {problem} address{hint}"
            )


def _literal(host: str) -> list[str] | None:
    try:
        return [str(ipaddress.ip_address(host.strip("[]")))]
    except ValueError:
        return None


def check_url(url: str, *, allow_private: bool = False, allowed: Iterable[str] = ()) -> None:
    """Refuse `url` when its host is or resolves to an address the guard blocks (see the module docstring).

    Args:
        url: an http(s) URL.
        allow_private: let loopback and private-range addresses through.
        allowed: host names or CIDR blocks let through whatever they are.

    Raises:
        BlockedAddressError (a ConfigError and a ValueError): a refused, unresolvable or non-http(s) URL.
    """
    host = _host_of(url)
    hosts, networks = _parse_allowed(allowed)
    if host in hosts:
        return
    addresses = _literal(host)
    if addresses is None:
        try:
            addresses = sorted({info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})
        except (socket.gaierror, UnicodeError) as exc:
            raise BlockedAddressError(f"URL {url!r}: host {host!r} does not resolve ({exc})") from None
    _check_addresses(url, host, addresses, allow_private, networks)


async def check_url_async(url: str, *, allow_private: bool = False, allowed: Iterable[str] = ()) -> None:
    """`check_url` without blocking the event loop (the name is resolved in a worker thread)."""
    host = _host_of(url)
    if _literal(host) is not None or host in _parse_allowed(allowed)[0]:
        check_url(url, allow_private=allow_private, allowed=allowed)
        return
    await asyncio.to_thread(check_url, url, allow_private=allow_private, allowed=allowed)


def guard_hook(*, allow_private: bool = False, allowed: Iterable[str] = ()) -> Callable[[Any], Awaitable[None]]:
    """An httpx `request` event hook running `check_url_async` on every request a client sends, redirects
    included. It works with any httpx-compatible client (`openai` ships its own fork, `httpx2`):
    `httpx.AsyncClient(event_hooks={"request": [guard_hook()]})`."""
    allowed = tuple(allowed)

    async def check(request: Any) -> None:
        await check_url_async(str(request.url), allow_private=allow_private, allowed=allowed)

    return check


def guard_middleware(*, allow_private: bool = False, allowed: Iterable[str] = ()) -> aiohttp.ClientMiddlewareType:
    """An aiohttp client middleware running `check_url_async` on every request a session sends, redirects
    included (aiohttp passes each hop of a redirect through the middlewares):
    `aiohttp.ClientSession(middlewares=[guard_middleware()])`, or `ServerClient(middlewares=...)`.

    Raises (from the request):
        BlockedAddressError: the request's address is refused.
    """
    allowed = tuple(allowed)

    async def check(request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        await check_url_async(str(request.url), allow_private=allow_private, allowed=allowed)
        return await handler(request)

    return check


def guarded_async_client(
    *, allow_private: bool = False, allowed: Iterable[str] = (), **kwargs: Any
) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` for URLs from rows or tools: every request (and redirect) passes the guard.

    `kwargs` go to `httpx.AsyncClient` (timeouts default to 10 s connect, 60 s total); proxies from the
    environment are ignored, since a proxy would make the guard's check meaningless.
    """
    kwargs.setdefault("timeout", httpx.Timeout(60.0, connect=10.0))
    hooks = kwargs.pop("event_hooks", {}) or {}
    hooks = {**hooks, "request": [guard_hook(allow_private=allow_private, allowed=allowed), *hooks.get("request", [])]}
    return httpx.AsyncClient(event_hooks=hooks, trust_env=False, **kwargs)
