"""localcluster.kueue's pure parts: the webhook configurations it registers, its source patch."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from localcluster import kueue


def _hook(name: str, group: str, resource: str) -> dict[str, object]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                     "path": f"/mutate-{resource}"}},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "rules": [{"apiGroups": [group], "apiVersions": ["v1"], "operations": ["CREATE"],
                   "resources": [resource]}],
    }  # fmt: skip


def test_only_pod_and_kueue_webhooks_are_registered_by_url_and_pods_by_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = tmp_path / "webhooks.yaml"
    doc = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            _hook("mjob.kb.io", "batch", "jobs"),
            _hook("mpod.kb.io", "", "pods"),
            _hook("mworkload.kb.io", "kueue.x-k8s.io", "workloads"),
        ],
    }
    manifest.write_text(yaml.safe_dump(doc))
    monkeypatch.setattr(kueue, "webhook_manifest", lambda: manifest)

    (cfg,) = kueue.webhook_configurations(9443, b"PEM")
    assert cfg["metadata"] == {"name": kueue.WEBHOOK_CONFIGURATION}
    hooks = {h["name"]: h for h in cfg["webhooks"]}
    assert set(hooks) == {"mpod.kb.io", "mworkload.kb.io"}
    assert hooks["mpod.kb.io"]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-pods",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
    assert hooks["mpod.kb.io"]["objectSelector"] == {
        "matchExpressions": [{"key": kueue.QUEUE_NAME_LABEL, "operator": "Exists"}]
    }
    assert "objectSelector" not in hooks["mworkload.kb.io"]


def test_the_metrics_certificate_path_is_patched_once_or_the_build_stops(tmp_path: Path) -> None:
    main = tmp_path / "cmd" / "kueue" / "main.go"
    main.parent.mkdir(parents=True)
    main.write_text('func main() {\n\t\tmetricsCertPath := "/etc/kueue/metrics/certs"\n}\n')
    kueue._patch_source(tmp_path)
    text = main.read_text()
    assert f'os.Getenv("{kueue.METRICS_CERTS_ENV}")' in text
    # A release that moved the line: the build stops rather than run a manager that exits.
    main.write_text("func main() {}\n")
    with pytest.raises(kueue.KueueError, match="not there once"):
        kueue._patch_source(tmp_path)


def test_wait_for_pods_ready_is_off_unless_asked_for(tmp_path: Path) -> None:
    assert "waitForPodsReady" not in kueue.manager_config(tmp_path, 1, 2)
    cfg = kueue.manager_config(tmp_path, 1, 2, {"timeout": "5m"})
    assert cfg["waitForPodsReady"] == {"timeout": "5m"}
    assert cfg["integrations"] == {"frameworks": ["pod"]}
