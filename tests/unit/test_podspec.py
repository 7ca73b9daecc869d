"""Unit tests of controller.policy.podspec: the headless Service and the worker pods of a gang."""

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.naming import pod_name
from api.v1alpha1 import FailureAction, GangJob, GangJobStatus, RestartMode
from controller.policy.classify import exit_code_action
from controller.policy.podspec import (
    PodSpecError,
    TemplateConflict,
    TrainerCommandRequired,
    build_pod,
    build_service,
    trainer_restart_rule,
)
from controller.policy.views import PodView
from tests.unit.builders import JOB_NAME, JOB_UID, NAMESPACE, TEMPLATE, make_job, with_status

AGENT = "localhost/gangjob-agent:dev"
OWNER = {
    "apiVersion": "gangjob.io/v1alpha1",
    "kind": "GangJob",
    "name": JOB_NAME,
    "uid": JOB_UID,
    "controller": True,
    "blockOwnerDeletion": True,
}


def env_of(pod: dict[str, Any], container: str) -> list[dict[str, Any]]:
    (found,) = [c for c in pod["spec"]["containers"] if c["name"] == container]
    env: list[dict[str, Any]] = found.get("env", [])
    return env


def test_service() -> None:
    service = build_service(make_job(master_port=1234))
    assert service == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": JOB_NAME,
            "namespace": NAMESPACE,
            "labels": {"gangjob.io/name": JOB_NAME},
            "ownerReferences": [OWNER],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"gangjob.io/name": JOB_NAME},
            "ports": [{"name": "rendezvous", "port": 1234, "targetPort": 1234, "protocol": "TCP"}],
        },
    }


def test_worker_pod() -> None:
    job = with_status(make_job(replicas=4), GangJobStatus(epoch=3))
    pod = build_pod(job, 2, AGENT)
    meta = pod["metadata"]
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert meta["name"] == pod_name(JOB_NAME, 2) == "llama-2"
    assert meta["namespace"] == NAMESPACE
    assert meta["labels"] == {
        "team": "ml",
        "gangjob.io/name": JOB_NAME,
        "gangjob.io/rank": "2",
        "gangjob.io/role": "worker",
        "gangjob.io/role-index": "2",
    }
    assert meta["annotations"] == {"note": "x", "gangjob.io/created-epoch": "3"}
    assert meta["ownerReferences"] == [OWNER]
    spec = pod["spec"]
    assert spec["hostname"] == "llama-2"
    assert spec["subdomain"] == JOB_NAME
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"gpu": "true"}
    # Ours first (and the user's RANK replaced), so the user's env may refer to $(RANK).
    assert env_of(pod, "trainer") == [
        {"name": "GANGJOB_DIR", "value": "/gangjob"},
        {"name": "GANGJOB_PROGRESS", "value": "/gangjob/progress/steps"},
        {"name": "MASTER_ADDR", "value": "llama-0.llama"},
        {"name": "MASTER_PORT", "value": "29500"},
        {"name": "WORLD_SIZE", "value": "4"},
        {"name": "RANK", "value": "2"},
        {"name": "GANGJOB_NAME", "value": JOB_NAME},
        {"name": "GANGJOB_ROLE", "value": "worker"},
        {"name": "GANGJOB_ROLE_INDEX", "value": "2"},
        {"name": "GANGJOB_ROLE_REPLICAS", "value": "4"},
        {"name": "PET_NNODES", "value": "4"},
        {"name": "PET_NODE_RANK", "value": "2"},
        {"name": "PET_NPROC_PER_NODE", "value": "1"},
        {"name": "PET_MASTER_ADDR", "value": "llama-0.llama"},
        {"name": "PET_MASTER_PORT", "value": "29500"},
        {"name": "PET_MAX_RESTARTS", "value": "0"},
        {"name": "LR", "value": "0.1"},
    ]
    assert env_of(pod, "logger") == []


def test_worker_pod_parses_back_as_the_worker() -> None:
    view = PodView.from_pod(build_pod(make_job(), 1, AGENT))
    assert view.rank == 1
    assert view.controller_uid == JOB_UID
    assert view.created_epoch == 0
    assert view.arrived_epoch is None


