"""Renders and lints charts/longhaul with Helm's own engine (Helm's Go SDK through the
helm-python-sdk wheel, offline) and checks what a cluster would receive: the kinds and names,
labels against selectors, least-privilege RBAC, the security context, the operator's flags, the
Grafana dashboards, the CRD copy, and every object against the Kubernetes OpenAPI schemas
(kubernetes-validate, offline) or, for the Prometheus Operator's kinds, against their CRDs in
prometheus-operator-crds/. The PrometheusRule's rules pass `promtool check rules` and the unit
tests of prometheus-rules-test.yaml (`promtool test rules`), use only exported or recorded series,
take their thresholds from the values, and every alert has a runbook and a dashboard panel. Also
checks the TrainingJob examples against the CRD schema.

Run: <venv>/bin/python -m pytest tests/chart -q   (tests/chart/run_chart_test.sh does it for ctest)
"""

from __future__ import annotations

import filecmp
import json
import pathlib

import pytest
import yaml

import dashboard_queries as dq
import render_rules

# Imported here, not skipped on failure: a venv without them must fail loudly.
import helm_python as helm
import jsonschema
import kubernetes_validate

REPO = dq.REPO
CHART = REPO / "charts" / "longhaul"
VALUES_ALL = pathlib.Path(__file__).with_name("values-all.yaml")
PROMETHEUS_OPERATOR_CRDS = pathlib.Path(__file__).with_name("prometheus-operator-crds")
RULES_TEST = pathlib.Path(__file__).with_name("prometheus-rules-test.yaml")
ALERTS = ["LonghaulTrainingStalled", "LonghaulCheckpointOverdue", "LonghaulSkippedSteps",
          "LonghaulJobRestartLoop", "LonghaulFailureBudgetLow", "LonghaulFailureBudgetExhausted",
          "LonghaulOperatorDown", "LonghaulReconcileErrors", "LonghaulTargetDown"]
RELEASE = "longhaul"
NAMESPACE = "longhaul-system"
KUBE_VERSION = "1.30.0"

JOB_RULES = {
    # delete: ttlSecondsAfterFinished removes the finished job (operator/controller/reconciler.cc).
    # Exactly the calls operator/controller makes: status through update_status, no spec writes.
    ("longhaul.dev", "trainingjobs"): {"get", "list", "watch", "delete"},
    ("longhaul.dev", "trainingjobs/status"): {"update"},
    ("longhaul.dev", "trainingjobs/finalizers"): {"update"},
    # patch: the counted-restarts annotation (container restarts already counted as failures).
    ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},
    ("", "services"): {"get", "list", "watch", "create"},
    ("", "persistentvolumeclaims"): {"get", "list", "watch", "create"},
    ("", "events"): {"create", "patch"},
}
LEASE_RULES = {("coordination.k8s.io", "leases"): {"get", "create", "update"}}


def render(values: dict | None, name: str = RELEASE) -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values=values, name=name, namespace=NAMESPACE, is_install=True)
    objects = []
    for path, text in manifests.items():
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["__template"] = path
                objects.append(doc)
    return objects


def values_all() -> dict:
    return yaml.safe_load(VALUES_ALL.read_text())


@pytest.fixture(scope="module", params=["defaults", "values-all"])
def case(request):
    values = None if request.param == "defaults" else values_all()
    merged = helm.Chart.load(CHART).merge_values(values)
    return request.param, merged, render(values)


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str) -> dict:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# ---------------------------------------------------------------- Helm lint and values schema


@pytest.mark.parametrize("values_file", [None, VALUES_ALL])
def test_helm_lint_strict_has_no_errors_or_warnings(values_file):
    values = yaml.safe_load(values_file.read_text()) if values_file else None
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE,
                       kube_version="v" + KUBE_VERSION)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert report["total_charts_linted"] == 1
    assert not problems, json.dumps(report, indent=2)


@pytest.mark.parametrize("bad", [
    {"replicaCount": "two"},
    {"operator": {"watchNamespaces": ["Not_A_Namespace"]}},
    {"operator": {"metricsPort": 70000}},
    {"image": {"pullPolicy": "Sometimes"}},
    {"metrics": {"serviceMonitor": {"interval": "soon"}}},
    {"prometheusRule": {"trainingStalled": {"for": "5 minutes"}}},
    {"prometheusRule": {"disabledAlerts": ["LonghaulNoSuchAlert"]}},
    {"prometheusRule": {"reconcileErrors": {"ratio": 2}}},
    {"prometheusRule": {"skippedSteps": {"window": "0"}}},
    {"prometheusRule": {"failureBudgetLow": {"ratio": 0}}},
    {"prometheusRule": {"failureBudgetLow": {"ratio": 1.5}}},
    {"prometheusRule": {"targetDown": {"severity": "page"}}},
    {"unknownTopLevelKey": True},
])
def test_values_schema_rejects_bad_values(bad):
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmError):
            chart.render(values=bad, name=RELEASE, namespace=NAMESPACE)


