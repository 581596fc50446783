"""deploy/k8s renders, passes the Kubernetes API's schemas, and runs what docker-compose.yml runs.

The manifests are rendered offline by ``kubectl kustomize`` (scripts/test installs Debian's
``kubernetes-client`` where kubectl is missing and apt-get allows); without kubectl these
tests skip, saying so, and fail under CI. The rendered objects are checked against the API's
own JSON schemas (``kubernetes-validate``, bundled, no network) for the oldest Kubernetes the
manifests claim and the newest the package knows. KEDA's ScaledObject is no core kind: its
shape is checked against the small schema below, and its queue against a real Redis.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import redis
import yaml

from signalbox.shared.celery_app import (
    ORCHESTRATOR_QUEUE,
    RUN_TOOL_TASK,
    RUN_TURN_TASK,
    TOOLS_QUEUE,
    make_celery,
)
from signalbox.shared.settings import CommonSettings, load
from tests.test_compose import SETTINGS_OF, _known_settings

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
# The oldest Kubernetes the manifests are for (appArmorProfile is a field from 1.30 on).
OLDEST_KUBERNETES = "1.30.0"
RENDER_TIMEOUT_S = 120
SECRET_NAME = "signalbox-secrets"
# Secret key -> a stand-in value, for loading each service's settings from its environment.
SECRET_STAND_INS = {
    "database-url": "postgresql://signalbox:pw@postgres:5432/signalbox",
    "internal-token": "x" * 32,
    "anthropic-api-key": "sk-ant-test",
}
SECRET_VARIABLES = {"SIGNALBOX_DATABASE_URL", "SIGNALBOX_INTERNAL_TOKEN", "ANTHROPIC_API_KEY"}
# The one workload that cannot run as non-root: bubblewrap needs root (docs/operations.md,
# "The sandbox service"); docker-compose.yml runs it as `user: root` too.
ROOT_WORKLOADS = {"tools-sandbox"}

# What KEDA's ScaledObject CRD (keda.sh/v1alpha1) accepts, as far as these manifests use it:
# unknown fields refused, trigger metadata a map of strings (the CRD's map[string]string).
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "initialCooldownPeriod": {"type": "integer", "minimum": 0},
                "idleReplicaCount": {"type": "integer", "minimum": 0},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "fallback": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["failureThreshold", "replicas"],
                    "properties": {
                        "failureThreshold": {"type": "integer", "minimum": 0},
                        "replicas": {"type": "integer", "minimum": 0},
                    },
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            # behavior: checked as an HPA's, by the Kubernetes schema
                            "properties": {"name": {"type": "string"}, "behavior": {}},
                        },
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "kind": {
                                        "enum": [
                                            "TriggerAuthentication",
                                            "ClusterTriggerAuthentication",
                                        ]
                                    },
                                },
                            },
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}
# The redis (lists) scaler's metadata: the list, the target per replica, and where Redis is.
REDIS_TRIGGER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["listName", "listLength"],
    "properties": {
        "listName": {"type": "string", "minLength": 1},
        "listLength": {"type": "string", "pattern": "^[1-9][0-9]*$"},
        "activationListLength": {"type": "string", "pattern": "^[0-9]+$"},
        "databaseIndex": {"type": "string", "pattern": "^[0-9]+$"},
        "address": {"type": "string", "pattern": "^[^:/]+:[0-9]+$"},
    },
    "anyOf": [
        {"required": ["address"]},
        {"required": ["addressFromEnv"]},
        {"required": ["host", "port"]},
    ],
}

Doc = dict[str, Any]


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        return kubectl
    missing = "kubectl is not installed (Debian: apt-get install kubernetes-client)"
    if os.environ.get("CI"):
        pytest.fail(f"CI must render the Kubernetes manifests, but {missing}")
    pytest.skip(missing)


def render(kustomization: Path) -> list[Doc]:
    """The objects ``kubectl kustomize`` makes of one kustomization directory."""
    done = subprocess.run(
        [_kubectl(), "kustomize", str(kustomization)],
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_S,
    )
    assert done.returncode == 0, f"kubectl kustomize {kustomization} failed:\n{done.stderr}"
    docs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert docs, f"{kustomization} rendered nothing"
    return docs


@pytest.fixture(scope="module")
def base() -> list[Doc]:
    return render(K8S / "base")


@pytest.fixture(scope="module")
def production() -> list[Doc]:
    return render(K8S / "overlays" / "production")


@pytest.fixture(scope="module", params=["base", "production"])
def rendered(request: pytest.FixtureRequest) -> list[Doc]:
    docs: list[Doc] = request.getfixturevalue(request.param)
    return docs


@pytest.fixture(scope="module")
def compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services


def of_kind(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def workloads(docs: list[Doc]) -> dict[str, Doc]:
    """Deployments and Jobs by name."""
    return {**of_kind(docs, "Deployment"), **of_kind(docs, "Job")}


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def the_container(workload: Doc) -> Doc:
    containers: list[Doc] = pod_spec(workload)["containers"]
    assert len(containers) == 1, workload["metadata"]["name"]
    return containers[0]


def settings_map(docs: list[Doc]) -> dict[str, str]:
    """The generated ConfigMap's data (its name carries a hash suffix)."""
    maps = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("signalbox-settings")
    ]
    assert len(maps) == 1, [m["metadata"]["name"] for m in maps]
    data: dict[str, str] = maps[0]["data"]
    return data