def test_trainer_container_named() -> None:
    pod = build_pod(make_job(trainerContainer="logger"), 0, AGENT)
    assert [e["name"] for e in env_of(pod, "logger")][:6] == [
        "GANGJOB_DIR",
        "GANGJOB_PROGRESS",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
    ]
    assert env_of(pod, "trainer") == TEMPLATE["spec"]["containers"][0]["env"]


@pytest.mark.parametrize("mode", list(RestartMode))
def test_restart_policy_is_the_controllers(mode: RestartMode) -> None:
    """The CRD says so: restarts are the gang's business, not the kubelet's."""
    job = make_job(restart={"mode": mode})
    job.spec.effective_roles[0].template["spec"]["restartPolicy"] = "OnFailure"
    assert build_pod(job, 0, AGENT)["spec"]["restartPolicy"] == "Never"


def test_protocol_annotations_of_the_template_are_dropped() -> None:
    """A template cannot make a fresh worker look arrived or report a fake exit."""
    job = make_job()
    job.spec.effective_roles[0].template["metadata"]["annotations"] = {
        "gangjob.io/epoch": "5",
        "gangjob.io/exit": "5:1",
        "gangjob.io/created-epoch": "5",
        "keep": "me",
    }
    assert build_pod(job, 0, AGENT)["metadata"]["annotations"] == {
        "keep": "me",
        "gangjob.io/created-epoch": "0",
    }


def test_controller_labels_win() -> None:
    job = make_job()
    job.spec.effective_roles[0].template["metadata"]["labels"] = {
        "gangjob.io/rank": "7",
        "gangjob.io/name": "x",
    }
    labels = build_pod(job, 0, AGENT)["metadata"]["labels"]
    assert labels == {
        "gangjob.io/name": JOB_NAME,
        "gangjob.io/rank": "0",
        "gangjob.io/role": "worker",
        "gangjob.io/role-index": "0",
    }


def test_pods_share_nothing_with_the_template() -> None:
    job = make_job()
    first, second = build_pod(job, 0, AGENT), build_pod(job, 1, AGENT)
    first["spec"]["containers"][0]["image"] = "changed"
    first["spec"]["nodeSelector"]["gpu"] = "changed"
    first["spec"]["initContainers"][0]["env"][0]["value"] = "changed"
    first["spec"]["containers"][0]["restartPolicyRules"][0]["exitCodes"]["values"].append(7)
    assert second["spec"]["containers"][0]["image"] == "trainer:1"
    assert second["spec"]["initContainers"][0]["env"][0]["value"] == JOB_NAME
    assert second["spec"]["containers"][0]["restartPolicyRules"][0]["exitCodes"]["values"] == [0]
    assert job.spec.effective_roles[0].template == TEMPLATE


def test_template_without_metadata() -> None:
    job = make_job()
    del job.spec.effective_roles[0].template["metadata"]
    pod = build_pod(job, 0, AGENT)
    assert pod["metadata"]["labels"] == {
        "gangjob.io/name": JOB_NAME,
        "gangjob.io/rank": "0",
        "gangjob.io/role": "worker",
        "gangjob.io/role-index": "0",
    }


def test_a_job_without_uid_cannot_own_pods() -> None:
    job = make_job()
    job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"uid": None})})
    with pytest.raises(ValueError, match="uid"):
        build_pod(job, 0, AGENT)


# --- Pod mode ----------------------------------------------------------------------------------


def spec_of(job: GangJob, rank: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = build_pod(job, rank, AGENT)["spec"]
    return spec


def container(spec: dict[str, Any], name: str, key: str = "containers") -> dict[str, Any]:
    (found,) = [c for c in spec.get(key, []) if c["name"] == name]
    result: dict[str, Any] = found
    return result


def agent_container(spec: dict[str, Any], mode: RestartMode) -> dict[str, Any]:
    """The container the agent runs in: the trainer's in `Process` mode (the wrapper), else
    the native sidecar."""
    if mode is RestartMode.PROCESS:
        return container(spec, "trainer")
    return container(spec, "gangjob-agent", "initContainers")


AGENT_ENV = [
    {"name": "GANGJOB_NAME", "value": JOB_NAME},
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    {"name": "GANGJOB_AGENT_PORT", "value": "9445"},
    {"name": "GANGJOB_DIR", "value": "/gangjob"},
]
HARDENED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}