# Every duration that lands in a Prometheus Operator object, with a value its CRDs refuse (units
# out of order, repeated, fractional, spaced) although Prometheus-style "([0-9]+(ms|s|m|h))+"
# accepted the first two.
PROMETHEUS_OPERATOR_DURATIONS = [
    ("metrics", "serviceMonitor", "interval"), ("metrics", "serviceMonitor", "scrapeTimeout"),
    ("metrics", "podMonitor", "interval"), ("metrics", "podMonitor", "scrapeTimeout"),
    ("prometheusRule", "interval"), ("prometheusRule", "trainingStalled", "for"),
    ("prometheusRule", "checkpointOverdue", "for"), ("prometheusRule", "operatorDown", "for"),
    ("prometheusRule", "reconcileErrors", "for"), ("prometheusRule", "targetDown", "for")]
PROMETHEUS_OPERATOR_DURATION = ("^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                "(([0-9]+)s)?(([0-9]+)ms)?)$")


def _nested(path: tuple[str, ...], value) -> dict:
    out = value
    for key in reversed(path):
        out = {key: out}
    return out


@pytest.mark.parametrize("path", PROMETHEUS_OPERATOR_DURATIONS, ids=".".join)
@pytest.mark.parametrize("bad", ["30s1m", "1m1m", "1.5m", "5 m"])
def test_durations_the_prometheus_operator_refuses_are_refused_naming_the_value(path, bad):
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmError) as refused:
            chart.render(values=_nested(path, bad), name=RELEASE, namespace=NAMESPACE)
    message = str(refused.value)
    assert "/" + "/".join(path) in message and repr(bad) in message, message
    assert PROMETHEUS_OPERATOR_DURATION in message, message


