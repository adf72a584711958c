#!/usr/bin/env python3
"""A real Prometheus (Debian package `prometheus`) on loopback scrapes a real longhaul-worker and
a real longhaul-operator, and then:
  1. every metric of the naming contract is exported with the right TYPE by the right binary;
  2. `promtool check metrics` accepts both scrapes;
  3. the chart's PrometheusRule (rendered by render_rules.py with the venv's Helm SDK, every
     `for` at 0s) loaded into that Prometheus: every rule evaluates without error, every
     recording rule records the scraped job, every series selector of every rule matches scraped
     series (label values that only a failure would produce, like result="error", are relaxed
     to "the label exists"), no alert fires while the job is healthy, and once the worker and
     then the operator are stopped, LonghaulTargetDown and LonghaulOperatorDown fire;
  4. every PromQL expression of the Grafana dashboards (panels and variables, with the variables
     at "All") returns data from that Prometheus (the ETA panels read the recording rules).

The targets carry the labels the chart's monitors give them: the worker's job is the PodMonitor's
"longhaul-system/longhaul-workers" with namespace and trainingjob, the operator's the Service's
"longhaul-metrics" in "longhaul-system".

The worker trains the tiny CPU preset twice in one logdir: a short first run writes checkpoints,
the second restores them (restores > 0) and keeps training and checkpointing while it is
scraped. The operator runs against the project's fake API server with leader election; the test
creates a TrainingJob, then marks one of its pods preempted, so that jobs, reconciles, API
requests (including the 404 of the first Lease lookup), pod restarts and the per-job failure
budget series (present while the job exists; the operator's scrape is relabeled as the chart's
ServiceMonitor does) all have samples.

Only the Python standard library is used; the rules are rendered by the venv's Python
(--venv, default $LONGHAUL_VENV). Without the venv everything else is checked and the test exits
77 (skipped), saying the rules were not.

  tests/chart/prometheus_scrape_test.py --worker build/x/worker/cli/longhaul-worker \
      --operator build/x/operator/cli/longhaul-operator \
      --fake-apiserver build/x/tests/fakeapi/longhaul-fake-apiserver [--venv .venv]
      [--workdir DIR] [--keep]

Binary paths may also come from LONGHAUL_WORKER, LONGHAUL_OPERATOR, LONGHAUL_FAKE_APISERVER.
Exit 0 on success, 1 on failure, 77 (skipped) when prometheus/promtool are not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import dashboard_queries as dq  # noqa: E402

NAMESPACE = "default"
JOB = "scrape-test"
# What the chart's monitors make of the targets for release "longhaul" in "longhaul-system".
RELEASE_NAMESPACE = "longhaul-system"
WORKER_SCRAPE_JOB = f"{RELEASE_NAMESPACE}/longhaul-workers"
OPERATOR_SCRAPE_JOB = "longhaul-metrics"
# Labels whose values name what is scraped; matchers on other labels (result, reason, ...) pick
# values only a failure produces and are relaxed to "the label exists".
IDENTITY_LABELS = {"namespace", "trainingjob", "job", "rank", "instance"}
# templates/servicemonitor.yaml's metricRelabelings in Prometheus's own spelling (chart_test.py
# checks that they agree): the operator's per-job series get the job's namespace and trainingjob.
OPERATOR_METRIC_RELABEL_CONFIGS = [
    {"source_labels": ["__name__", "exported_namespace"], "regex": "longhaul_operator_job_.+;(.+)",
     "target_label": "namespace", "replacement": "$1"},
    {"source_labels": ["__name__", "name"], "regex": "longhaul_operator_job_.+;(.+)",
     "target_label": "trainingjob", "replacement": "$1"},
    {"action": "labeldrop", "regex": "exported_namespace|name"},
]
DEADLINE_SECONDS = 120


class Failure(Exception):
    pass


def free_port() -> int:
    """A port free a moment ago, drawn from below the kernel's ephemeral range so that the
    outgoing connections of tests running in parallel cannot take it before our server binds."""
    try:
        low = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.SystemRandom()
    for _ in range(100 if low - 10000 >= 1000 else 0):
        port = rng.randint(10000, low - 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, predicate, timeout: float = DEADLINE_SECONDS, interval: float = 0.25):
    """Polls predicate() until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - reported at the deadline
            last_error = e
        time.sleep(interval)
    raise Failure(f"timed out after {timeout:.0f}s waiting for {what}"
                  + (f" (last error: {last_error})" if last_error else ""))