def sidecar(failure_threshold: int = 660, **extra: Any) -> dict[str, Any]:
    return {
        "name": "gangjob-agent",
        "image": AGENT,
        "args": ["sidecar"],
        "restartPolicy": "Always",
        "env": AGENT_ENV,
        "ports": [{"name": "gangjob-agent", "containerPort": 9445}],
        "startupProbe": {
            "httpGet": {"path": "/barrier", "port": 9445},
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "failureThreshold": failure_threshold,
        },
        "volumeMounts": [{"name": "gangjob", "mountPath": "/gangjob"}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": HARDENED,
        **extra,
    }


def test_pod_mode_injects_the_agent_as_a_native_sidecar() -> None:
    spec = spec_of(make_job(restart={"mode": "Pod", "barrierTimeoutSeconds": 30}))
    assert spec["initContainers"] == [
        sidecar(
            failure_threshold=90,
            restartPolicyRules=[
                {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [86]}}
            ],
        )
    ]
    assert spec["volumes"] == [{"name": "gangjob", "emptyDir": {}}]
    assert spec["serviceAccountName"] == "gangjob-worker"
    assert spec["restartPolicy"] == "Never"


def test_pod_mode_trainer() -> None:
    trainer = container(spec_of(make_job()), "trainer")
    assert trainer["restartPolicy"] == "Never"
    assert trainer["restartPolicyRules"] == [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}
    ]
    assert trainer["volumeMounts"] == [
        {"name": "gangjob", "mountPath": "/gangjob", "readOnly": True},
        {"name": "gangjob", "mountPath": "/gangjob/progress", "subPath": "progress"},
    ]
    assert trainer["env"][0] == {"name": "GANGJOB_DIR", "value": "/gangjob"}
    assert trainer["command"] == ["python", "train.py"]


def test_pod_mode_leaves_other_containers_alone() -> None:
    logger = container(spec_of(make_job()), "logger")
    assert logger == {"name": "logger", "image": "logger:1"}


def on_exit(action: str, operator: str, *values: int, container: str | None = None) -> Any:
    matcher: dict[str, Any] = {"operator": operator, "values": list(values)}
    if container is not None:
        matcher["containerName"] = container
    return {"action": action, "onExitCodes": matcher}