@pytest.mark.parametrize("path", PROMETHEUS_OPERATOR_DURATIONS, ids=".".join)
def test_durations_use_the_prometheus_operators_pattern_and_defaults_pass(path):
    """The schema's pattern is the one in the Prometheus Operator's CRDs (tests/chart/
    prometheus-operator-crds); the defaults and what the CRDs accept render."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    node = schema
    for key in path:
        node = node["properties"][key]
    assert node["pattern"] == PROMETHEUS_OPERATOR_DURATION
    crds = "".join(p.read_text() for p in PROMETHEUS_OPERATOR_CRDS.glob("*.yaml"))
    assert PROMETHEUS_OPERATOR_DURATION in crds
    defaults = helm.Chart.load(CHART).merge_values(None)
    for key in path:
        defaults = defaults[key]
    for good in [defaults, "1m30s", "2h"] if defaults else ["1m30s", "2h"]:
        render(_nested(path, good))


def test_every_value_is_commented():
    """Every key of values.yaml has a comment right above it, except section headers (maps whose
    children carry the comments). A commented map (e.g. securityContext) documents its body."""
    lines = [l for l in (CHART / "values.yaml").read_text().splitlines() if l.strip()]
    keys = []  # (indent, key, commented) of every "key:" line outside a list
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#") or stripped.startswith("-"):
            continue
        keys.append((len(line) - len(line.lstrip()), stripped.split(":", 1)[0],
                     i > 0 and lines[i - 1].strip().startswith("#")))
    undocumented = []
    covered_below = None  # indent under which a commented map's body needs no comments
    for j, (indent, key, commented) in enumerate(keys):
        if covered_below is not None and indent > covered_below:
            continue
        covered_below = None
        has_children = j + 1 < len(keys) and keys[j + 1][0] > indent
        if commented and has_children:
            covered_below = indent
        elif not commented and not has_children:
            undocumented.append(key)
    assert not undocumented, f"values.yaml keys without a comment: {undocumented}"


def test_values_keys_are_camel_case():
    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                yield path + [k]
                if path[-1:] not in (["podAnnotations"], ["podLabels"], ["nodeSelector"]):
                    yield from walk(v, path + [k])

    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    bad = [".".join(p) for p in walk(defaults, []) if "_" in p[-1] or "-" in p[-1]
           or p[-1][:1].isupper() and p[-1] != "ALL"]
    assert not bad, bad


# ---------------------------------------------------------------- objects, names, selectors


def test_rendered_kinds_and_names(case):
    name, values, objects = case
    full = f"{RELEASE}-lh" if name == "values-all" else RELEASE
    kinds = sorted((o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
                   for o in objects)
    if name == "defaults":
        expected = [
            ("ClusterRole", "", full),
            ("ClusterRoleBinding", "", full),
            ("ConfigMap", NAMESPACE, f"{full}-dashboards"),
            ("Deployment", NAMESPACE, full),
            ("Role", NAMESPACE, f"{full}-leader-election"),
            ("RoleBinding", NAMESPACE, f"{full}-leader-election"),
            ("Service", NAMESPACE, f"{full}-metrics"),
            ("ServiceAccount", NAMESPACE, full),
        ]
    else:
        expected = [
            ("ConfigMap", "monitoring", f"{full}-dashboards"),
            ("Deployment", NAMESPACE, full),
            ("PodMonitor", NAMESPACE, f"{full}-workers"),
            ("PrometheusRule", NAMESPACE, full),
            ("Role", NAMESPACE, f"{full}-leader-election"),
            ("Role", "team-a", full),
            ("Role", "team-b", full),
            ("RoleBinding", NAMESPACE, f"{full}-leader-election"),
            ("RoleBinding", "team-a", full),
            ("RoleBinding", "team-b", full),
            ("Service", NAMESPACE, f"{full}-metrics"),
            ("ServiceAccount", NAMESPACE, "longhaul-operator"),
            ("ServiceMonitor", NAMESPACE, f"{full}-operator"),
        ]
    assert kinds == sorted(expected)


def test_every_object_carries_the_standard_labels(case):
    _, values, objects = case
    for o in objects:
        labels = o["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/instance") == RELEASE, o["metadata"]["name"]
        assert labels.get("app.kubernetes.io/managed-by") == "Helm"
        assert labels.get("app.kubernetes.io/version") == "0.1.0"
        assert labels.get("helm.sh/chart") == "longhaul-0.1.0"
        assert labels.get("app.kubernetes.io/name") == (values["nameOverride"] or "longhaul")


def test_selectors_match_their_targets(case):
    _, values, objects = case
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selects(selector, pod_labels)
    assert "app.kubernetes.io/version" not in selector and "helm.sh/chart" not in selector, \
        "selectors must not contain labels that change on upgrade"
    ports = {p["name"]: p["containerPort"]
             for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert ports == {"metrics": values["operator"]["metricsPort"],
                     "health": values["operator"]["healthPort"]}

    service = one(objects, "Service")
    assert selects(service["spec"]["selector"], pod_labels)
    assert service["spec"]["ports"] == [{"name": "metrics", "port": values["metrics"]["service"]["port"],
                                         "targetPort": "metrics", "protocol": "TCP"}]
    for monitor in by_kind(objects, "ServiceMonitor"):
        assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for monitor in by_kind(objects, "PodMonitor"):
        assert monitor["spec"]["selector"] == {
            "matchExpressions": [{"key": "longhaul.dev/job-name", "operator": "Exists"}]}
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
        endpoint, = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
        targets = {r["targetLabel"] for r in endpoint["relabelings"]}
        assert targets == {"trainingjob", "replica_type"}


def test_deployment_runs_the_operator_with_the_configured_flags(case):
    name, values, objects = case
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    container, = spec["containers"]
    op = values["operator"]
    assert deployment["spec"]["replicas"] == values["replicaCount"]
    assert container["image"] == (
        "ghcr.io/longhaul-dev/longhaul-operator:0.1.0" if name == "defaults"
        else "registry.example.com/ml/longhaul-operator:0.1.0-rc1")
    expected = [f"--namespace={ns}" for ns in op["watchNamespaces"]]
    if op["leaderElection"]["enabled"]:
        lease = op["leaderElection"]["leaseName"] or f"{RELEASE}-leader"
        expected += ["--leader-elect", f"--lease-name={lease}", f"--lease-namespace={NAMESPACE}",
                     "--identity=$(POD_NAME)"]
    else:
        expected.append("--no-leader-elect")
    expected += [f"--metrics-port={op['metricsPort']}", f"--health-port={op['healthPort']}",
                 f"--workers={op['workers']}", f"--qps={op['qps']}", f"--burst={op['burst']}",
                 f"--log-level={op['logLevel']}"]
    expected += op["extraArgs"]
    assert container["args"] == expected
    assert spec["serviceAccountName"] == (values["serviceAccount"]["name"] or RELEASE)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["resources"] == values["resources"]
    if name == "values-all":
        assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
        assert spec["priorityClassName"] == "system-cluster-critical"
        assert spec["tolerations"] == values["tolerations"]
        assert {"name": "TZ", "value": "UTC"} in container["env"]
        assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "ml-platform"


def test_leader_election_off_drops_the_lease_role_and_flags():
    objects = render({"operator": {"leaderElection": {"enabled": False}}})
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--no-leader-elect" in container["args"]
    assert "--leader-elect" not in container["args"]
    assert not [a for a in container["args"] if a.startswith(("--lease", "--identity"))]
    assert not [o for o in by_kind(objects, "Role") if "leases" in json.dumps(o)]


def test_several_replicas_without_leader_election_are_refused():
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmError, match="leaderElection"):
            chart.render(values={"replicaCount": 2,
                                 "operator": {"leaderElection": {"enabled": False}}},
                         name=RELEASE, namespace=NAMESPACE)


def test_security_context_is_locked_down(case):
    _, _, objects = case
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    container = spec["containers"][0]["securityContext"]
    assert container["runAsNonRoot"] is True
    assert container["readOnlyRootFilesystem"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert container["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in container and "hostNetwork" not in spec and "hostPID" not in spec


# ---------------------------------------------------------------- RBAC


def rules_of(role: dict) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (group, resource)
                assert key not in out, f"{key} granted twice in {role['metadata']['name']}"
                out[key] = set(rule["verbs"])
    return out


def test_rbac_is_exactly_least_privilege(case):
    name, values, objects = case
    roles = by_kind(objects, "ClusterRole") + by_kind(objects, "Role")
    for role in roles:
        text = json.dumps(role["rules"])
        assert "*" not in text, f"wildcard in {role['metadata']['name']}"
        assert "secrets" not in text and "configmaps" not in text and "nodes" not in text
    lease_roles = [r for r in roles if r["metadata"]["name"].endswith("-leader-election")]
    job_roles = [r for r in roles if r not in lease_roles]
    assert len(lease_roles) == 1
    assert lease_roles[0]["kind"] == "Role"
    assert lease_roles[0]["metadata"]["namespace"] == NAMESPACE
    assert rules_of(lease_roles[0]) == LEASE_RULES
    watched = values["operator"]["watchNamespaces"]
    if watched:
        assert {r["kind"] for r in job_roles} == {"Role"}
        assert sorted(r["metadata"]["namespace"] for r in job_roles) == sorted(watched)
    else:
        assert [r["kind"] for r in job_roles] == ["ClusterRole"]
    for role in job_roles:
        assert rules_of(role) == JOB_RULES


def test_bindings_grant_the_roles_to_the_operator_service_account(case):
    _, values, objects = case
    sa = one(objects, "ServiceAccount")
    roles = {(r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"])
             for r in by_kind(objects, "ClusterRole") + by_kind(objects, "Role")}
    bindings = by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding")
    assert len(bindings) == len(roles)
    for b in bindings:
        ref = b["roleRef"]
        ns = b["metadata"].get("namespace") if ref["kind"] == "Role" else None
        assert (ref["kind"], ns, ref["name"]) in roles
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                  "namespace": NAMESPACE}]


def test_rbac_create_false_renders_no_rbac():
    objects = render({"rbac": {"create": False}})
    assert not [o for o in objects if o["apiVersion"].startswith("rbac.authorization.k8s.io")]


def test_existing_service_account_requires_a_name():
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmError, match="serviceAccount.name"):
            chart.render(values={"serviceAccount": {"create": False}}, name=RELEASE,
                         namespace=NAMESPACE)
    objects = render({"serviceAccount": {"create": False, "name": "platform-sa"}})
    assert not by_kind(objects, "ServiceAccount")
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "platform-sa"


# ---------------------------------------------------------------- dashboards


def test_dashboards_configmap_holds_the_dashboard_files(case):
    name, values, objects = case
    cm = one(objects, "ConfigMap")
    dash = values["dashboards"]
    assert cm["metadata"]["labels"][dash["label"]] == dash["labelValue"]
    files = sorted(p.name for p in dq.DASHBOARD_DIR.glob("*.json"))
    assert sorted(cm["data"]) == files == ["longhaul-operator.json", "longhaul-worker.json"]
    for f in files:
        assert json.loads(cm["data"][f]) == json.loads((dq.DASHBOARD_DIR / f).read_text())
    if name == "values-all":
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Longhaul"}


def test_dashboards_disabled_renders_no_configmap():
    assert not by_kind(render({"dashboards": {"enabled": False}}), "ConfigMap")


@pytest.mark.parametrize("file", sorted(p.name for p in dq.DASHBOARD_DIR.glob("*.json")))
def test_dashboard_is_well_formed(file):
    dash = json.loads((dq.DASHBOARD_DIR / file).read_text())
    assert dash["uid"] == file.removesuffix(".json") and dash["title"].startswith("longhaul / ")
    assert 36 <= dash["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = set()
    for panel in dash["panels"]:
        assert panel["id"] not in ids
        ids.add(panel["id"])
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["w"] > 0 and g["h"] > 0
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["description"] and panel["targets"]
        for t in panel["targets"]:
            assert t["datasource"] == panel["datasource"]
            assert t["expr"].count("(") == t["expr"].count(")")
            names = dq.metric_names(t["expr"])
            for var in ("$namespace", "$trainingjob", "$rank", "$instance"):
                if var[1:] in variables and "longhaul_" in t["expr"]:
                    # Recorded series are per job (no rank left); rank="0" is a choice.
                    if var == "$rank" and (names <= dq.RECORDED_SERIES or 'rank="0"' in t["expr"]):
                        continue
                    assert var in t["expr"], f"{panel['title']} ignores {var}"


def recording_rules() -> dict[str, str]:
    """record -> expr of the chart's recording rules (default values)."""
    return {r["record"]: r["expr"] for g in render_rules.prometheus_rule()["spec"]["groups"]
            for r in g["rules"] if "record" in r}


