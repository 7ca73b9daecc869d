"""Cluster DNS for the `node` profile: a small UDP DNS server for the names pods look up.

Answers A queries, the way CoreDNS's kubernetes plugin does, for
- ``<svc>.<ns>.svc.cluster.local``: a ClusterIP Service's IP; for a headless Service the IPs
  of its pods (ready ones, or all running ones with ``publishNotReadyAddresses``);
- ``<hostname>.<subdomain>.<ns>.svc.cluster.local``: a pod with that ``spec.hostname`` and
  ``spec.subdomain`` under the headless Service of that name (GangJob's ``MASTER_ADDR``).
Short forms (``ddp-0.ddp``) work through the search path the kubelet writes into pods once
``clusterDNS`` is set. Any other name is NXDOMAIN: nothing is forwarded off this machine.

Pods and Services come from a list+watch with the admin credentials (the agent's stdlib HTTP
client); answers are computed per query from that cache, so they are never staler than the
watch. Usage: python -m localcluster.dns --listen 10.203.0.10:53 --server https://127.0.0.1:N
--ca ca.crt --cert admin.crt --key admin.key
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import random
import signal
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from agent.apiclient import ClientError, HttpClient, ssl_context

log = logging.getLogger("localcluster.dns")

CLUSTER_DOMAIN = "cluster.local"
TTL = 5  # seconds, as CoreDNS's kubernetes plugin: pods come and go

# Wire constants (RFC 1035).
TYPE_A = 1
TYPE_AAAA = 28
CLASS_IN = 1
OPCODE_QUERY = 0
NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP = 0, 1, 2, 3, 4
FLAG_QR = 0x8000
FLAG_AA = 0x0400
FLAG_TC = 0x0200
FLAG_RD = 0x0100
HEADER = struct.Struct("!HHHHHH")
MAX_UDP = 512  # without EDNS; a handful of A records fit easily


class DnsFormatError(ValueError):
    """A message that is not valid DNS."""


# ---- wire format ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Question:
    name: str  # lower case, no trailing dot
    qtype: int
    qclass: int = CLASS_IN


@dataclass(frozen=True)
class Message:
    id: int
    flags: int
    questions: tuple[Question, ...] = ()
    answers: tuple[tuple[str, str, int], ...] = ()  # (name, IPv4 address, ttl): A records only

    @property
    def opcode(self) -> int:
        return (self.flags >> 11) & 0xF

    @property
    def rcode(self) -> int:
        return self.flags & 0xF

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_QR)


def encode_name(name: str) -> bytes:
    out = bytearray()
    for label in filter(None, name.rstrip(".").split(".")):
        raw = label.encode("ascii")
        if len(raw) > 63:
            raise DnsFormatError(f"label {label!r} longer than 63 bytes")
        out += bytes([len(raw)]) + raw
    out.append(0)
    if len(out) > 255:
        raise DnsFormatError(f"name {name!r} longer than 255 bytes")
    return bytes(out)


def decode_name(data: bytes, offset: int) -> tuple[str, int]:
    """The name at ``offset`` (following compression pointers) and the offset after it."""
    labels: list[str] = []
    end: int | None = None
    seen: set[int] = set()
    while True:
        if offset >= len(data):
            raise DnsFormatError("name runs past the message")
        length = data[offset]
        if length & 0xC0 == 0xC0:
            if offset + 1 >= len(data):
                raise DnsFormatError("truncated compression pointer")
            target = ((length & 0x3F) << 8) | data[offset + 1]
            if target in seen:
                raise DnsFormatError("compression pointer loop")
            seen.add(target)
            if end is None:
                end = offset + 2
            offset = target
            continue
        if length & 0xC0:
            raise DnsFormatError(f"unsupported label type {length:#x}")
        offset += 1
        if length == 0:
            break
        label = data[offset : offset + length]
        if len(label) < length:
            raise DnsFormatError("label runs past the message")
        labels.append(label.decode("ascii", errors="replace").lower())
        offset += length
    return ".".join(labels), end if end is not None else offset


def decode(data: bytes) -> Message:
    """A message's header, questions and A answers (other records are skipped)."""
    if len(data) < HEADER.size:
        raise DnsFormatError("shorter than a DNS header")
    mid, flags, qd, an, _ns, _ar = HEADER.unpack_from(data)
    offset = HEADER.size
    questions = []
    for _ in range(qd):
        name, offset = decode_name(data, offset)
        if offset + 4 > len(data):
            raise DnsFormatError("truncated question")
        qtype, qclass = struct.unpack_from("!HH", data, offset)
        offset += 4
        questions.append(Question(name, qtype, qclass))
    answers = []
    for _ in range(an):
        name, offset = decode_name(data, offset)
        if offset + 10 > len(data):
            raise DnsFormatError("truncated record")
        rtype, rclass, ttl, rdlen = struct.unpack_from("!HHIH", data, offset)
        offset += 10
        rdata = data[offset : offset + rdlen]
        if len(rdata) < rdlen:
            raise DnsFormatError("truncated record data")
        offset += rdlen
        if rtype == TYPE_A and rclass == CLASS_IN and rdlen == 4:
            answers.append((name, str(ipaddress.IPv4Address(rdata)), ttl))
    return Message(mid, flags, tuple(questions), tuple(answers))