def everything_but(*codes: int) -> list[int]:
    return [code for code in range(1, 256) if code not in codes]


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        pytest.param([], ("NotIn", [0]), id="default: every failure restarts the gang"),
        pytest.param(
            [on_exit("FailJob", "In", 3)], ("NotIn", [0, 3]), id="a non-retriable code is out"
        ),
        pytest.param(
            [
                on_exit("FailJob", "In", 3, 4),
                on_exit("RecreateWorker", "In", 137),
                on_exit("Ignore", "In", 143),
            ],
            ("NotIn", [0, 3, 4, 137, 143]),
            id="FailJob, RecreateWorker and Ignore all stay out",
        ),
        pytest.param(
            [on_exit("RestartGang", "In", 3), on_exit("FailJob", "In", 3, 4)],
            ("NotIn", [0, 4]),
            id="first match wins: RestartGang before FailJob",
        ),
        pytest.param(
            [on_exit("FailJob", "NotIn", 1, 2)],
            ("In", [1, 2]),
            id="NotIn FailJob: only its values are retriable",
        ),
        pytest.param(
            [on_exit("RestartGang", "In", 1, 2), on_exit("FailJob", "NotIn", 5)],
            ("In", [1, 2, 5]),
            id="NotIn leaves its values to the default",
        ),
        pytest.param(
            [on_exit("RestartGang", "NotIn", 7), on_exit("FailJob", "In", 7)],
            ("NotIn", [0, 7]),
            id="NotIn RestartGang",
        ),
        pytest.param(
            [on_exit("FailJob", "In", 3, container="trainer")],
            ("NotIn", [0, 3]),
            id="the trainer named explicitly",
        ),
        pytest.param(
            [on_exit("FailJob", "In", 3, container="logger")],
            ("NotIn", [0]),
            id="another container's rule does not concern the trainer",
        ),
        pytest.param(
            [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}],
            ("NotIn", [0]),
            id="rules on pod conditions are not the kubelet's business",
        ),
        pytest.param(
            [on_exit("FailJob", "In", *range(1, 128))],
            ("NotIn", [0, *range(1, 128)]),
            id="a tie of the two forms (128 values each): NotIn",
        ),
        pytest.param(
            [on_exit("FailJob", "In", *range(1, 129))],
            ("In", list(range(129, 256))),
            id="the shorter form: In (127 values, not 129)",
        ),
        pytest.param(
            [on_exit("FailJob", "In", *range(1, 255))],
            ("In", [255]),
            id="one retriable code",
        ),
        pytest.param(
            [on_exit("FailJob", "In", *range(2, 256))],
            ("In", [1]),
            id="255 values in a matcher",
        ),
    ],
)
def test_trainer_restart_rule(rules: list[Any], expected: tuple[str, list[int]]) -> None:
    job = make_job(failurePolicy={"rules": rules})
    operator, values = expected
    rule = {"action": "RestartAllContainers", "exitCodes": {"operator": operator, "values": values}}
    assert trainer_restart_rule(job) == rule
    assert container(spec_of(job), "trainer")["restartPolicyRules"] == [rule]


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param([on_exit("FailJob", "NotIn", 200)], id="NotIn FailJob"),
        pytest.param([on_exit("RecreateWorker", "In", *range(1, 256))], id="every code"),
    ],
)
def test_trainer_without_retriable_codes_gets_no_rule(rules: list[Any]) -> None:
    # With the NotIn rule, 200 falls through to the second rule: nothing is left retriable.
    job = make_job(failurePolicy={"rules": [*rules, on_exit("FailJob", "In", 200)]})
    assert trainer_restart_rule(job) is None
    trainer = container(spec_of(job), "trainer")
    assert trainer["restartPolicy"] == "Never"
    assert "restartPolicyRules" not in trainer


def test_rule_follows_a_named_trainer() -> None:
    job = make_job(
        trainerContainer="logger",
        failurePolicy={
            "rules": [on_exit("FailJob", "In", 9), on_exit("FailJob", "In", 3, container="trainer")]
        },
    )
    spec = spec_of(job)
    assert container(spec, "logger")["restartPolicyRules"][0]["exitCodes"] == {
        "operator": "NotIn",
        "values": [0, 9],
    }
    assert "restartPolicyRules" not in container(spec, "trainer")


def test_exit_code_action_of_the_policy() -> None:
    job = make_job(
        failurePolicy={
            "rules": [
                on_exit("Ignore", "In", 1),
                on_exit("FailJob", "NotIn", 1, 2),
                on_exit("RecreateWorker", "In", 3, container="logger"),
            ]
        }
    )
    assert exit_code_action(job, "trainer", 0) is None
    assert exit_code_action(job, "trainer", 1) is FailureAction.IGNORE
    assert exit_code_action(job, "trainer", 2) is FailureAction.RESTART_GANG
    assert exit_code_action(job, "trainer", 3) is FailureAction.FAIL_JOB
    assert exit_code_action(job, "logger", 3) is FailureAction.RECREATE_WORKER
    assert exit_code_action(job, "logger", 4) is FailureAction.RESTART_GANG


_CODES = st.lists(st.integers(1, 255), min_size=1, max_size=255, unique=True)
_RULES = st.lists(
    st.builds(
        lambda action, operator, values, named: on_exit(
            action, operator, *values, container="trainer" if named else None
        ),
        st.sampled_from([a.value for a in FailureAction]),
        st.sampled_from(["In", "NotIn"]),
        _CODES,
        st.booleans(),
    ),
    max_size=20,
)


