"""The chart on a real Kubernetes API server (label `real`): renders charts/longhaul with default
values and with values-all.yaml, applies every object to a real kube-apiserver started by
`longhaul-envtest` (tests/envtest), then runs the real `longhaul-operator` AS THE CHART'S
ServiceAccount (a token minted through the TokenRequest API) with the chart's RBAC and leader
election on, through a whole job life: create -> pods, Service and logdir claim -> a preemption
-> Group restart -> the chief succeeds -> cleanPodPolicy -> the job is deleted and the garbage
collector removes what it owned. Any 403 in the operator's log fails the test, and a
SelfSubjectAccessReview as the ServiceAccount shows it cannot read Secrets.

There is no kubelet: the test plays kubelet by patching the pods' status subresource, as a kubelet
would (Running/Ready, a preemption's DisruptionTarget condition, exit codes). The Prometheus
Operator's CRDs (prometheus-operator-crds/, written from the upstream schemas) are installed
before the chart, as in a cluster that runs the Prometheus Operator, so the PodMonitor,
ServiceMonitor and PrometheusRule are judged by their real schemas; every object is applied with
fieldValidation=Strict, so an unknown or misspelled field is refused instead of pruned.

Run: tests/chart/run_chart_test.sh chart_real_test.py  with LONGHAUL_ENVTEST and LONGHAUL_OPERATOR
set to the built binaries (ctest does it: chart_real_test).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

import helm_python as helm

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support" / "python"))
import kube_client  # noqa: E402  (needs the sys.path entry above)
from kube_client import Api, ApiError  # noqa: E402

CHART = REPO / "charts" / "longhaul"
VALUES_ALL = pathlib.Path(__file__).with_name("values-all.yaml")
PROMETHEUS_OPERATOR_CRDS = pathlib.Path(__file__).with_name("prometheus-operator-crds")
ENVTEST = os.environ.get("LONGHAUL_ENVTEST", "")
OPERATOR = os.environ.get("LONGHAUL_OPERATOR", "")
# Generous: a loaded 2-core machine runs etcd, an API server, a controller manager and the operator.
DEADLINE = 90.0


T0 = time.monotonic()


def eventually(what: str, pred, timeout: float = DEADLINE):
    """Polls pred() until it returns a truthy value (returned) or the deadline passes (fails)."""
    if os.environ.get("LONGHAUL_TRACE"):
        print(f"{time.monotonic() - T0:7.2f}s waiting for {what}", flush=True)
    return kube_client.eventually(what, pred, timeout, 0.1, pytest.fail)


# ------------------------------------------------------------------------------ control plane


@pytest.fixture(scope="module")
def plane():
    if not ENVTEST or not OPERATOR:
        pytest.skip("LONGHAUL_ENVTEST and LONGHAUL_OPERATOR name the built binaries (ctest sets them)")
    # Logs of the last run stay for a look after a failure; each run starts afresh.
    workdir = pathlib.Path(os.environ.get("LONGHAUL_BINARY_DIR") or tempfile.gettempdir()) / \
        "chart_real_test"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    info_file = workdir / "plane.json"
    # Every CRD is installed before the controller manager starts: its garbage collector then
    # watches their kinds from the start (a CRD added later pauses it for a rediscovery, ~30 s).
    monitoring_crds = workdir / "prometheus-operator-crds.yaml"
    monitoring_crds.write_text(yaml.safe_dump_all(prometheus_operator_crds()))
    log = open(workdir / "envtest.log", "wb")
    proc = subprocess.Popen([ENVTEST, "--info-file", str(info_file), "--crd", str(monitoring_crds)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 240
        while not info_file.exists():
            code = proc.poll()
            if code is not None:
                text = (workdir / "envtest.log").read_text()
                if code == 2:  # the binaries are missing: say how to provide them
                    pytest.skip(text.strip())
                pytest.fail(f"longhaul-envtest exited {code}:\n{text}")
            if time.monotonic() > end:
                pytest.fail("longhaul-envtest was not ready after 240 s:\n" +
                            (workdir / "envtest.log").read_text())
            time.sleep(0.1)
        info = json.loads(info_file.read_text())
        pki = pathlib.Path(info["workDir"]) / "pki"
        admin = Api(info["server"], info["caFile"],
                    cert=(str(pki / "admin.crt"), str(pki / "admin.key")))
        yield {"admin": admin, "info": info, "workdir": workdir}
    finally:
        kube_client.stop_process(proc)
        log.close()


def ensure_namespace(admin: Api, ns: str):
    status, answer = admin.request("POST", "/api/v1/namespaces",
                                   {"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": ns}})
    assert status in (201, 409), answer
    eventually(f"the default ServiceAccount of namespace {ns}",
               lambda: admin.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"))


def prometheus_operator_crds() -> list[dict]:
    """The Prometheus Operator's CRDs (PodMonitor, ServiceMonitor, PrometheusRule), as a cluster
    with the Prometheus Operator has them; not the chart's to install."""
    # Through JSON: the files' YAML anchors become copies (no aliases in what envtest reads).
    return [json.loads(json.dumps(yaml.safe_load(p.read_text())))
            for p in sorted(PROMETHEUS_OPERATOR_CRDS.glob("*.yaml"))]