def encode(msg: Message) -> bytes:
    """A message with its questions and A answers; answer names point at the first question's
    name when they are the same (the usual compression)."""
    out = bytearray(HEADER.pack(msg.id, msg.flags, len(msg.questions), len(msg.answers), 0, 0))
    first = msg.questions[0].name if msg.questions else None
    for q in msg.questions:
        out += encode_name(q.name) + struct.pack("!HH", q.qtype, q.qclass)
    for name, addr, ttl in msg.answers:
        out += b"\xc0\x0c" if name == first else encode_name(name)
        out += struct.pack("!HHIH", TYPE_A, CLASS_IN, ttl, 4) + ipaddress.IPv4Address(addr).packed
    return bytes(out)


def query(name: str, qtype: int = TYPE_A, mid: int = 0) -> bytes:
    """A recursive query for one name, as a stub resolver sends it."""
    return encode(Message(mid, FLAG_RD, (Question(name.lower().rstrip("."), qtype),)))


def resolve(server: str, name: str, port: int = 53, timeout: float = 2.0) -> list[str] | None:
    """Asks ``server`` for the A records of ``name``: the addresses, or None on NXDOMAIN.

    Raises OSError when no answer comes (a timeout) and DnsFormatError on a bad one."""
    mid = random.randint(0, 0xFFFF)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(query(name, TYPE_A, mid), (server, port))
        while True:
            msg = decode(sock.recv(4096))
            if msg.id == mid and msg.is_response:
                break
    if msg.rcode == NXDOMAIN:
        return None
    if msg.rcode != NOERROR:
        raise DnsFormatError(f"{name}: rcode {msg.rcode}")
    return [addr for _, addr, _ in msg.answers]


# ---- records --------------------------------------------------------------------------------
def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


