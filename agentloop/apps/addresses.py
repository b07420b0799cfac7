"""Which addresses an external app may be called on.

By default only globally reachable addresses. An operator may name private networks (CIDRs) an app may
also be called on (`allowed_networks`); some addresses stay refused whatever is named: link-local
(169.254.0.0/16, where cloud metadata services answer, and fe80::/10), "this network" 0.0.0.0/8 (which
Linux connects to the host itself), the unspecified address, broadcast and multicast.

An IPv6 address that carries an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4
`2002::/16`) is judged as that IPv4 address, so `[::ffff:169.254.169.254]` is link-local and
`[64:ff9b::7f00:1]` loopback. Decimal, hex and octal IPv4 spellings (`2130706433`, `0x7f000001`,
`0177.0.0.1`) need nothing here: the resolver turns them into the address that is checked.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_ALLOWED_NETWORKS = 32
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
BROADCAST = ipaddress.IPv4Address("255.255.255.255")
THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")

# never callable, and never nameable in allowed_networks
ALWAYS_REFUSED: tuple[tuple[IPNetwork, str], ...] = (
    (ipaddress.IPv4Network("169.254.0.0/16"), "link-local"),
    (ipaddress.IPv6Network("fe80::/10"), "link-local"),
    (THIS_NETWORK, '"this network" (0.0.0.0/8)'),
    (ipaddress.IPv4Network("224.0.0.0/4"), "multicast"),
    (ipaddress.IPv6Network("ff00::/8"), "multicast"),
    (ipaddress.IPv4Network("255.255.255.255/32"), "broadcast"),
    (ipaddress.IPv6Network("::/128"), "unspecified"),
)
# IPv6 forms of IPv4 addresses: name the IPv4 network instead
EMBEDDING: tuple[IPNetwork, ...] = (ipaddress.IPv6Network("::ffff:0:0/96"), NAT64, ipaddress.IPv6Network("2002::/16"))


class NetworkError(ValueError):
    """An allowed_networks entry that is not a network, or names what stays refused."""


def judged_as(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries (mapped, NAT64, 6to4), else the address itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def refusal(ip: str, allowed: Sequence[IPNetwork] = ()) -> str | None:
    """Why the address may not be called ("loopback", "link-local", ...), or None when it may."""
    address = judged_as(ipaddress.ip_address(ip))
    for network, why in ALWAYS_REFUSED:
        if address.version == network.version and address in network:
            return why
    if any(address.version == network.version and address in network for network in allowed):
        return None
    if address.is_global and not address.is_reserved:
        return None
    if address.is_loopback:
        return "loopback"
    if address.is_reserved:
        return "reserved"
    if address.is_private:
        return "private"
    return "not globally reachable"


def parse_networks(entries: Sequence[str]) -> tuple[IPNetwork, ...]:
    """The networks of an allowed_networks list, each checked (NetworkError says which entry and why)."""
    if len(entries) > MAX_ALLOWED_NETWORKS:
        raise NetworkError(f"allowed_networks names {len(entries)} networks; at most {MAX_ALLOWED_NETWORKS}")
    networks: list[IPNetwork] = []
    for entry in entries:
        try:
            network = ipaddress.ip_network(entry.strip(), strict=True)
        except ValueError as exc:
            raise NetworkError(f"allowed_networks entry {entry!r} is not a network in CIDR form: {exc}") from None
        for refused, why in ALWAYS_REFUSED:
            if network.version == refused.version and network.overlaps(refused):  # type: ignore[arg-type]
                raise NetworkError(
                    f"allowed_networks entry {entry!r} overlaps {refused} ({why}), which no app may be called on; "
                    "name narrower networks"
                )
        for form in EMBEDDING:
            if network.version == 6 and network.overlaps(form):  # type: ignore[arg-type]
                raise NetworkError(
                    f"allowed_networks entry {entry!r} overlaps {form}, whose addresses are judged as the IPv4 "
                    "address they carry; name the IPv4 network instead"
                )
        networks.append(network)
    return tuple(networks)


def stored_networks(entries: Sequence[str]) -> tuple[IPNetwork, ...]:
    """The networks of a registered app (checked at registration)."""
    return tuple(ipaddress.ip_network(entry) for entry in entries)