def install_crds(admin: Api, crds: list[dict]):
    for crd in crds:
        admin.apply(crd, "")
        name = crd["metadata"]["name"]

        def established():
            got = admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = {c["type"]: c["status"]
                     for c in (got.get("status") or {}).get("conditions") or []}
            return conds.get("Established") == "True"

        eventually(f"CRD {name} Established", established)
    admin._discovery.clear()


# ----------------------------------------------------------------------------- the chart


def render(values: dict | None, release: str, namespace: str) -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values=values, name=release, namespace=namespace,
                                 is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".yaml"):
            objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def chart_crds() -> list[dict]:
    return [doc for f in sorted((CHART / "crds").glob("*.yaml"))
            for doc in yaml.safe_load_all(f.read_text()) if doc]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


class Operator:
    """The real longhaul-operator, run with the rendered Deployment's args and env, as the chart's
    ServiceAccount through a kubeconfig holding a minted token."""

    def __init__(self, deployment: dict, kubeconfig: pathlib.Path, log: pathlib.Path,
                 pod_name: str):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env = {"POD_NAME": pod_name, "POD_NAMESPACE": deployment["metadata"]["namespace"]}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
        self.health_port, metrics_port = free_port(), free_port()
        args = []
        for a in container["args"]:
            a = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)
            if a.startswith("--health-port="):
                a = f"--health-port={self.health_port}"
            elif a.startswith("--metrics-port="):
                a = f"--metrics-port={metrics_port}"
            args.append(a)
        self.args = args
        self.log_path = log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen([OPERATOR, f"--kubeconfig={kubeconfig}",
                                      "--bind-address=127.0.0.1", *args],
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **env})
        eventually("the operator's /readyz", lambda: self.ready() or self.exited(), 120)
        assert self.proc.poll() is None, f"the operator exited {self.proc.returncode}:\n{self.log()}"

    def ready(self) -> bool:
        return http_status(self.health_port, "/readyz") == 200

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self):
        kube_client.stop_process(self.proc)
        self._log.close()


# ----------------------------------------------------------------------- playing the kubelet


def pods_of(admin: Api, ns: str, job: str) -> list[dict]:
    sel = urllib.parse.quote(f"longhaul.dev/job-name={job}")
    return admin.call("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={sel}")["items"]


def patch_pod_status(admin: Api, pod: dict, status: dict):
    md = pod["metadata"]
    admin.call("PATCH", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/status",
               {"status": status}, "application/merge-patch+json")


def run_pods(admin: Api, ns: str, job: str):
    """What a kubelet reports once the containers started: Running, Ready."""
    for pod in pods_of(admin, ns, job):
        if pod["metadata"].get("deletionTimestamp") or pod["status"].get("phase") != "Pending":
            continue
        containers = pod["spec"]["containers"]
        patch_pod_status(admin, pod, {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"},
                           {"type": "ContainersReady", "status": "True"}],
            "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "",
                                   "ready": True, "restartCount": 0,
                                   "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
                                  for c in containers]})