def http(method: str, url: str, body=None, content_type="application/json", headers=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    with urllib.request.urlopen(req, timeout=10) as resp:
        payload = resp.read()
    return json.loads(payload) if payload[:1] in (b"{", b"[") else payload.decode()


class Processes:
    """Started children, stopped (SIGTERM, then SIGKILL) in reverse order on every path."""

    def __init__(self, workdir: pathlib.Path):
        self.workdir = workdir
        self.children: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env=None) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                env=dict(os.environ, **(env or {})), start_new_session=True)
        self.children.append((name, proc))
        return proc

    def stop(self, proc: subprocess.Popen, timeout: float = 30) -> int:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def check_alive(self):
        for name, proc in self.children:
            if proc.poll() is not None:
                raise Failure(f"{name} exited early with {proc.returncode}; log:\n" + self.tail(name))

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop_all(self):
        for _, proc in reversed(self.children):
            self.stop(proc)


def worker_args(binary: str, logdir: pathlib.Path, max_steps: int, metrics_port: int) -> list[str]:
    sets = {
        "model.preset": "tiny",
        "device": "cpu",
        "training.max_steps": str(max_steps),
        "training.batch_size": "2",
        "training.seq_len": "32",
        "checkpoint.save_model_secs": "1",
        "checkpoint.save_model_steps": "5",
        "summaries.save_summaries_secs": "1",
        "summaries.every_steps": "1",
        "log.every_steps": "50",
        "metrics_port": str(metrics_port),
    }
    argv = [binary, "train", "--logdir", str(logdir)]
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    return argv


def exposition_types(text: str) -> dict[str, str]:
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            types[name] = kind.strip()
    return types


def check_contract(text: str, counters, gauges, histograms, who: str) -> list[str]:
    types = exposition_types(text)
    problems = []
    for name in sorted(counters):
        # The exposition format names a counter family with or without its _total suffix.
        kind = types.get(name) or types.get(name.removesuffix("_total"))
        if kind != "counter":
            problems.append(f"{who}: {name} is {kind or 'missing'}, want counter")
    for name in sorted(gauges):
        if types.get(name) != "gauge":
            problems.append(f"{who}: {name} is {types.get(name) or 'missing'}, want gauge")
    for name in sorted(histograms):
        if types.get(name) != "histogram":
            problems.append(f"{who}: {name} is {types.get(name) or 'missing'}, want histogram")
    return problems


def promtool_check(promtool: str, text: str, who: str) -> list[str]:
    result = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                            capture_output=True, timeout=60)
    if result.returncode != 0:
        out = (result.stdout + result.stderr).decode(errors="replace")
        return [f"promtool check metrics on the {who} scrape failed:\n{out}"]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", default=os.environ.get("LONGHAUL_WORKER"))
    parser.add_argument("--operator", default=os.environ.get("LONGHAUL_OPERATOR"))
    parser.add_argument("--fake-apiserver", default=os.environ.get("LONGHAUL_FAKE_APISERVER"))
    parser.add_argument("--prometheus", default=shutil.which("prometheus"))
    parser.add_argument("--promtool", default=shutil.which("promtool"))
    parser.add_argument("--venv", default=os.environ.get("LONGHAUL_VENV"),
                        help="the test venv whose Python renders the chart's rules")
    parser.add_argument("--workdir", help="scratch folder (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()

    if not args.prometheus or not args.promtool:
        print("SKIPPED: prometheus/promtool not found; install the Debian package `prometheus` "
              "(scripts/install-deps.sh should list it)")
        return 77
    missing = [f"--{n.replace('_', '-')}" for n in ("worker", "operator", "fake_apiserver")
               if not getattr(args, n) or not os.access(getattr(args, n), os.X_OK)]
    if missing:
        print(f"FAILED: no executable given for {', '.join(missing)}", file=sys.stderr)
        return 1

    for name in ("worker", "operator", "fake_apiserver", "prometheus", "promtool"):
        setattr(args, name, os.path.abspath(getattr(args, name)))  # children run in workdir

    if args.workdir:
        workdir = pathlib.Path(args.workdir)
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
    else:
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="longhaul-scrape-"))
    procs = Processes(workdir)
    problems: list[str] = []
    rules = None
    venv_python = pathlib.Path(args.venv or "/nonexistent") / "bin" / "python"
    if venv_python.exists():
        rules = render_rules(str(venv_python))
    try:
        problems = run(args, workdir, procs, rules)
    except Failure as e:
        problems = [str(e)]
    finally:
        procs.stop_all()
        if problems:
            for name, _ in procs.children:
                print(f"---- {name}.log (tail) ----\n{procs.tail(name)}", file=sys.stderr)
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    for p in problems:
        print("FAIL:", p, file=sys.stderr)
    print(f"{0 if problems else 1} passed, {1 if problems else 0} failed")
    if not problems and rules is None:
        print(f"SKIPPED (in part): the chart's rules were not checked: no venv Python at "
              f"{venv_python} (--venv or LONGHAUL_VENV; scripts/setup-venv.sh creates it)")
        return 77
    return 1 if problems else 0