def test_dashboards_query_only_the_project_metrics():
    queries = dq.queries(dq.load_dashboards())
    assert len(queries) > 25
    known = dq.ALL_SERIES | dq.RECORDED_SERIES | {"up"}
    unknown = {(q.dashboard, q.where, n) for q in queries for n in dq.metric_names(q.expr)
               if n not in known}
    assert not unknown, unknown
    used = set().union(*(dq.metric_names(q.expr) for q in queries))
    # A recorded series shows what its rule reads (thresholds read other records in turn).
    records, stack, used = recording_rules(), list(used), set()
    while stack:
        name = stack.pop()
        if name in records:
            stack.extend(dq.metric_names(records.pop(name)))
        elif name not in dq.RECORDED_SERIES:
            used.add(name)
    for histogram in dq.WORKER_HISTOGRAMS | dq.OPERATOR_HISTOGRAMS:
        assert histogram + "_bucket" in used, f"no panel shows {histogram}"
    base = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in used}
    every = (dq.WORKER_COUNTERS | dq.WORKER_GAUGES | dq.WORKER_HISTOGRAMS | dq.OPERATOR_COUNTERS
             | dq.OPERATOR_GAUGES | dq.OPERATOR_HISTOGRAMS)
    assert every - base == set(), f"metrics no dashboard shows: {every - base}"