def k8s_invocation(container: Doc) -> list[str]:
    """command + args, with Kubernetes' ``$$`` escape undone (as a shell would see them)."""
    words = [str(w) for w in container.get("command", []) + container.get("args", [])]
    return [w.replace("$$(", "$(") for w in words]


def compose_invocation(service: dict[str, Any]) -> list[str]:
    """entrypoint + command, with compose's ``$$`` escape undone."""
    words: list[str] = []
    for key in ("entrypoint", "command"):
        value = service.get(key, [])
        words += value.split() if isinstance(value, str) else [str(v) for v in value]
    return [w.replace("$$", "$") for w in words]


def _validate_core(doc: Doc) -> None:
    for version in (OLDEST_KUBERNETES, kubernetes_validate.latest_version()):
        kubernetes_validate.validate(doc, version, strict=True)


def test_every_object_passes_the_kubernetes_schemas(rendered: list[Doc]) -> None:
    kinds = set()
    for doc in rendered:
        kinds.add(doc["kind"])
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # no core kind: test_scaled_objects_have_the_shape_keda_reads
        try:
            _validate_core(doc)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc}")
    assert {"Deployment", "Job", "Service", "PodDisruptionBudget", "ConfigMap"} <= kinds


def test_the_schema_check_refuses_a_broken_object(base: list[Doc]) -> None:
    """The check above can fail: a misspelt field and a wrong type are both refused."""
    misspelt = copy.deepcopy(workloads(base)["gateway"])
    container = the_container(misspelt)
    container["readinesProbe"] = container.pop("readinessProbe")
    wrong_type = copy.deepcopy(workloads(base)["gateway"])
    wrong_type["spec"]["replicas"] = "three"
    for broken in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            _validate_core(broken)


def test_every_compose_service_has_a_workload_running_the_same_command(
    base: list[Doc], compose_services: dict[str, dict[str, Any]]
) -> None:
    # Optional profiles (flower, observability) are compose's local tools: a cluster has its
    # own monitoring (docs/operations.md, Kubernetes).
    ours = {
        name: svc
        for name, svc in compose_services.items()
        if "build" in svc and not svc.get("profiles")
    }
    found = workloads(base)
    assert set(ours) <= set(found), f"no Deployment or Job for {set(ours) - set(found)}"
    for name, service in ours.items():
        container = the_container(found[name])
        assert k8s_invocation(container) == compose_invocation(service), name
        assert container["image"].split(":")[0].endswith("signalbox"), name
    # Redis and PostgreSQL are the deployment's own (managed or not): docs/operations.md.
    assert not {"redis", "postgres"} & set(found)


def test_every_deployment_has_probes_resources_and_runs_as_non_root(base: list[Doc]) -> None:
    for name, workload in workloads(base).items():
        spec = pod_spec(workload)
        container = the_container(workload)
        if workload["kind"] == "Deployment":
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                assert probe in container, f"{name} has no {probe}"
        for side in ("requests", "limits"):
            assert set(container["resources"][side]) == {"cpu", "memory"}, f"{name} {side}"
        assert spec.get("automountServiceAccountToken") is False, name
        context = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
        assert context.get("seccompProfile") == {"type": "RuntimeDefault"}, name
        if name in ROOT_WORKLOADS:
            assert context.get("runAsUser") == 0 and not context.get("runAsNonRoot"), name
            continue
        assert context.get("runAsNonRoot") is True, f"{name} may run as root"
        assert context.get("runAsUser") == 10001, name  # the image's user `signalbox`
        assert context.get("allowPrivilegeEscalation") is False, name
        assert context.get("capabilities") == {"drop": ["ALL"]}, name
        assert context.get("readOnlyRootFilesystem") is True, name
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert "/tmp" in mounts, f"{name}: a read-only root needs a writable /tmp"