def terminate_pod(admin: Api, pod: dict, exit_code: int, preempted: bool = False):
    status = {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "",
                               "ready": False, "restartCount": 0,
                               "state": {"terminated": {"exitCode": exit_code}}}
                              for c in pod["spec"]["containers"]]}
    if preempted:
        status["reason"] = "Preempted"
        status["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                     "reason": "PreemptionByScheduler"})
    patch_pod_status(admin, pod, status)


def job_status(admin: Api, ns: str, job: str) -> dict:
    got = admin.get(f"/apis/longhaul.dev/v1alpha1/namespaces/{ns}/trainingjobs/{job}")
    return (got or {}).get("status", {})


def running_pods(admin: Api, ns: str, job: str, attempt: str | None = None) -> list[dict]:
    pods = [p for p in pods_of(admin, ns, job) if not p["metadata"].get("deletionTimestamp")]
    if attempt is not None:
        pods = [p for p in pods
                if p["metadata"].get("annotations", {}).get("longhaul.dev/restart-attempt")
                == attempt]
    return pods


def job_life(admin: Api, ns: str, job: str = "life"):
    """create -> children -> running -> preemption -> the lost pod replaced -> success -> cleanup."""
    template = {"spec": {"terminationGracePeriodSeconds": 5,
                         "containers": [{"name": "trainer", "image": "registry.example.com/w:1"}]}}
    admin.call("POST", f"/apis/longhaul.dev/v1alpha1/namespaces/{ns}/trainingjobs", {
        "apiVersion": "longhaul.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": job},
        "spec": {"replicaSpecs": {"Chief": {"replicas": 1, "template": template},
                                  "Worker": {"replicas": 2, "template": template}},
                 "runPolicy": {"backoff": {"initialSeconds": 0, "maxSeconds": 0}}}})

    # The children: three pods, the headless Service, the logdir claim.
    eventually("three pods", lambda: len(running_pods(admin, ns, job)) == 3)
    eventually("the headless Service", lambda: admin.get(f"/api/v1/namespaces/{ns}/services/{job}"))
    claim = eventually("the logdir claim",
                       lambda: admin.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/"
                                         f"{job}-logdir"))
    # No provisioner here: the claim stays Pending, and the job must not wait for it.
    assert claim.get("status", {}).get("phase", "Pending") == "Pending"
    first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in running_pods(admin, ns, job)}
    assert sorted(first) == [f"{job}-chief-0", f"{job}-worker-0", f"{job}-worker-1"]
    for p in running_pods(admin, ns, job):
        assert p["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"

    run_pods(admin, ns, job)
    eventually("phase Running", lambda: job_status(admin, ns, job).get("phase") == "Running")

    # A preemption: DisruptionTarget, exit 143. The default restartScope Replica re-creates only
    # the preempted pod (the survivors keep their processes), without spending the failure budget.
    victim = next(p for p in pods_of(admin, ns, job) if p["metadata"]["name"] == f"{job}-worker-1")
    terminate_pod(admin, victim, 143, preempted=True)
    eventually("the preempted pod re-created alone",
               lambda: len(running_pods(admin, ns, job, attempt="1")) == 1
               and len(running_pods(admin, ns, job)) == 3)
    second = {p["metadata"]["name"]: p["metadata"]["uid"] for p in running_pods(admin, ns, job)}
    assert set(second) == set(first)
    assert second[f"{job}-worker-1"] != first[f"{job}-worker-1"], "the lost pod was not re-created"
    for name in (f"{job}-chief-0", f"{job}-worker-0"):
        assert second[name] == first[name], f"{name} was re-created, though it was not lost"
    run_pods(admin, ns, job)
    eventually("the job recovered",
               lambda: job_status(admin, ns, job).get("recoveries") == 1
               and job_status(admin, ns, job).get("phase") == "Running")
    status = job_status(admin, ns, job)
    assert status.get("preemptionCount") == 1, status
    assert status.get("failureCount", 0) == 0, status

    # The chief succeeds: the job Succeeded, and cleanPodPolicy Running removes the workers.
    chief = next(p for p in running_pods(admin, ns, job) if p["metadata"]["name"].endswith("chief-0"))
    terminate_pod(admin, chief, 0)
    eventually("phase Succeeded", lambda: job_status(admin, ns, job).get("phase") == "Succeeded")
    eventually("the workers deleted by cleanPodPolicy Running",
               lambda: not [p for p in running_pods(admin, ns, job) if "worker" in
                            p["metadata"]["name"]])

    # Deleting the job: the garbage collector removes what it owned; the claim is kept (Retain).
    # The first time on a fresh control plane this waits for the collector's periodic
    # rediscovery (30 s) before it watches TrainingJobs.
    admin.call("DELETE", f"/apis/longhaul.dev/v1alpha1/namespaces/{ns}/trainingjobs/{job}")
    eventually("the Service and pods collected with the job",
               lambda: admin.get(f"/api/v1/namespaces/{ns}/services/{job}") is None
               and not pods_of(admin, ns, job))
    assert admin.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{job}-logdir"), \
        "reclaimPolicy Retain must keep the logdir claim"


def access(api: Api, ns: str, verb: str, resource: str, group: str = "") -> bool:
    review = api.call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": ns, "verb": verb, "resource": resource,
                                        "group": group}}})
    return review["status"]["allowed"]