def test_metric_name_extraction_sees_through_promql():
    expr = ('histogram_quantile(0.99, sum by (le, rank) (rate(longhaul_a_bucket{x=~"$x", '
            'y!="b c"}[$__rate_interval]))) / on(instance) group_left(version) '
            'longhaul_b or vector(0) and time() - longhaul_c offset 5m')
    assert dq.metric_names(expr) == {"longhaul_a_bucket", "longhaul_b", "longhaul_c"}
    assert dq.metric_names('label_values(longhaul_d{n=~"$n"}, rank)') == {"longhaul_d"}
    assert dq.metric_names("rate(up[5m]) * 1e3") == {"up"}


# ---------------------------------------------------------------- Kubernetes schemas, CRDs


def test_every_object_is_valid_against_the_kubernetes_openapi_schema(case):
    _, _, objects = case
    for o in objects:
        o = {k: v for k, v in o.items() if k != "__template"}
        if o["apiVersion"].startswith("monitoring.coreos.com/"):
            # The Prometheus Operator's kinds, against their CRDs' schemas (chart_real_test.py
            # has the real API server judge them too).
            schemas = prometheus_operator_schemas()
            assert o["kind"] in schemas, f"no CRD in {PROMETHEUS_OPERATOR_CRDS} for {o['kind']}"
            assert o["metadata"]["name"] and o["metadata"]["namespace"]
            jsonschema.validate(o, _to_json_schema(schemas[o["kind"]]))
            continue
        kubernetes_validate.validate(o, KUBE_VERSION, strict=True)


