"""Several hosts on one machine: a network namespace per host, joined by one Linux bridge.

The root namespace holds the bridge (the "switch") and its first address: the test process
and the fake Messages API live there, as the clients and the model API of every host. Each
host is a namespace with one veth into the bridge and one address of the subnet; a process
runs on a host with ``ip netns exec``. Only iproute2 is needed (no iptables, nft or tc):

- ``cut(a, b)``: a and b stop hearing each other, in both directions, and nobody else is
  disturbed. Each side's neighbour (ARP) entry for the other is pinned to a MAC address
  no host has: the bridge floods such frames and every port drops them, so packets vanish
  silently, as in a real partition (TCP retransmits and waits; no error reaches the
  sender, unlike a ``blackhole`` or ``unreachable`` route). ``heal`` deletes the pins.
- ``isolate(a)``: a's port on the bridge goes down (a host whose cable is pulled); its own
  interface keeps its address and routes, so its sends vanish silently too.

``unavailable()`` says why namespaces cannot be used here (not root, no ``ip``, creating a
namespace refused), for a skip. ``Network.close()`` removes every namespace and link it made,
whatever state a failed test left them in.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field

NOWHERE_MAC = "02:00:5e:00:de:ad"  # locally administered; no interface of ours has it
CLIENTS = "clients"  # the root namespace's side: the test process and the fake model API


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def unavailable() -> str | None:
    """Why this machine cannot run hosts in namespaces, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"sbprobe{os.getpid()}"
    done = subprocess.run(
        ["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        return f"creating a network namespace was refused: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30, check=False)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.213.0.0/16 that no route of the root namespace overlaps."""
    taken = []
    for line in _ip("-4", "route", "show", "table", "all").splitlines():
        word = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            taken.append(ipaddress.ip_network(word, strict=False))
    start = os.getpid() % 250
    for i in range(250):
        subnet = ipaddress.IPv4Network(f"10.213.{(start + i) % 250 + 1}.0/24")
        if not any(subnet.overlaps(t) for t in taken if t.prefixlen > 0):
            return subnet
    raise RuntimeError("no free /24 in 10.213.0.0/16 for the test bridge")


@dataclass
class Host:
    """One namespace: its name, its address, and the bridge port (root side) of its veth."""

    name: str
    netns: str
    ip: str
    port: str  # the veth end in the root namespace, enslaved to the bridge

    def command(self, args: list[str]) -> list[str]:
        """``args`` run on this host."""
        return ["ip", "netns", "exec", self.netns, *args]


@dataclass
class Network:
    """A bridge, the hosts on it, and the partitions in force."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    subnet: ipaddress.IPv4Network = field(default_factory=_free_subnet)
    hosts: dict[str, Host] = field(default_factory=dict)
    cuts: set[frozenset[str]] = field(default_factory=set)
    isolated: set[str] = field(default_factory=set)
    _bridge: str | None = None
    _addresses: list[ipaddress.IPv4Address] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._addresses = list(self.subnet.hosts())

    @property
    def bridge(self) -> str:
        return f"sbbr{self.tag}"

    @property
    def clients_ip(self) -> str:
        """The root namespace's address on the bridge (clients, the fake model API)."""
        return str(self._addresses[0])

    def open(self) -> Network:
        """Create the bridge and give the root namespace its address on it."""
        _ip("link", "add", self.bridge, "type", "bridge")
        self._bridge = self.bridge
        _ip("addr", "add", f"{self.clients_ip}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def add_host(self, name: str) -> Host:
        """A new namespace on the bridge, with loopback up and the next free address."""
        netns = f"sb{self.tag}-{name}"
        port = f"sb{self.tag}{name}"[:15]
        ip = str(self._addresses[len(self.hosts) + 1])
        _ip("netns", "add", netns)
        host = Host(name=name, netns=netns, ip=ip, port=port)
        self.hosts[name] = host
        _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", port, "master", self.bridge)
        _ip("link", "set", port, "up")
        _ip("addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", "eth0", netns=netns)
        _ip("link", "set", "eth0", "up", netns=netns)
        _ip("link", "set", "lo", "up", netns=netns)
        return host

    # -- partitions ------------------------------------------------------------------

    def _ends(self, name: str) -> tuple[str | None, str, str]:
        """(namespace or None for the root one, device, address) of one side of a cut."""
        if name == CLIENTS:
            return None, self.bridge, self.clients_ip
        host = self.hosts[name]
        return host.netns, "eth0", host.ip

    def cut(self, a: str, b: str) -> None:
        """Stop every packet between ``a`` and ``b`` (host names, or ``CLIENTS``)."""
        (ns_a, dev_a, ip_a), (ns_b, dev_b, ip_b) = self._ends(a), self._ends(b)
        pin = ("lladdr", NOWHERE_MAC, "nud", "permanent")
        _ip("neigh", "replace", ip_b, *pin, "dev", dev_a, netns=ns_a)
        _ip("neigh", "replace", ip_a, *pin, "dev", dev_b, netns=ns_b)
        self.cuts.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        """Undo ``cut(a, b)``: the next packet resolves the real address by ARP again."""
        (ns_a, dev_a, ip_a), (ns_b, dev_b, ip_b) = self._ends(a), self._ends(b)
        _ip("neigh", "del", ip_b, "dev", dev_a, netns=ns_a, check=False)
        _ip("neigh", "del", ip_a, "dev", dev_b, netns=ns_b, check=False)
        self.cuts.discard(frozenset((a, b)))

    def isolate(self, name: str) -> None:
        """Pull ``name``'s cable: its bridge port goes down."""
        _ip("link", "set", self.hosts[name].port, "down")
        self.isolated.add(name)

    def reconnect(self, name: str) -> None:
        """Undo ``isolate``."""
        _ip("link", "set", self.hosts[name].port, "up")
        self.isolated.discard(name)

    def heal_all(self) -> None:
        """Undo every cut and isolation in force."""
        for pair in list(self.cuts):
            a, b = sorted(pair)
            self.heal(a, b)
        for name in list(self.isolated):
            self.reconnect(name)

    def close(self) -> None:
        """Remove every namespace (with its veth) and the bridge; never raises."""
        for host in self.hosts.values():
            _ip("link", "del", host.port, check=False)
            _ip("netns", "del", host.netns, check=False)
        self.hosts.clear()
        if self._bridge is not None:
            _ip("neigh", "flush", "dev", self._bridge, check=False)
            _ip("link", "del", self._bridge, check=False)
            self._bridge = None