def render_rules(python: str) -> str:
    """The chart's rules as a Prometheus rule file, every `for` at 0s so that states change at
    the next evaluation."""
    values = {"prometheusRule": {k: {"for": "0s"} for k in (
        "trainingStalled", "checkpointOverdue", "operatorDown", "reconcileErrors", "targetDown")}}
    result = subprocess.run([python, str(pathlib.Path(__file__).with_name("render_rules.py")),
                             "--values", json.dumps(values), "--release", "longhaul",
                             "--namespace", RELEASE_NAMESPACE, "--format", "json"],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise SystemExit(f"render_rules.py failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def start_worker(args, workdir: pathlib.Path, procs: Processes) -> int:
    """A first run that checkpoints and finishes, then a resumed run (restores = 1) that keeps
    training and checkpointing. Returns the resumed run's metrics port."""
    logdir = workdir / "logdir"
    first = subprocess.run(worker_args(args.worker, logdir, 12, 0), cwd=workdir,
                           capture_output=True, timeout=300)
    if first.returncode != 0:
        raise Failure(f"first worker run exited {first.returncode}:\n"
                      + (first.stdout + first.stderr).decode(errors="replace")[-3000:])
    port = free_port()
    procs.start("worker", worker_args(args.worker, logdir, 1_000_000, port))
    return port


def start_operator(args, workdir: pathlib.Path, procs: Processes) -> int:
    """The fake API server, the operator (leader election on), a TrainingJob and one preempted
    pod. Returns the operator's metrics port."""
    kubeconfig = workdir / "kubeconfig"
    procs.start("fake-apiserver", [args.fake_apiserver, "--port", "0",
                                   "--kubeconfig-out", str(kubeconfig)])

    def api_url_printed():
        procs.check_alive()
        return next((l.strip() for l in procs.tail("fake-apiserver", 50).splitlines()
                     if l.startswith("http")), None)

    api_url = wait_for("the fake API server to print its URL", api_url_printed)
    wait_for("the kubeconfig", kubeconfig.exists)
    metrics_port, health_port = free_port(), free_port()
    procs.start("operator", [args.operator, "--kubeconfig", str(kubeconfig),
                             "--leader-elect", "--lease-name", "longhaul-scrape-test",
                             "--lease-namespace", NAMESPACE,
                             "--metrics-port", str(metrics_port),
                             "--health-port", str(health_port)])

    def ready():
        procs.check_alive()
        return http("GET", f"http://127.0.0.1:{health_port}/readyz") is not None

    wait_for("operator /readyz", ready)

    # A TrainingJob whose pods the operator creates (nothing runs them: there is no kubelet).
    job = {
        "apiVersion": "longhaul.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": JOB, "namespace": NAMESPACE},
        "spec": {"replicaSpecs": {"Worker": {"replicas": 2, "template": {"spec": {
            "containers": [{"name": "worker", "image": "longhaul-worker:test"}]}}}},
                 "logdir": {"size": "1Gi"}},
    }
    http("POST", f"{api_url}/apis/longhaul.dev/v1alpha1/namespaces/{NAMESPACE}/trainingjobs", job)
    pods_url = f"{api_url}/api/v1/namespaces/{NAMESPACE}/pods"
    selector = urllib.parse.quote(f"longhaul.dev/job-name={JOB}")

    def pods_created():
        procs.check_alive()
        return [p for p in http("GET", f"{pods_url}?labelSelector={selector}")["items"]
                if not p["metadata"].get("deletionTimestamp")]

    pods = wait_for("the operator to create the job's pods", pods_created)
    victim = sorted(p["metadata"]["name"] for p in pods)[0]
    # Preempt one pod the way the kubelet reports it: Failed with a DisruptionTarget condition.
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status_patch = {"status": {
        "phase": "Failed", "reason": "Preempted",
        "conditions": [{"type": "DisruptionTarget", "status": "True",
                        "reason": "PreemptionByScheduler", "lastTransitionTime": now,
                        "message": "preempted by the scrape test"}],
        "containerStatuses": [{"name": "worker", "ready": False, "restartCount": 0,
                               "image": "longhaul-worker:test", "imageID": "",
                               "state": {"terminated": {"exitCode": 143, "reason": "Error",
                                                        "finishedAt": now}}}]}}
    http("PATCH", f"{pods_url}/{victim}/status", status_patch,
         content_type="application/merge-patch+json")
    return metrics_port


def start_prometheus(args, workdir: pathlib.Path, procs: Processes, worker_port: int | None,
                     operator_port: int | None, rules: str | None = None):
    """Prometheus on loopback scraping the given targets every second and evaluating `rules` (a
    rule file) every second; returns (query(expr), its base URL)."""
    scrape_configs = []
    if worker_port:
        scrape_configs.append({
            "job_name": WORKER_SCRAPE_JOB,
            "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"],
                                "labels": {"namespace": NAMESPACE, "trainingjob": JOB,
                                           "replica_type": "worker"}}]})
    if operator_port:
        scrape_configs.append({
            "job_name": OPERATOR_SCRAPE_JOB,
            "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"],
                                "labels": {"namespace": RELEASE_NAMESPACE}}],
            "metric_relabel_configs": OPERATOR_METRIC_RELABEL_CONFIGS})
    config = workdir / "prometheus.yml"
    rule_files = []
    if rules is not None:
        (workdir / "longhaul-rules.yaml").write_text(rules)
        rule_files.append(str(workdir / "longhaul-rules.yaml"))
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": rule_files,
        "scrape_configs": scrape_configs}))
    checked = subprocess.run([args.promtool, "check", "config", str(config)], capture_output=True)
    if checked.returncode != 0:
        raise Failure("promtool check config: " + (checked.stdout + checked.stderr).decode())
    prom_port = free_port()
    procs.start("prometheus", [args.prometheus, f"--config.file={config}",
                               f"--storage.tsdb.path={workdir / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}",
                               "--storage.tsdb.retention.time=1h"])
    prom = f"http://127.0.0.1:{prom_port}"

    def query(expr: str) -> list:
        answer = http("GET", f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        if answer.get("status") != "success":
            raise Failure(f"Prometheus rejected {expr!r}: {answer}")
        return answer["data"]["result"]

    def all_up():
        procs.check_alive()
        return len(query("up == 1")) == len(scrape_configs)

    wait_for("Prometheus to scrape every target", all_up)
    return query, prom


def check_scrape(args, workdir: pathlib.Path, port: int, who: str) -> list[str]:
    """The naming contract and promtool on one raw /metrics scrape."""
    text = http("GET", f"http://127.0.0.1:{port}/metrics")
    (workdir / f"{who}.metrics").write_text(text)
    if who == "worker":
        problems = check_contract(text, dq.WORKER_COUNTERS, dq.WORKER_GAUGES,
                                  dq.WORKER_HISTOGRAMS, who)
    else:
        problems = check_contract(text, dq.OPERATOR_COUNTERS, dq.OPERATOR_GAUGES,
                                  dq.OPERATOR_HISTOGRAMS, who)
    return problems + promtool_check(args.promtool, text, who)


def check_dashboards(procs: Processes, query, dashboards: dict[str, dict],
                     with_rules: bool = True) -> list[str]:
    """Every query of the dashboards returns data, waiting for rates and histograms to fill.
    Without the chart's rules loaded, the queries of recorded series are left out."""
    queries = [q for q in dq.queries(dashboards)
               if with_rules or not dq.metric_names(q.expr) & dq.RECORDED_SERIES]
    pending = {q: dq.substitute(q.expr, range_="5m", rate_interval="10s") for q in queries}

    def all_answer():
        procs.check_alive()
        for q, expr in list(pending.items()):
            inner = dq._LABEL_VALUES.match(expr) if q.is_variable else None
            if inner:
                ok = any(inner.group(2) in r["metric"] for r in query(inner.group(1)))
            else:
                ok = bool(query(expr))
            if ok:
                del pending[q]
        return not pending

    try:
        wait_for("every dashboard query to return data", all_answer, timeout=90, interval=1)
    except Failure:
        pass
    print(f"dashboard queries: {len(queries) - len(pending)} of {len(queries)} returned data")
    return [f"{q.dashboard} / {q.where}: no data for {expr}" for q, expr in pending.items()]


_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def rule_selectors(expr: str) -> set[str]:
    """Every series selector of a rule expression, with matchers on labels outside
    IDENTITY_LABELS relaxed to `label!=""`."""
    out = set()
    for name in dq.metric_names(expr):
        for m in re.finditer(r"(?<![A-Za-z0-9_:])" + re.escape(name) + r"(\{[^}]*\})?", expr):
            matchers = []
            for label, op, value in _MATCHER.findall(m.group(1) or ""):
                matchers.append(f'{label}{op}"{value}"' if label in IDENTITY_LABELS
                                else f'{label}!=""')
            out.add(name + ("{" + ", ".join(matchers) + "}" if matchers else ""))
    return out


def check_rules_loaded(procs: Processes, prom: str, groups: list[dict]) -> list[str]:
    """Prometheus loaded every rule of the file and each evaluated without an error."""
    want = sum(len(g["rules"]) for g in groups)

    def evaluated():
        procs.check_alive()
        rules = [r for g in http("GET", f"{prom}/api/v1/rules")["data"]["groups"]
                 for r in g["rules"]]
        done = [r for r in rules if not r.get("lastEvaluation", "").startswith("0001")]
        return rules if len(rules) == want and len(done) == want else None

    rules = wait_for(f"Prometheus to load and evaluate the chart's {want} rules", evaluated)
    for g in http("GET", f"{prom}/api/v1/rules")["data"]["groups"]:  # reported, not asserted
        print(f"rule group {g['name']}: {len(g['rules'])} rules, last evaluation took "
              f"{g.get('evaluationTime', 0) * 1e3:.2f} ms")
    return [f"rule {r.get('name')}: health {r.get('health')}: {r.get('lastError')}"
            for r in rules if r.get("health") != "ok"]


def check_recording_rules(procs: Processes, query, groups: list[dict]) -> list[str]:
    """Every recording rule records the scraped job; the thresholds, with a tiny step time and a
    checkpoint a second, are the defaults' minimums; the ETA is positive."""
    records = [r["record"] for g in groups for r in g["rules"] if "record" in r]
    job = f'{{namespace="{NAMESPACE}", trainingjob="{JOB}"}}'
    pending = set(records)

    def all_recorded():
        procs.check_alive()
        for name in list(pending):
            if query(name + job):
                pending.discard(name)
        return not pending

    try:
        wait_for("every recording rule to record the job", all_recorded, timeout=60, interval=1)
    except Failure:
        pass
    problems = [f"recording rule {n}: no series for {job}" for n in sorted(pending)]
    print(f"recording rules: {len(records) - len(pending)} of {len(records)} recorded the job")
    expected = {"trainingjob:longhaul_train_stall_threshold_seconds": 900,
                "trainingjob:longhaul_checkpoint_overdue_threshold_seconds": 1800}
    for name, value in expected.items():
        got = [float(r["value"][1]) for r in query(name + job)]
        if got != [value]:
            problems.append(f"{name}: {got}, want [{value}] (the default minimum)")
    eta = [float(r["value"][1]) for r in query("trainingjob:longhaul_train_eta_seconds:rate10m" + job)]
    if len(eta) != 1 or not eta[0] > 0:
        problems.append(f"trainingjob:longhaul_train_eta_seconds:rate10m: {eta}, want one value > 0")
    return problems


def check_rule_selectors(query, groups: list[dict]) -> list[str]:
    """Every series selector of every rule matches what is scraped (or recorded)."""
    problems, count = [], 0
    for rule in (r for g in groups for r in g["rules"]):
        for selector in sorted(rule_selectors(rule["expr"])):
            count += 1
            if not query(selector):
                problems.append(f"{rule.get('alert') or rule.get('record')}: {selector} "
                                "matches nothing scraped")
    print(f"rule selectors: {count - len(problems)} of {count} match scraped series")
    return problems


def active_alerts(prom: str) -> list[dict]:
    return http("GET", f"{prom}/api/v1/alerts")["data"]["alerts"]


def check_job_budget_series(procs: Processes, query) -> list[str]:
    """The operator's per-job failure budget reaches Prometheus under the job's namespace and
    trainingjob (the ServiceMonitor's relabeling), not the operator's: the preemption spent none
    of the default backoffLimit 6."""
    want = {"longhaul_operator_job_failures": "0", "longhaul_operator_job_backoff_limit": "6"}
    problems = []
    for name, value in want.items():
        selector = f'{name}{{namespace="{NAMESPACE}", trainingjob="{JOB}", job="{OPERATOR_SCRAPE_JOB}"}}'
        try:
            found = wait_for(selector, lambda: (procs.check_alive(), query(selector))[1], timeout=30)
        except Failure as e:
            problems.append(f"{e}; the operator's series: {query(name)}")
            continue
        labels, got = found[0]["metric"], found[0]["value"][1]
        if got != value or "exported_namespace" in labels or "name" in labels:
            problems.append(f"{selector}: want value {value} and no exported_namespace/name "
                            f"labels, got {found}")
    return problems


def check_quiet(prom: str) -> list[str]:
    """A healthy job and operator raise none of the chart's alerts (reconcile errors aside: the
    fake API server's conflicts may make a few)."""
    return [f"{a['labels']['alertname']} is {a['state']} on a healthy job: {a['labels']}"
            for a in active_alerts(prom)
            if a["labels"]["alertname"].startswith("Longhaul")
            and a["labels"]["alertname"] != "LonghaulReconcileErrors"]


def wait_for_alert(procs: Processes, prom: str, alertname: str, **labels) -> list[str]:
    def firing():
        return [a for a in active_alerts(prom) if a["state"] == "firing"
                and a["labels"]["alertname"] == alertname
                and all(a["labels"].get(k) == v for k, v in labels.items())]

    try:
        wait_for(f"{alertname} {labels} to fire", firing, timeout=60, interval=0.5)
        print(f"{alertname} {labels}: fired")
        return []
    except Failure as e:
        return [f"{e}; active alerts: {active_alerts(prom)}"]


def run(args, workdir: pathlib.Path, procs: Processes, rules: str | None) -> list[str]:
    worker_port = start_worker(args, workdir, procs)
    operator_port = start_operator(args, workdir, procs)
    query, prom = start_prometheus(args, workdir, procs, worker_port, operator_port, rules)
    problems = check_scrape(args, workdir, worker_port, "worker")
    problems += check_scrape(args, workdir, operator_port, "operator")
    problems += check_job_budget_series(procs, query)
    groups = json.loads(rules)["groups"] if rules is not None else []
    if rules is not None:
        problems += check_rules_loaded(procs, prom, groups)
        problems += check_recording_rules(procs, query, groups)
        problems += check_rule_selectors(query, groups)
    problems += check_dashboards(procs, query, dq.load_dashboards(), rules is not None)
    if rules is not None:
        problems += check_quiet(prom)
    worker = next(p for name, p in procs.children if name == "worker")
    code = procs.stop(worker)
    if code not in (0, 143):
        problems.append(f"the scraped worker exited {code} on SIGTERM (want 143 or 0)")
    if rules is not None:
        problems += wait_for_alert(procs, prom, "LonghaulTargetDown", job=WORKER_SCRAPE_JOB,
                                   trainingjob=JOB)
        operator = next(p for name, p in procs.children if name == "operator")
        procs.stop(operator)
        problems += wait_for_alert(procs, prom, "LonghaulOperatorDown",
                                   namespace=RELEASE_NAMESPACE)
        problems += wait_for_alert(procs, prom, "LonghaulTargetDown", job=OPERATOR_SCRAPE_JOB)
    return problems


if __name__ == "__main__":
    sys.exit(main())