def prometheus_operator_schemas() -> dict[str, dict]:
    """kind -> openAPIV3Schema of the Prometheus Operator CRDs the tests install."""
    out = {}
    for path in sorted(PROMETHEUS_OPERATOR_CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        version, = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        # The API server's RE2 takes inline flags anywhere; Python's re only at the start.
        text = json.dumps(version["schema"]["openAPIV3Schema"]).replace("^(?i)", "(?i)^")
        out[crd["spec"]["names"]["kind"]] = json.loads(text)
    return out


def test_prometheus_operator_crds_are_valid_crds():
    kinds = set()
    for path in sorted(PROMETHEUS_OPERATOR_CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)
        assert crd["spec"]["group"] == "monitoring.coreos.com"
        assert path.name == f"monitoring.coreos.com_{crd['spec']['names']['plural']}.yaml"
        kinds.add(crd["spec"]["names"]["kind"])
    assert kinds == {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("kind, mutate", [
    ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0].update(interval="15 seconds")),
    ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0]["relabelings"][0].update(
        sourceLabels=["longhaul.dev/job-name"])),
    ("ServiceMonitor", lambda o: o["spec"]["endpoints"][0].update(portName="metrics")),
    ("ServiceMonitor", lambda o: o["spec"].pop("selector")),
    ("PrometheusRule", lambda o: o["spec"]["groups"][1]["rules"][0].update({"for": "5 minutes"})),
    ("PrometheusRule", lambda o: o["spec"]["groups"][0]["rules"][0].pop("expr")),
])
def test_the_crd_schemas_refuse_what_the_prometheus_operator_refuses(kind, mutate):
    """The offline check has teeth: the chart's object, broken the way a template slip would
    break it, fails its CRD's schema."""
    obj = one(render(values_all()), kind)
    obj = {k: v for k, v in obj.items() if k != "__template"}
    schema = _to_json_schema(prometheus_operator_schemas()[kind])
    jsonschema.validate(obj, schema)
    mutate(obj)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, schema)


def crd_files(directory: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.yaml"))}


def test_kube_version_admits_kubernetes_1_26_the_oldest_supported():
    # Regression: Chart.yaml said ">=1.27.0-0", so `helm install` refused the v1.26.4 cluster of
    # the real-node test (tests/node/user_path_test.py), though 1.26 is the oldest version the
    # project supports and tests (README, "Testing against a real API server").
    import re
    constraint = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)\.(\d+)(-0)?", constraint)
    assert match, f"kubeVersion {constraint!r}: expected a single lower bound like >=1.26.0-0"
    assert (int(match[1]), int(match[2])) <= (1, 26), \
        f"kubeVersion {constraint!r} refuses Kubernetes 1.26, the oldest supported version"
    assert match[4] == "-0", "without -0 Helm refuses pre-release and vendor builds (v1.26.4-gke.1)"


def test_chart_crds_are_a_copy_of_the_top_level_crds():
    top = crd_files(REPO / "crds")
    chart = crd_files(CHART / "crds")
    assert top, "crds/ holds no CRD: the operator's trainingjobs.longhaul.dev.yaml is missing"
    assert chart == top, (
        "charts/longhaul/crds/ differs from crds/: run  cp crds/*.yaml charts/longhaul/crds/  "
        f"(top-level: {sorted(top)}, chart: {sorted(chart)})")
    with helm.Chart.load(CHART) as loaded:
        assert [c["name"] for c in loaded.crds] == [f"crds/{n}" for n in sorted(top)]
    for name in top:
        crd = yaml.safe_load(top[name])
        kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)
        assert crd["spec"]["group"] == "longhaul.dev"
        assert crd["spec"]["names"]["kind"] == "TrainingJob"
        assert "tj" in crd["spec"]["names"]["shortNames"]


def trainingjob_schema() -> dict:
    path = REPO / "crds" / "trainingjobs.longhaul.dev.yaml"
    if not path.exists():
        pytest.fail("crds/trainingjobs.longhaul.dev.yaml is missing: cannot check the examples")
    crd = yaml.safe_load(path.read_text())
    version, = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]