CASES = {
    # case: (values, release, release namespace, namespace of the job)
    "defaults": (None, "longhaul", "longhaul-system", "ml-jobs"),
    "values-all": (yaml.safe_load(VALUES_ALL.read_text()) if VALUES_ALL.exists() else {},
                   "longhaul", "longhaul-all", "team-a"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_chart_applies_and_the_operator_runs_a_job_as_its_service_account(plane, case):
    admin: Api = plane["admin"]
    values, release, release_ns, job_ns = CASES[case]
    objects = render(values, release, release_ns)

    # Every namespace the release touches exists, as an administrator would create it.
    namespaces = {release_ns, job_ns}
    for obj in objects:
        namespaces.add(obj["metadata"].get("namespace", release_ns))
    for ns in sorted(namespaces):
        ensure_namespace(admin, ns)
    install_crds(admin, chart_crds() + prometheus_operator_crds())

    # Every rendered object is accepted by the real API server (not only schema-valid).
    refused = []
    for obj in objects:
        try:
            admin.apply(json.loads(json.dumps(obj)), release_ns)
        except (ApiError, LookupError) as e:
            refused.append(f"{obj['kind']} {obj['metadata'].get('name')}: {e}")
    assert not refused, "the API server refused:\n" + "\n".join(refused)

    deployment = next(o for o in objects if o["kind"] == "Deployment")
    sa_name = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    token = admin.call("POST", f"/api/v1/namespaces/{release_ns}/serviceaccounts/{sa_name}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}})["status"]["token"]
    info = plane["info"]
    kubeconfig = plane["workdir"] / f"{case}.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "envtest", "cluster": {"server": info["server"],
                                                     "certificate-authority": info["caFile"]}}],
        "users": [{"name": sa_name, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "envtest", "user": sa_name,
                                                "namespace": release_ns}}]}))
    as_operator = Api(info["server"], info["caFile"], token=token)

    # Least privilege, as the ServiceAccount itself sees it.
    assert access(as_operator, job_ns, "create", "pods")
    assert access(as_operator, job_ns, "update", "trainingjobs/status", "longhaul.dev")
    for verb in ("get", "list", "watch"):
        assert not access(as_operator, job_ns, verb, "secrets"), f"the operator can {verb} Secrets"
        assert not access(as_operator, release_ns, verb, "secrets"), \
            f"the operator can {verb} Secrets in its own namespace"
    if values and values.get("operator", {}).get("watchNamespaces"):
        assert not access(as_operator, "default", "list", "pods"), \
            "with watchNamespaces the operator must have nothing outside them"

    operator = Operator(deployment, kubeconfig, plane["workdir"] / f"{case}-operator.log",
                        pod_name=f"{release}-operator-0")
    try:
        assert "--leader-elect" in operator.args
        lease_name = next(a.split("=", 1)[1] for a in operator.args
                          if a.startswith("--lease-name="))
        lease = eventually("the operator's Lease", lambda: admin.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{release_ns}/leases/{lease_name}"))
        assert lease["spec"]["holderIdentity"] == f"{release}-operator-0"
        job_life(admin, job_ns)
    finally:
        operator.stop()
    log = operator.log()
    forbidden = [line for line in log.splitlines()
                 if re.search(r"HTTP 403|[Ff]orbidden|code=\"?403", line)]
    assert not forbidden, "the operator was refused by RBAC:\n" + "\n".join(forbidden[:20])
    assert operator.proc.returncode == 0, f"the operator exited {operator.proc.returncode}:\n{log[-3000:]}"


def test_the_prometheus_operator_crds_refuse_a_broken_rule_and_unknown_fields(plane):
    """The CRDs the chart is judged by are not permissive: the real API server refuses a
    PrometheusRule whose `for` is not a Prometheus duration, a PodMonitor without its required
    selector, and (fieldValidation=Strict) a ServiceMonitor field the schema does not have."""
    admin: Api = plane["admin"]
    ensure_namespace(admin, "crd-check")
    install_crds(admin, prometheus_operator_crds())
    objects = render({"prometheusRule": {"enabled": True},
                      "metrics": {"podMonitor": {"enabled": True},
                                  "serviceMonitor": {"enabled": True}}},
                     "broken", "crd-check")
    monitoring = {o["kind"]: o for o in objects if o["apiVersion"] == "monitoring.coreos.com/v1"}
    assert sorted(monitoring) == ["PodMonitor", "PrometheusRule", "ServiceMonitor"]
    rule = json.loads(json.dumps(monitoring["PrometheusRule"]))
    rule["spec"]["groups"][1]["rules"][0]["for"] = "5 minutes"
    pod_monitor = json.loads(json.dumps(monitoring["PodMonitor"]))
    del pod_monitor["spec"]["selector"]
    service_monitor = json.loads(json.dumps(monitoring["ServiceMonitor"]))
    service_monitor["spec"]["endpoints"][0]["portName"] = "metrics"
    for broken, why in ((rule, "spec.groups[1].rules[0].for"),
                        (pod_monitor, "spec.selector"),
                        (service_monitor, "portName")):
        with pytest.raises(ApiError) as refused:
            admin.apply(broken, "crd-check")
        assert refused.value.status in (400, 422), refused.value
        assert why in refused.value.body, refused.value.body
    for good in monitoring.values():  # and the chart's own objects are accepted
        admin.apply(json.loads(json.dumps(good)), "crd-check")