@given(rules=_RULES)
@settings(max_examples=200, deadline=None)
def test_trainer_rule_matches_exactly_the_retriable_codes(rules: list[Any]) -> None:
    """Whatever the policy: the kubelet restarts the pod for a code iff the controller would
    restart the gang for it, and the rule is one the apiserver accepts (<= 255 values)."""
    job = make_job(failurePolicy={"rules": rules})
    rule = trainer_restart_rule(job)
    for code in range(0, 256):
        retriable = exit_code_action(job, "trainer", code) is FailureAction.RESTART_GANG
        if rule is None:
            assert not retriable
            continue
        exit_codes = rule["exitCodes"]
        in_values = code in exit_codes["values"]
        matches = in_values if exit_codes["operator"] == "In" else not in_values
        assert matches is retriable, code
    if rule is not None:
        values = rule["exitCodes"]["values"]
        assert 1 <= len(values) <= 255
        assert values == sorted(set(values))


# --- Process mode --------------------------------------------------------------------------------


def test_process_mode_wraps_the_trainer_command() -> None:
    job = make_job(restart={"mode": "Process"})
    job.spec.effective_roles[0].template["spec"]["containers"][0]["args"] = ["--lr", "$(LR)"]
    spec = spec_of(job)
    trainer = container(spec, "trainer")
    assert trainer["command"] == [
        "python3",
        "/gangjob/agent.pyz",
        "wrap",
        "--",
        "python",
        "train.py",
        "--lr",
        "$(LR)",
    ]
    assert "args" not in trainer
    assert trainer["restartPolicy"] == "Never"
    assert "restartPolicyRules" not in trainer
    assert "startupProbe" not in trainer
    # The agent runs in the trainer's container, and writes the epoch file itself.
    assert trainer["volumeMounts"] == [{"name": "gangjob", "mountPath": "/gangjob"}]
    names = [e["name"] for e in trainer["env"]]
    assert names == [
        "GANGJOB_NAME",
        "POD_NAME",
        "POD_NAMESPACE",
        "POD_UID",
        "GANGJOB_AGENT_PORT",
        "GANGJOB_DIR",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "GANGJOB_ROLE",
        "GANGJOB_ROLE_INDEX",
        "GANGJOB_ROLE_REPLICAS",
        "PET_NNODES",
        "PET_NODE_RANK",
        "PET_NPROC_PER_NODE",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        "PET_MAX_RESTARTS",
        "LR",
    ]
    assert trainer["env"][:6] == AGENT_ENV
    assert spec["initContainers"] == [
        {
            "name": "gangjob-agent-install",
            "image": AGENT,
            "command": ["cp", "/opt/gangjob/agent.pyz", "/gangjob/agent.pyz"],
            "volumeMounts": [{"name": "gangjob", "mountPath": "/gangjob"}],
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            "securityContext": HARDENED,
        }
    ]
    assert spec["volumes"] == [{"name": "gangjob", "emptyDir": {}}]
    assert spec["serviceAccountName"] == "gangjob-worker"


def test_process_mode_needs_the_trainer_command() -> None:
    job = make_job(restart={"mode": "Process"}, trainerContainer="logger")
    with pytest.raises(TrainerCommandRequired) as caught:
        build_pod(job, 0, AGENT)
    error = caught.value
    assert isinstance(error, PodSpecError)
    assert error.reason == "TrainerCommandRequired"
    assert error.field == "spec.template.spec.containers[1].command"
    assert str(error).startswith("spec.template.spec.containers[1].command: restart mode Process")


def test_process_mode_also_via_status_mode() -> None:
    """The mode in effect is `status.mode` when the controller fell back."""
    job = with_status(make_job(restart={"mode": "Pod"}), GangJobStatus(mode=RestartMode.PROCESS))
    assert container(spec_of(job), "trainer")["command"][:4] == [
        "python3",
        "/gangjob/agent.pyz",
        "wrap",
        "--",
    ]


