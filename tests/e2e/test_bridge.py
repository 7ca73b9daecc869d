"""The node profile's pod bridge keeps the MAC it was given: a bridge without one takes the lowest
MAC of its ports, and when the pod holding it went, the pods that had resolved the gateway to it
lost the host (apiserver, DNS, the controller's arrival endpoint) for 10-40 s."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from localcluster.cluster import Cluster
from localcluster.node import Bridge

pytestmark = pytest.mark.e2e


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def test_the_pod_bridge_keeps_its_mac_as_ports_come_and_go(node_cluster: Cluster) -> None:
    bridge = Bridge.for_slot(node_cluster.ports.slot)
    sysfs = Path("/sys/class/net") / bridge.name

    def mac() -> str:
        return (sysfs / "address").read_text().strip()

    assert mac() == bridge.mac
    assert (sysfs / "addr_assign_type").read_text().strip() == "3"  # set, not inherited
    # A port whose MAC is lower than any joins, then leaves: the bridge's MAC stays.
    name = f"gjt{uuid.uuid4().hex[:8]}"
    ip(
        "link",
        "add",
        name,
        "address",
        "02:00:00:00:00:01",
        "type",
        "veth",
        "peer",
        "name",
        name + "p",
    )
    try:
        ip("link", "set", name, "master", bridge.name)
        ip("link", "set", name, "up")
        assert mac() == bridge.mac
    finally:
        ip("link", "del", name)
    assert mac() == bridge.mac
