"""The one builder of GangJob manifests for benchmarks, tests and tools: keyword arguments in, the
API dict out (camelCase, as `kubectl apply` or a create takes it). Pure and unvalidated, so a
test can also build what the apiserver must reject; `api.v1alpha1.parse_gangjob` and the CRD
say what is valid.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from api.constants import API_VERSION, KIND

TRAINER = "trainer"
"""The name of the container built from `image` and `command`."""


def role(
    name: str,
    replicas: int,
    template: Mapping[str, Any],
    *,
    ranked: bool | None = None,
    depends_on: Sequence[tuple[str, str]] = (),
    trainer_container: str | None = None,
) -> dict[str, Any]:
    """A role of `spec.roles`: `depends_on` as (role, `Ready` | `Complete`) pairs."""
    body: dict[str, Any] = {
        "name": name,
        "replicas": replicas,
        "template": copy.deepcopy(dict(template)),
    }
    if ranked is not None:
        body["ranked"] = ranked
    if depends_on:
        body["dependsOn"] = [{"role": r, "status": s} for r, s in depends_on]
    if trainer_container is not None:
        body["trainerContainer"] = trainer_container
    return body


def leader_and_elastic(
    body: dict[str, Any], workers: int, elastic: Mapping[str, Any], leaders: int = 1
) -> dict[str, Any]:
    """`body`, a job of one role (`replicas` + `template`), made a job of two roles of its
    template: `leader`, `leaders` fixed workers (the coordinator among them), then `worker`,
    `workers` of them, elastic (`spec.roles[].elastic`, which only the last role may be).
    Changes `body` and returns it."""
    spec = body["spec"]
    template = spec.pop("template")
    spec.pop("replicas")
    worker = role("worker", workers, template)
    worker["elastic"] = dict(elastic)
    spec["roles"] = [role("leader", leaders, template), worker]
    return body


def gangjob(
    name: str,
    replicas: int | None,
    *,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
    image: str | None = None,
    command: Sequence[str] | None = None,
    container: Mapping[str, Any] | None = None,
    containers: Sequence[Mapping[str, Any]] | None = None,
    template: Mapping[str, Any] | None = None,
    pod_labels: Mapping[str, str] | None = None,
    pod_spec: Mapping[str, Any] | None = None,
    restart_mode: str | None = None,
    max_restarts: int | None = None,
    failure_rules: Sequence[Mapping[str, Any]] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A GangJob of `replicas` workers; with `replicas` None, no `replicas` nor `template`
    (give `roles` in `spec`).

    The worker's pod template is `template` (copied) if given, else one with `containers`, or
    else with the single container `trainer` of `image` and `command`, plus the fields of
    `container` (env, volumeMounts...). `pod_labels` and `pod_spec` (nodeSelector, volumes...)
    are added to the template. `restart_mode`, `max_restarts` and `failure_rules` fill
    `spec.restart` and `spec.failurePolicy`; `spec` sets any other field (camelCase) last, as
    given, but for `restart`, which it adds to (`restart={"backoffSeconds": 1}` keeps the mode).
    """
    own = image is not None or command is not None or container is not None
    if own and (template is not None or containers is not None):
        raise ValueError("image, command and container build the trainer: not with a template "
                         "or containers")  # fmt: skip
    pod = copy.deepcopy(dict(template)) if template is not None else {}
    pod_body = pod.setdefault("spec", {})
    if containers is not None:
        pod_body["containers"] = [copy.deepcopy(dict(c)) for c in containers]
    elif template is None:
        trainer: dict[str, Any] = {"name": TRAINER}
        if image is not None:
            trainer["image"] = image
        if command is not None:
            trainer["command"] = list(command)
        trainer.update(copy.deepcopy(dict(container or {})))
        pod_body["containers"] = [trainer]
    if pod_labels:
        pod.setdefault("metadata", {}).setdefault("labels", {}).update(pod_labels)
    pod_body.update(copy.deepcopy(dict(pod_spec or {})))

    body: dict[str, Any] = {} if replicas is None else {"replicas": replicas, "template": pod}
    restart: dict[str, Any] = {}
    if restart_mode is not None:
        restart["mode"] = str(restart_mode)
    if max_restarts is not None:
        restart["maxRestarts"] = max_restarts
    if restart:
        body["restart"] = restart
    if failure_rules is not None:
        body["failurePolicy"] = {"rules": [copy.deepcopy(dict(r)) for r in failure_rules]}
    extra = copy.deepcopy(dict(spec or {}))
    if isinstance(extra.get("restart"), dict):
        extra["restart"] = {**restart, **extra["restart"]}
    body.update(extra)

    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": body}