# --- Recreate mode -------------------------------------------------------------------------------


def test_a_trainer_the_kubelet_starts_keeps_the_images_python_path() -> None:
    # The image's PYTHONPATH (a trainer image's site-packages) is unknown to the controller: a
    # value in the pod would replace it.
    for mode in ("Pod", "Recreate"):
        trainer = container(spec_of(make_job(restart={"mode": mode})), "trainer")
        assert all(e["name"] != "PYTHONPATH" for e in trainer["env"])


def test_the_agent_knows_hang_seconds_and_a_big_gangs_summary_period() -> None:
    small = container(
        spec_of(make_job(progress={"hangSeconds": 60})), "gangjob-agent", "initContainers"
    )
    assert {"name": "GANGJOB_HANG_SECONDS", "value": "60"} in small["env"]
    assert all(e["name"] != "GANGJOB_PROGRESS_SUMMARY_SECONDS" for e in small["env"])
    big = container(spec_of(make_job(replicas=5000)), "gangjob-agent", "initContainers")
    assert {"name": "GANGJOB_PROGRESS_SUMMARY_SECONDS", "value": "100"} in big["env"]
    assert all(e["name"] != "GANGJOB_HANG_SECONDS" for e in big["env"])


def test_recreate_mode_has_the_barrier_but_no_restart_rules() -> None:
    spec = spec_of(make_job(restart={"mode": "Recreate"}))
    assert spec["initContainers"] == [sidecar()]
    trainer = container(spec, "trainer")
    assert trainer["restartPolicy"] == "Never"
    assert "restartPolicyRules" not in trainer
    assert trainer["volumeMounts"] == [
        {"name": "gangjob", "mountPath": "/gangjob", "readOnly": True},
        {"name": "gangjob", "mountPath": "/gangjob/progress", "subPath": "progress"},
    ]


# --- every mode ----------------------------------------------------------------------------------

USER_SPEC: dict[str, Any] = {
    "serviceAccountName": "mine",
    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
    "initContainers": [
        {"name": "fetch", "image": "fetch:1", "command": ["fetch"]},
        {"name": "shipper", "image": "ship:1", "restartPolicy": "Always"},
    ],
    "containers": [
        {
            "name": "trainer",
            "image": "trainer:1",
            "command": ["torchrun"],
            "args": ["train.py"],
            "env": [{"name": "LR", "value": "0.1"}],
            "resources": {"limits": {"nvidia.com/gpu": "8"}},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "ports": [{"containerPort": 29500}],
        },
        {"name": "logger", "image": "logger:1", "env": [{"name": "X", "value": "1"}]},
    ],
    "tolerations": [{"key": "gpu", "operator": "Exists"}],
}


@pytest.mark.parametrize("mode", list(RestartMode))
def test_the_users_template_is_kept(mode: RestartMode) -> None:
    job = make_job(restart={"mode": mode})
    job.spec.effective_roles[0].template["spec"] = copy.deepcopy(USER_SPEC)
    spec = spec_of(job)
    assert spec["serviceAccountName"] == "mine"
    assert spec["tolerations"] == USER_SPEC["tolerations"]
    assert spec["volumes"] == [*USER_SPEC["volumes"], {"name": "gangjob", "emptyDir": {}}]
    # The user's init containers run first, unchanged; ours comes last.
    assert spec["initContainers"][:2] == USER_SPEC["initContainers"]
    assert len(spec["initContainers"]) == 3
    assert spec["containers"][1] == USER_SPEC["containers"][1]
    trainer = spec["containers"][0]
    user_trainer = USER_SPEC["containers"][0]
    for key in ("image", "resources", "ports"):
        assert trainer[key] == user_trainer[key]
    assert trainer["volumeMounts"][0] == user_trainer["volumeMounts"][0]
    assert trainer["env"][-1] == {"name": "LR", "value": "0.1"}
    assert job.spec.effective_roles[0].template["spec"] == USER_SPEC