def test_http_services_probe_health_and_readiness(base: list[Doc]) -> None:
    services = of_kind(base, "Service")
    for name in ("gateway", "proposals"):
        container = the_container(workloads(base)[name])
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
        port = container["command"][container["command"].index("--port") + 1]
        assert [p["containerPort"] for p in container["ports"]] == [int(port)], name
        selector = services[name]["spec"]["selector"]
        assert (
            selector.items()
            <= workloads(base)[name]["spec"]["template"]["metadata"]["labels"].items()
        )
    # The URL the gateway and the tool workers are given names the proposals Service's port.
    url = urlsplit(settings_map(base)["SIGNALBOX_PROPOSALS_URL"])
    assert url.hostname == "proposals"
    assert url.port in {p["port"] for p in services["proposals"]["spec"]["ports"]}


def test_worker_probes_ping_the_pods_own_worker(base: list[Doc]) -> None:
    """``signalbox.probe worker NODE@%h --queue Q`` names the worker ``-n NODE@%h`` started
    (%h: the pod's name) and a queue it was told to consume (``-Q``)."""
    checked = 0
    for name, workload in of_kind(base, "Deployment").items():
        command = k8s_invocation(the_container(workload))
        if "celery" not in command:
            continue
        node = command[command.index("-n") + 1]
        queues = command[command.index("-Q") + 1].split(",")
        assert node.endswith("@%h"), name
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe_command = the_container(workload)[probe]["exec"]["command"]
            assert probe_command[:5] == ["python", "-m", "signalbox.probe", "worker", node], (
                f"{name} {probe}"
            )
            queue = probe_command[probe_command.index("--queue") + 1]
            assert queue in queues, f"{name} {probe}"
            assert the_container(workload)[probe]["timeoutSeconds"] >= 5, f"{name} {probe}"
        checked += 1
    assert checked == 4  # orchestrator, tools, tools-sandbox, scheduler


def test_every_deployment_has_a_disruption_budget(rendered: list[Doc]) -> None:
    budgets = of_kind(rendered, "PodDisruptionBudget")
    for name, deployment in of_kind(rendered, "Deployment").items():
        assert name in budgets, f"{name} has no PodDisruptionBudget"
        selector = budgets[name]["spec"]["selector"]["matchLabels"]
        assert selector == deployment["spec"]["selector"]["matchLabels"], name
        # One at a time, never all: a drain can always proceed, and never empties a service.
        assert budgets[name]["spec"] == {
            "maxUnavailable": 1,
            "selector": budgets[name]["spec"]["selector"],
        }


def _environment(workload: Doc, config: dict[str, str]) -> dict[str, str]:
    """The variables a workload's container gets: the ConfigMap, then its own env."""
    container = the_container(workload)
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert source["configMapRef"]["name"].startswith("signalbox-settings")
        env.update(config)
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        ref = item["valueFrom"]["secretKeyRef"]
        assert ref["name"] == SECRET_NAME, item["name"]
        env[item["name"]] = SECRET_STAND_INS[ref["key"]]
    return env


def test_each_workload_environment_loads_its_settings(
    rendered: list[Doc], monkeypatch: pytest.MonkeyPatch
) -> None:
    known = _known_settings()
    config = settings_map(rendered)
    for name, workload in workloads(rendered).items():
        env = _environment(workload, config)
        for variable in env:
            assert variable in known, f"{name}: {variable} is no field of shared/settings.py"
        with monkeypatch.context() as m:
            for variable in [v for v in os.environ if v.startswith(("SIGNALBOX_", "ANTHROPIC_"))]:
                m.delenv(variable)
            for variable, value in env.items():
                m.setenv(variable, value)
            settings = load(SETTINGS_OF[name])
        assert isinstance(settings, CommonSettings)
        assert settings.database_url.startswith("postgresql://"), name
        assert settings.redis_url == config["SIGNALBOX_REDIS_URL"], name


def test_secrets_come_from_the_secret_and_are_never_written(rendered: list[Doc]) -> None:
    assert not of_kind(rendered, "Secret"), "secret values do not belong in the repo"
    assert not SECRET_VARIABLES & set(settings_map(rendered)), "a secret in the ConfigMap"
    for name, workload in workloads(rendered).items():
        for item in the_container(workload).get("env", []):
            if item["name"] in SECRET_VARIABLES:
                assert item["valueFrom"]["secretKeyRef"]["name"] == SECRET_NAME, (name, item)
    # Only those who need it get the internal token (docs/operations.md, "Configuration").
    holders = {
        name
        for name, workload in workloads(rendered).items()
        if any(
            e["name"] == "SIGNALBOX_INTERNAL_TOKEN" for e in the_container(workload).get("env", [])
        )
    }
    assert holders == {"gateway", "proposals", "tools", "tools-sandbox"}