def _to_json_schema(node):
    """OpenAPI v3 (structural) to JSON Schema: `nullable` widens the type, x-kubernetes-* and
    x-kubernetes-validations (CEL, checked by the API server only) are dropped, int-or-string
    becomes a type union, and objects reject unknown fields (kubectl --validate=strict)."""
    if isinstance(node, list):
        return [_to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_json_schema(v) for k, v in node.items()
           if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
        out.pop("format", None)
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else out["type"] + ["null"]
    if node.get("type") == "object" and "properties" in node and \
            "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        # The API server prunes unknown fields silently; a typo in an example must not pass.
        out["additionalProperties"] = False
    return out


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("trainingjob-*.yaml")))
def test_trainingjob_examples_are_valid_against_the_crd(example):
    schema = _to_json_schema(trainingjob_schema())
    docs = [d for d in yaml.safe_load_all((REPO / "examples" / example).read_text()) if d]
    jobs = [d for d in docs if d.get("kind") == "TrainingJob"]
    assert jobs, f"{example} holds no TrainingJob"
    for doc in docs:
        if doc.get("kind") == "TrainingJob":
            assert doc["apiVersion"] == "longhaul.dev/v1alpha1"
            jsonschema.validate(doc, schema)
            for replica in doc["spec"]["replicaSpecs"].values():
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                       "spec": replica["template"]["spec"]}
                kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)
        else:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_dashboard_promql_parses_with_promtool(tmp_path):
    """Every expression, variables at "All", as a recording rule: promtool parses them all."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package `prometheus`)")
    rules = []
    for i, q in enumerate(dq.queries(dq.load_dashboards())):
        expr = dq.substitute(q.expr)
        inner = dq._LABEL_VALUES.match(expr)
        rules.append({"record": f"dashboard:query_{i}", "expr": inner.group(1) if inner else expr})
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values_file", [None, VALUES_ALL])
def test_the_operator_binary_accepts_the_charts_flags(values_file, tmp_path):
    """The rendered args parse with the real longhaul-operator (LONGHAUL_OPERATOR, set by ctest
    when the target is built): it gets past flag parsing to its kubeconfig, which points at a
    closed port here."""
    import os
    import socket
    import subprocess

    binary = os.environ.get("LONGHAUL_OPERATOR")
    if not binary:
        pytest.skip("LONGHAUL_OPERATOR is not set (ctest sets it when longhaul-operator builds)")
    values = yaml.safe_load(values_file.read_text()) if values_file else None
    container = one(render(values), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{closed_port}"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    args = [a for a in container["args"] if not a.startswith(("--metrics-port", "--health-port"))]
    argv = [binary, *args, "--metrics-port=0", "--health-port=0", f"--kubeconfig={kubeconfig}"]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=3)
        output, code = result.stdout + result.stderr, result.returncode
    except subprocess.TimeoutExpired as e:  # running: it parsed its flags and is retrying
        def text(x):  # TimeoutExpired keeps bytes even with text=True
            return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
        output, code = text(e.stdout) + text(e.stderr), None
    assert "Run with --help" not in output and "not expected" not in output, (argv, output)
    assert code != 2 and (code is None or code < 100), (argv, code, output)


# ---------------------------------------------------------------- PrometheusRule


def prometheus_rules_of(rule_object: dict) -> list[dict]:
    return [r for g in rule_object["spec"]["groups"] for r in g["rules"]]


def alerts_of(rule_object: dict) -> dict[str, dict]:
    return {r["alert"]: r for r in prometheus_rules_of(rule_object) if "alert" in r}


def promtool_or_skip() -> str:
    import shutil

    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package `prometheus`)")
    return promtool


def test_prometheus_rule_is_off_by_default():
    assert not by_kind(render(None), "PrometheusRule")


def test_rules_pass_promtool_and_its_unit_tests_on_synthetic_series(tmp_path):
    """prometheus-rules-test.yaml: every alert fires on the series it is about, with its
    labels and annotations, and stays quiet on the healthy and not-yet cases; the recording
    rules' values (ETA, step rate, usual step time, thresholds) are computed by Prometheus's own
    engine. The rules are the chart's, rendered with its default values."""
    import shutil
    import subprocess

    promtool = promtool_or_skip()
    (tmp_path / "longhaul-rules.yaml").write_text(render_rules.rule_file())
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    checked = subprocess.run([promtool, "check", "rules", "longhaul-rules.yaml"], cwd=tmp_path,
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", RULES_TEST.name], cwd=tmp_path,
                            capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    text = RULES_TEST.read_text()
    for alert in ALERTS:
        assert f"alertname: {alert}\n" in text, f"no unit test fires or holds {alert}"


def test_the_values_rules_render_parse_with_promtool(tmp_path):
    import subprocess

    promtool = promtool_or_skip()
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(one(render(values_all()), "PrometheusRule")["spec"]))
    checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                             text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_alert_is_rendered_with_a_severity_and_a_runbook():
    rule = render_rules.prometheus_rule()
    alerts = alerts_of(rule)
    assert sorted(alerts) == sorted(ALERTS)
    base = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["runbookUrl"]
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}
        assert alert["annotations"]["runbook_url"] == f"{base}#{name.lower()}"
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    records = [r["record"] for r in prometheus_rules_of(rule) if "record" in r]
    assert len(records) == len(set(records)) and set(records) == dq.RECORDED_SERIES