@pytest.mark.parametrize("mode", list(RestartMode))
@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param(
            lambda s: s["containers"].append({"name": "gangjob-agent", "image": "x"}),
            "spec.template.spec.containers[2].name",
            id="container name",
        ),
        pytest.param(
            lambda s: s.setdefault("initContainers", []).append(
                {"name": "gangjob-agent-install", "image": "x"}
            ),
            "spec.template.spec.initContainers[0].name",
            id="init container name",
        ),
        pytest.param(
            lambda s: s.setdefault("volumes", []).append({"name": "gangjob", "emptyDir": {}}),
            "spec.template.spec.volumes[0].name",
            id="volume name",
        ),
        pytest.param(
            lambda s: (
                s["containers"][0]
                .setdefault("volumeMounts", [])
                .append({"name": "x", "mountPath": "/gangjob/"})
            ),
            "spec.template.spec.containers[0].volumeMounts[0].mountPath",
            id="mount path",
        ),
        pytest.param(
            lambda s: s["containers"][0].update(restartPolicy="OnFailure"),
            "spec.template.spec.containers[0].restartPolicy",
            id="trainer restart policy",
        ),
        pytest.param(
            lambda s: s["containers"][0].update(
                restartPolicy="Never",
                restartPolicyRules=[
                    {"action": "Restart", "exitCodes": {"operator": "In", "values": [1]}}
                ],
            ),
            "spec.template.spec.containers[0].restartPolicy",
            id="trainer restart rules",
        ),
    ],
)
def test_template_conflicts(mode: RestartMode, change: Any, field: str) -> None:
    job = make_job(restart={"mode": mode})
    change(job.spec.effective_roles[0].template["spec"])
    with pytest.raises(TemplateConflict) as caught:
        build_pod(job, 0, AGENT)
    assert caught.value.field == field
    assert caught.value.reason == "TemplateConflict"


def test_a_trainer_restart_policy_of_never_is_fine() -> None:
    job = make_job()
    job.spec.effective_roles[0].template["spec"]["containers"][0]["restartPolicy"] = "Never"
    assert container(spec_of(job), "trainer")["restartPolicy"] == "Never"


def guaranteed(cpu: str, memory: str) -> dict[str, Any]:
    return {"limits": {"cpu": cpu, "memory": memory}}


@pytest.mark.parametrize("mode", list(RestartMode))
def test_a_guaranteed_pod_stays_guaranteed(mode: RestartMode) -> None:
    job = make_job(restart={"mode": mode})
    containers = job.spec.effective_roles[0].template["spec"]["containers"]
    containers[0]["resources"] = {
        "requests": {"cpu": "8", "memory": "64Gi"},
        "limits": {"cpu": "8000m", "memory": "64Gi", "nvidia.com/gpu": "8"},
    }
    containers[1]["resources"] = guaranteed("100m", "1Gi")
    (ours,) = spec_of(job)["initContainers"]
    assert ours["resources"] == {
        "requests": {"cpu": "100m", "memory": "64Mi"},
        "limits": {"cpu": "100m", "memory": "64Mi"},
    }


@pytest.mark.parametrize(
    "resources",
    [
        pytest.param(None, id="none"),
        pytest.param({"limits": {"cpu": "8"}}, id="no memory limit"),
        pytest.param(
            {"requests": {"cpu": "4"}, "limits": {"cpu": "8", "memory": "1Gi"}}, id="burstable"
        ),
    ],
)
def test_a_burstable_pod_gets_no_agent_limits(resources: dict[str, Any] | None) -> None:
    job = make_job()
    containers = job.spec.effective_roles[0].template["spec"]["containers"]
    containers[1]["resources"] = guaranteed("1", "1Gi")
    if resources is not None:
        containers[0]["resources"] = resources
    (ours,) = spec_of(job)["initContainers"]
    assert ours["resources"] == {"requests": {"cpu": "100m", "memory": "64Mi"}}