def test_only_the_gateway_is_reachable_from_anywhere(base: list[Doc]) -> None:
    policies = of_kind(base, "NetworkPolicy")
    deny = policies["signalbox-default-deny-ingress"]["spec"]
    assert deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    assert deny["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "signalbox"}
    open_to_all = [
        policy["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component")
        for policy in policies.values()
        for rule in policy["spec"].get("ingress", [])
        if "from" not in rule
    ]
    assert open_to_all == ["gateway"]
    sources = {
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for rule in policies["proposals-ingress"]["spec"]["ingress"]
        for peer in rule["from"]
    }
    assert sources == {"gateway", "tools", "tools-sandbox"}


def test_scaled_objects_have_the_shape_keda_reads(production: list[Doc]) -> None:
    scaled = of_kind(production, "ScaledObject")
    assert set(scaled) == {"orchestrator", "tools"}
    for name, obj in scaled.items():
        jsonschema.validate(obj, SCALED_OBJECT_SCHEMA)
        for trigger in obj["spec"]["triggers"]:
            assert trigger["type"] == "redis", name
            jsonschema.validate(trigger["metadata"], REDIS_TRIGGER_SCHEMA)
        behavior = obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        as_hpa = {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                "maxReplicas": obj["spec"]["maxReplicaCount"],
                "behavior": behavior,
            },
        }
        _validate_core(as_hpa)
        assert 0 < obj["spec"]["minReplicaCount"] <= obj["spec"]["maxReplicaCount"], name
    broken = copy.deepcopy(scaled["tools"])
    broken["spec"]["triggers"][0]["metadata"]["databaseIndex"] = 0  # not a string
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCALED_OBJECT_SCHEMA)


def test_scaled_objects_watch_the_queue_their_workers_consume(production: list[Doc]) -> None:
    config = settings_map(production)
    redis_url = urlsplit(config["SIGNALBOX_REDIS_URL"])
    deployments = of_kind(production, "Deployment")
    for name, obj in of_kind(production, "ScaledObject").items():
        target = deployments[obj["spec"]["scaleTargetRef"]["name"]]
        # KEDA owns the count: a replicas field would be reset at every apply.
        assert "replicas" not in target["spec"], f"{name}: replicas set beside a ScaledObject"
        command = k8s_invocation(the_container(target))
        queues = command[command.index("-Q") + 1].split(",")
        (metadata,) = [t["metadata"] for t in obj["spec"]["triggers"]]
        assert [metadata["listName"]] == [config["SIGNALBOX_REDIS_PREFIX"] + q for q in queues]
        assert metadata["address"] == f"{redis_url.hostname}:{redis_url.port}", name
        assert metadata["databaseIndex"] == (redis_url.path.lstrip("/") or "0"), name


def test_celery_pushes_each_task_to_the_list_keda_watches(
    redis_url: str, redis_prefix: str
) -> None:
    """``<SIGNALBOX_REDIS_PREFIX><queue>`` is the Redis list a waiting task sits in."""
    prefix = f"{redis_prefix}k8s-queue:"
    app = make_celery("k8s-queue-test", CommonSettings(redis_url=redis_url, redis_prefix=prefix))
    client = redis.Redis.from_url(redis_url)
    try:
        for task, queue in ((RUN_TOOL_TASK, TOOLS_QUEUE), (RUN_TURN_TASK, ORCHESTRATOR_QUEUE)):
            assert client.llen(prefix + queue) == 0
            app.send_task(task, args=["no-such-id"])
            assert client.llen(prefix + queue) == 1, f"{task} is not in {prefix + queue}"
    finally:
        keys = list(client.scan_iter(match=prefix + "*"))
        if keys:
            client.delete(*keys)
        client.close()
        app.close()


def test_production_pins_the_image_and_its_namespace(production: list[Doc]) -> None:
    for name, workload in workloads(production).items():
        image = the_container(workload)["image"]
        assert not image.endswith(":latest") and ":" in image, f"{name}: {image}"
    namespaced = [d for d in production if d["kind"] != "Namespace"]
    assert {d["metadata"].get("namespace") for d in namespaced} == {"signalbox"}