class Records:
    """The Services and Pods of the cluster, and the A records they make."""

    def __init__(self, domain: str = CLUSTER_DOMAIN) -> None:
        self.domain = domain
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}  # by namespace

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED) of a Service or a Pod."""
        meta = obj.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if kind == "Service":
            if event == "DELETED":
                self.services.pop(key, None)
            else:
                self.services[key] = obj
        else:
            pods = self.pods.setdefault(key[0], {})
            if event == "DELETED":
                pods.pop(key, None)
            else:
                pods[key] = obj

    def replace(self, kind: str, objs: list[dict[str, Any]]) -> None:
        """A fresh list of every object of ``kind``."""
        if kind == "Service":
            self.services.clear()
        else:
            self.pods.clear()
        for obj in objs:
            self.apply(kind, "ADDED", obj)

    def lookup(self, name: str) -> list[str] | None:
        """The IPv4 addresses of ``name``; [] for a name that exists without any; None for a
        name that does not exist (NXDOMAIN)."""
        suffix = f".svc.{self.domain}"
        if not name.endswith(suffix):
            return None
        labels = name[: -len(suffix)].split(".")
        if len(labels) == 2:
            svc_name, ns = labels
            host = None
        elif len(labels) == 3:
            host, svc_name, ns = labels
        else:
            return None
        svc = self.services.get((ns, svc_name))
        if svc is None:
            return None
        spec = svc.get("spec", {})
        headless = spec.get("clusterIP") == "None"
        if host is None and not headless:
            ip = spec.get("clusterIP")
            return [ip] if ip else []
        addrs = [
            p["status"]["podIP"]
            for p in self._endpoints(ns, spec)
            if host is None
            or (p["spec"].get("hostname") == host and p["spec"].get("subdomain") == svc_name)
        ]
        if host is not None and not addrs:
            return None  # no such pod under the Service
        return sorted(set(addrs))

    def _endpoints(self, ns: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
        selector: dict[str, str] = spec.get("selector") or {}
        if not selector:
            return []  # endpoints of a selector-less Service are managed by hand: none here
        publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
        out = []
        for pod in self.pods.get(ns, {}).values():
            labels = pod.get("metadata", {}).get("labels") or {}
            status = pod.get("status", {})
            if any(labels.get(k) != v for k, v in selector.items()):
                continue
            if not status.get("podIP") or status.get("phase") in ("Succeeded", "Failed"):
                continue
            if publish_not_ready or _ready(pod):
                out.append(pod)
        return out


def answer(records: Records, data: bytes) -> bytes | None:
    """The response to one query datagram; None for something not worth an answer."""
    try:
        msg = decode(data)
    except DnsFormatError:
        if len(data) >= 2:
            mid = struct.unpack_from("!H", data)[0]
            return encode(Message(mid, FLAG_QR | FORMERR))
        return None
    if msg.is_response:
        return None
    base = FLAG_QR | FLAG_AA | (msg.flags & FLAG_RD) | (msg.opcode << 11)
    if msg.opcode != OPCODE_QUERY:
        return encode(Message(msg.id, base | NOTIMP, msg.questions))
    if len(msg.questions) != 1:
        return encode(Message(msg.id, base | FORMERR, msg.questions))
    q = msg.questions[0]
    addrs = records.lookup(q.name) if q.qclass == CLASS_IN else None
    if addrs is None:
        return encode(Message(msg.id, base | NXDOMAIN, msg.questions))
    answers = [(q.name, a, TTL) for a in addrs] if q.qtype == TYPE_A else []
    reply = encode(Message(msg.id, base | NOERROR, msg.questions, tuple(answers)))
    if len(reply) > MAX_UDP:
        # Too many addresses for one datagram: say so, with as many as fit.
        keep = max(0, (MAX_UDP - len(encode(Message(msg.id, base, msg.questions)))) // 16)
        reply = encode(Message(msg.id, base | FLAG_TC, msg.questions, tuple(answers[:keep])))
    return reply


# ---- serving --------------------------------------------------------------------------------
class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, respond: Callable[[bytes], bytes | None]) -> None:
        self.respond = respond
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        reply = self.respond(data)
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)


async def serve_udp(
    records: Records, host: str, port: int
) -> tuple[asyncio.DatagramTransport, int]:
    """Starts answering on host:port (0 picks a port); returns the transport and the port."""
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: _Protocol(lambda data: answer(records, data)), local_addr=(host, port)
    )
    return transport, int(transport.get_extra_info("sockname")[1])


RESOURCES = {"Service": "/api/v1/services", "Pod": "/api/v1/pods"}


async def follow(client: HttpClient, records: Records, kind: str) -> None:
    """List, then watch from the list's resourceVersion; list again on 410 or a broken watch."""
    path = RESOURCES[kind]
    backoff = 0.2
    while True:
        try:
            listed = await client.get(path)
            records.replace(kind, listed.get("items", []))
            rv = listed["metadata"]["resourceVersion"]
            params = {"resourceVersion": rv, "allowWatchBookmarks": "true"}
            while True:
                params["timeoutSeconds"] = str(240 + random.randint(0, 120))
                async for ev in client.watch(path, params, inactivity_timeout=90):
                    etype, obj = ev.get("type"), ev.get("object", {})
                    if etype == "ERROR":
                        raise ClientError(f"watch error: {obj.get('message')}")
                    if not isinstance(obj, dict):
                        continue
                    if etype != "BOOKMARK":
                        records.apply(kind, str(etype), obj)
                    params["resourceVersion"] = obj["metadata"]["resourceVersion"]
                backoff = 0.2
        except (ClientError, OSError, KeyError, ValueError) as e:
            log.warning("%s watch: %s; listing again in %.1fs", kind, e, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)


async def run(args: argparse.Namespace) -> None:
    host, _, port = args.listen.rpartition(":")
    records = Records(args.domain)
    transport, _ = await serve_udp(records, host, int(port))
    ctx = ssl_context(args.ca, args.cert, args.key)
    client = HttpClient(args.server, ssl_context=ctx, user_agent="localcluster-dns")
    tasks = [asyncio.create_task(follow(client, records, kind)) for kind in RESOURCES]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("cluster DNS for %s on %s", args.domain, args.listen)
    try:
        await stop.wait()
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        transport.close()
        await client.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m localcluster.dns")
    p.add_argument("--listen", required=True, help="address:port to answer on (UDP)")
    p.add_argument("--server", required=True, help="the apiserver's URL")
    p.add_argument("--ca", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--domain", default=CLUSTER_DOMAIN)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