def test_pod_level_resources_leave_the_agent_within_them() -> None:
    job = make_job()
    job.spec.effective_roles[0].template["spec"]["resources"] = guaranteed("8", "64Gi")
    (ours,) = spec_of(job)["initContainers"]
    assert "resources" not in ours


TOKEN_MOUNT = {
    "name": "gangjob-token",
    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
    "readOnly": True,
}


@pytest.mark.parametrize("mode", list(RestartMode))
def test_no_automounted_token_gives_the_agent_its_own(mode: RestartMode) -> None:
    job = make_job(restart={"mode": mode})
    job.spec.effective_roles[0].template["spec"]["automountServiceAccountToken"] = False
    spec = spec_of(job)
    assert spec["automountServiceAccountToken"] is False
    (token,) = [v for v in spec["volumes"] if v["name"] == "gangjob-token"]
    sources = token["projected"]["sources"]
    assert sources[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}
    # Only the container that runs the agent gets the token.
    agent_runs_in = (
        container(spec, "trainer")
        if mode is RestartMode.PROCESS
        else container(spec, "gangjob-agent", "initContainers")
    )
    assert TOKEN_MOUNT in agent_runs_in["volumeMounts"]
    others = [c for c in [*spec["containers"], *spec["initContainers"]] if c is not agent_runs_in]
    assert all(TOKEN_MOUNT not in c.get("volumeMounts", []) for c in others)


def test_automounted_token_is_not_duplicated() -> None:
    spec = spec_of(make_job())
    assert [v["name"] for v in spec["volumes"]] == ["gangjob"]


@pytest.mark.parametrize("mode", [RestartMode.POD, RestartMode.PROCESS, RestartMode.RECREATE])
def test_arrival_endpoint_gives_the_agent_its_url_and_an_audience_bound_token(
    mode: RestartMode,
) -> None:
    """With the controller's arrival endpoint configured, the agent (sidecar, or the wrapped
    trainer in Process mode) gets its URL and a projected token for that audience alone."""
    job = make_job(restart={"mode": mode.value})
    url = "http://gangjob-arrivals.gangjob-system.svc:8082"
    spec = build_pod(job, 0, AGENT, url)["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "gangjob-arrival-token"]
    assert volume["projected"]["sources"] == [
        {
            "serviceAccountToken": {
                "path": "token",
                "audience": "gangjob.io/arrival",
                "expirationSeconds": 3600,
            }
        }
    ]
    agent = agent_container(spec, mode)
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["GANGJOB_ARRIVAL_URL"] == url
    assert env["GANGJOB_ARRIVAL_TOKEN_FILE"] == "/var/run/secrets/gangjob.io/arrival/token"
    assert {
        "name": "gangjob-arrival-token",
        "mountPath": "/var/run/secrets/gangjob.io/arrival",
        "readOnly": True,
    } in agent["volumeMounts"]
    # Without it, nothing of the kind.
    plain = build_pod(job, 0, AGENT)["spec"]
    assert all(v["name"] != "gangjob-arrival-token" for v in plain["volumes"])


@pytest.mark.parametrize("mode", [RestartMode.POD, RestartMode.PROCESS, RestartMode.RECREATE])
def test_an_https_endpoint_gives_the_agent_the_ca_beside_the_token(mode: RestartMode) -> None:
    """The CA of an https:// endpoint travels as the URL does: in the agent's environment,
    from the pod's creation; an http:// endpoint gets none (the agent would refuse one)."""
    job = make_job(restart={"mode": mode.value})
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    url = "https://gangjob-arrivals.gangjob-system.svc:8082"
    spec = build_pod(job, 0, AGENT, url, ca)["spec"]
    agent = agent_container(spec, mode)
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["GANGJOB_ARRIVAL_URL"] == url
    assert env["GANGJOB_ARRIVAL_CA_PEM"] == ca
    plain = build_pod(job, 0, AGENT, "http://127.0.0.1:8082", ca)["spec"]
    names = [e["name"] for c in plain.get("initContainers", []) + plain["containers"]
             for e in c.get("env") or []]  # fmt: skip
    assert "GANGJOB_ARRIVAL_CA_PEM" not in names
