"""Is an address on the public internet? The SSRF rule shared by every outbound request a
user (or the model) chooses the target of: ``web_fetch`` and webhook deliveries.

An address is refused unless it is global unicast: no loopback, private, link-local (cloud
metadata), multicast, reserved, shared or unspecified address, nor an IPv6 form that embeds
such an IPv4 address (mapped, NAT64, 6to4, Teredo). A caller resolves a host ONCE, checks
every address, and connects to the address it checked, so a DNS answer that changes in
between (rebinding) is never asked for.
"""

from __future__ import annotations

import ipaddress
import socket

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv6 prefixes that carry an IPv4 address a gateway may route to: check that address too.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def refusal(address: IPAddress) -> str | None:
    """Why nothing user-chosen may connect to ``address``, or None for a global unicast one."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None:
            why = refusal(inner)
            return f"it embeds {inner}, which {why}" if why else None
        if address.scope_id:
            return "it is scoped to a local link"
    if address.is_loopback:
        return "is a loopback address"
    if address.is_link_local:
        return "is a link-local address (cloud metadata lives there)"
    if address.is_multicast:
        return "is a multicast address"
    if address.is_unspecified:
        return "is the unspecified address"
    if address.is_reserved:
        return "is a reserved address"
    if address.is_private or not address.is_global:
        return "is not a public address (private, shared or special-purpose)"
    return None


class AddressRefused(ValueError):
    """A host that cannot be resolved, or resolves to an address that is not public."""


def resolve_checked(host: str, port: int, allow_private: bool = False) -> IPAddress:
    """The one address to connect to for ``host``: resolved once, every answer checked
    (``allow_private``: a deployment that delivers inside its own network)."""
    try:
        found = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise AddressRefused(f"cannot resolve {host!r}: {exc}") from None
        answers = dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos)
        found = [ipaddress.ip_address(a) for a in answers]
    if not found:
        raise AddressRefused(f"{host!r} resolves to no address")
    if not allow_private:
        for address in found:
            why = refusal(address)
            if why is not None:
                raise AddressRefused(f"{host} resolves to {address}, which {why}")
    return found[0]