def test_thresholds_severities_and_labels_come_from_the_values():
    values = values_all()["prometheusRule"]
    rule = one(render(values_all()), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert {g["interval"] for g in rule["spec"]["groups"]} == {"30s"}
    alerts = alerts_of(rule)
    assert "LonghaulSkippedSteps" not in alerts  # disabledAlerts
    records = {r["record"]: r["expr"] for r in prometheus_rules_of(rule) if "record" in r}
    stall = records["trainingjob:longhaul_train_stall_threshold_seconds"]
    assert "clamp_min(25 *" in stall and ", 1200)" in stall and "+ 1200)" in stall
    overdue = records["trainingjob:longhaul_checkpoint_overdue_threshold_seconds"]
    assert "clamp_min(4 *" in overdue and ", 3600)" in overdue and "+ 3600)" in overdue
    assert "[2h]" in alerts["LonghaulJobRestartLoop"]["expr"]
    assert alerts["LonghaulJobRestartLoop"]["expr"].rstrip().endswith(">= 5")
    assert alerts["LonghaulFailureBudgetLow"]["expr"].rstrip().endswith(">= 0.5 < 1")
    assert "[20m]" in alerts["LonghaulReconcileErrors"]["expr"]
    assert alerts["LonghaulReconcileErrors"]["expr"].rstrip().endswith("> 0.25")
    assert 'job="longhaul-lh-metrics"' in alerts["LonghaulTargetDown"]["expr"]
    keys = {"LonghaulTrainingStalled": "trainingStalled", "LonghaulCheckpointOverdue":
            "checkpointOverdue", "LonghaulJobRestartLoop": "restartLoop",
            "LonghaulFailureBudgetLow": "failureBudgetLow",
            "LonghaulFailureBudgetExhausted": "failureBudgetExhausted", "LonghaulOperatorDown":
            "operatorDown", "LonghaulReconcileErrors": "reconcileErrors",
            "LonghaulTargetDown": "targetDown"}
    for name, key in keys.items():
        alert = alerts[name]
        assert alert["labels"] == {"severity": values[key]["severity"], "team": "ml-platform",
                                   **({"namespace": NAMESPACE} if name == "LonghaulOperatorDown"
                                      else {})}, name
        assert alert.get("for") == values[key].get("for"), name
        assert alert["annotations"]["runbook_url"] == f"https://wiki.example.com/longhaul#{name.lower()}"


def test_operator_down_needs_the_operator_scraped():
    """Without the ServiceMonitor nothing scrapes the operator: LonghaulOperatorDown would fire
    forever, so it is not rendered."""
    alerts = alerts_of(render_rules.prometheus_rule(
        {"metrics": {"serviceMonitor": {"enabled": False}}}))
    assert "LonghaulOperatorDown" not in alerts
    assert "LonghaulReconcileErrors" in alerts


def test_the_scrape_test_relabels_the_operator_as_the_service_monitor_does():
    """prometheus_scrape_test.py scrapes the operator with the ServiceMonitor's metricRelabelings
    written in Prometheus's spelling; they must not drift apart."""
    import prometheus_scrape_test as scrape  # noqa: PLC0415 - standard library only
    monitor = next(o for o in render({"metrics": {"serviceMonitor": {"enabled": True}}})
                   if o["kind"] == "ServiceMonitor")
    spelling = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    relabelings = [{spelling.get(k, k): v for k, v in r.items()}
                   for r in monitor["spec"]["endpoints"][0]["metricRelabelings"]]
    assert relabelings == scrape.OPERATOR_METRIC_RELABEL_CONFIGS


def test_rules_read_only_exported_or_recorded_series():
    rule = render_rules.prometheus_rule()
    known = dq.ALL_SERIES | dq.RECORDED_SERIES | {"up"}
    for r in prometheus_rules_of(rule):
        unknown = dq.metric_names(r["expr"]) - known
        assert not unknown, f"{r.get('alert') or r.get('record')} reads {unknown}"
        if "record" in r:
            assert r["record"].startswith("trainingjob:longhaul_"), r["record"]


def test_every_alert_has_a_runbook_in_the_chart_readme():
    readme = (CHART / "README.md").read_text()
    for alert in ALERTS:
        assert f"\n### {alert}\n" in readme, f"charts/longhaul/README.md has no runbook for {alert}"
    section = readme[readme.index("\n### LonghaulTrainingStalled\n"):]
    for alert in ALERTS:
        body = section.split(f"\n### {alert}\n", 1)[1].split("\n### ", 1)[0]
        assert "Meaning" in body and "What to do" in body, alert


def test_every_alert_has_a_dashboard_panel():
    titles = [p["title"] for d in dq.load_dashboards().values() for p in d["panels"]]
    for alert in ALERTS:
        assert any(t.startswith(alert + ":") for t in titles), f"no dashboard panel for {alert}"
