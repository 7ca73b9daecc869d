"""localcluster.dns: the DNS wire format, the records pods and Services make, a real UDP round
trip on loopback."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from localcluster import dns

NS = "team"


def pod(name: str, ip: str | None, ready: bool = True, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": NS, "name": name, "labels": {"app": "ddp"}},
        "spec": spec,
        "status": {
            "phase": "Running",
            **({"podIP": ip} if ip else {}),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def service(name: str, cluster_ip: str = "None", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": NS, "name": name},
        "spec": {"clusterIP": cluster_ip, "selector": {"app": "ddp"}, **spec},
    }


def records(*objs: tuple[str, dict[str, Any]]) -> dns.Records:
    r = dns.Records()
    for kind, obj in objs:
        r.apply(kind, "ADDED", obj)
    return r


# ---- wire format ----------------------------------------------------------------------------
def test_a_query_round_trips() -> None:
    raw = dns.query("DDP-0.ddp.team.svc.cluster.local.", dns.TYPE_A, mid=0x1234)
    msg = dns.decode(raw)
    assert msg.id == 0x1234
    assert msg.flags == dns.FLAG_RD
    assert msg.questions == (dns.Question("ddp-0.ddp.team.svc.cluster.local", dns.TYPE_A),)
    assert dns.encode(msg) == raw


def test_a_query_has_the_rfc_1035_layout() -> None:
    raw = dns.query("a.bc", dns.TYPE_A, mid=7)
    assert raw == (
        struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"\x01a\x02bc\x00" + b"\x00\x01\x00\x01"
    )


def test_answers_point_at_the_question_name() -> None:
    q = dns.Question("x.team.svc.cluster.local", dns.TYPE_A)
    msg = dns.Message(9, dns.FLAG_QR | dns.FLAG_AA, (q,), ((q.name, "10.80.0.5", 5),))
    raw = dns.encode(msg)
    assert raw.count(b"\x01x\x04team") == 1  # the name is written once, then a pointer
    assert b"\xc0\x0c" in raw
    assert dns.decode(raw) == msg


def test_compression_pointer_loops_are_rejected() -> None:
    raw = struct.pack("!HHHHHH", 1, 0, 1, 0, 0, 0) + b"\xc0\x0c" + b"\x00\x01\x00\x01"
    with pytest.raises(dns.DnsFormatError, match="loop"):
        dns.decode(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00",
        struct.pack("!HHHHHH", 1, 0, 1, 0, 0, 0) + b"\x05ab",
        struct.pack("!HHHHHH", 1, 0, 1, 0, 0, 0) + b"\x01a\x00\x00",
    ],
)
def test_truncated_messages_are_format_errors(raw: bytes) -> None:
    with pytest.raises(dns.DnsFormatError):
        dns.decode(raw)


def test_overlong_labels_are_refused() -> None:
    with pytest.raises(dns.DnsFormatError):
        dns.encode_name("a" * 64 + ".b")


# ---- records --------------------------------------------------------------------------------
def test_a_pod_resolves_by_hostname_and_subdomain_under_its_headless_service() -> None:
    r = records(
        ("Service", service("ddp")),
        ("Pod", pod("ddp-0", "10.80.0.5", hostname="ddp-0", subdomain="ddp")),
        ("Pod", pod("ddp-1", "10.80.0.6", hostname="ddp-1", subdomain="ddp")),
    )
    assert r.lookup("ddp-0.ddp.team.svc.cluster.local") == ["10.80.0.5"]
    assert r.lookup("ddp-1.ddp.team.svc.cluster.local") == ["10.80.0.6"]
    assert r.lookup("ddp.team.svc.cluster.local") == ["10.80.0.5", "10.80.0.6"]
    assert r.lookup("ddp-2.ddp.team.svc.cluster.local") is None
    assert r.lookup("ddp-0.ddp.other.svc.cluster.local") is None


def test_not_ready_pods_resolve_only_when_the_service_publishes_them() -> None:
    worker = pod("ddp-0", "10.80.0.5", ready=False, hostname="ddp-0", subdomain="ddp")
    assert records(("Service", service("ddp")), ("Pod", worker)).lookup(
        "ddp-0.ddp.team.svc.cluster.local"
    ) is None  # fmt: skip
    published = service("ddp", publishNotReadyAddresses=True)
    assert records(("Service", published), ("Pod", worker)).lookup(
        "ddp-0.ddp.team.svc.cluster.local"
    ) == ["10.80.0.5"]  # fmt: skip


def test_pods_without_an_ip_or_finished_have_no_record() -> None:
    done = pod("ddp-1", "10.80.0.6", hostname="ddp-1", subdomain="ddp")
    done["status"]["phase"] = "Succeeded"
    r = records(
        ("Service", service("ddp")),
        ("Pod", pod("ddp-0", None, hostname="ddp-0", subdomain="ddp")),
        ("Pod", done),
    )
    assert r.lookup("ddp.team.svc.cluster.local") == []  # the name exists: NODATA
    assert r.lookup("ddp-1.ddp.team.svc.cluster.local") is None


def test_a_cluster_ip_service_resolves_to_its_ip_and_deletions_are_seen() -> None:
    r = records(("Service", service("web", "10.203.0.7")))
    assert r.lookup("web.team.svc.cluster.local") == ["10.203.0.7"]
    r.apply("Service", "DELETED", service("web", "10.203.0.7"))
    assert r.lookup("web.team.svc.cluster.local") is None


@pytest.mark.parametrize(
    "name",
    ["example.com", "cluster.local", "team.svc.cluster.local", "a.b.c.team.svc.cluster.local"],
)
def test_other_names_do_not_exist(name: str) -> None:
    assert records(("Service", service("ddp"))).lookup(name) is None


# ---- answers --------------------------------------------------------------------------------
def _records() -> dns.Records:
    return records(
        ("Service", service("ddp")),
        ("Pod", pod("ddp-0", "10.80.0.5", hostname="ddp-0", subdomain="ddp")),
    )


def test_an_answer_is_authoritative_and_echoes_id_and_question() -> None:
    reply = dns.answer(_records(), dns.query("ddp-0.ddp.team.svc.cluster.local", mid=42))
    assert reply is not None
    msg = dns.decode(reply)
    assert msg.id == 42
    assert msg.is_response
    assert msg.flags & dns.FLAG_AA
    assert msg.flags & dns.FLAG_RD
    assert msg.rcode == dns.NOERROR
    assert msg.answers == (("ddp-0.ddp.team.svc.cluster.local", "10.80.0.5", dns.TTL),)


def test_aaaa_of_a_known_name_is_nodata_and_an_unknown_name_nxdomain() -> None:
    reply = dns.answer(_records(), dns.query("ddp-0.ddp.team.svc.cluster.local", dns.TYPE_AAAA))
    assert reply is not None
    msg = dns.decode(reply)
    assert (msg.rcode, msg.answers) == (dns.NOERROR, ())
    reply = dns.answer(_records(), dns.query("pypi.org.team.svc.cluster.local"))
    assert reply is not None
    assert dns.decode(reply).rcode == dns.NXDOMAIN


def test_garbage_gets_formerr_and_responses_get_nothing() -> None:
    reply = dns.answer(_records(), b"\x12\x34\x01")
    assert reply is not None
    assert dns.decode(reply).rcode == dns.FORMERR
    assert dns.decode(reply).id == 0x1234
    response = dns.encode(dns.Message(1, dns.FLAG_QR, (dns.Question("a", dns.TYPE_A),)))
    assert dns.answer(_records(), response) is None


def test_too_many_addresses_are_truncated_to_one_datagram() -> None:
    objs: list[tuple[str, dict[str, Any]]] = [("Service", service("big"))]
    objs += [("Pod", pod(f"p{i}", f"10.80.1.{i}")) for i in range(1, 60)]
    reply = dns.answer(records(*objs), dns.query("big.team.svc.cluster.local"))
    assert reply is not None
    assert len(reply) <= dns.MAX_UDP
    msg = dns.decode(reply)
    assert msg.flags & dns.FLAG_TC
    assert 0 < len(msg.answers) < 59


async def test_the_udp_server_answers_a_resolver() -> None:
    transport, port = await dns.serve_udp(_records(), "127.0.0.1", 0)
    try:
        got = await asyncio.to_thread(
            dns.resolve, "127.0.0.1", "ddp-0.ddp.team.svc.cluster.local", port
        )
        assert got == ["10.80.0.5"]
        missing = await asyncio.to_thread(dns.resolve, "127.0.0.1", "nope.example", port)
        assert missing is None
    finally:
        transport.close()
