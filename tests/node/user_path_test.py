"""The user's path, end to end, on a real node (label `node;slow`; tests/node/node_harness.py):

1. `helm install` of charts/longhaul through the Helm engine (helm-python-sdk, a real install
   with Helm's release storage and `--wait`): the operator runs as the chart's Deployment from the
   operator image under the chart's ServiceAccount, Ready by its probes, talking to the API server
   through the `kubernetes` Service address like on any cluster.
2. `kubectl apply -k` of examples/trainingjob-tiny.yaml, unchanged, through a kustomize overlay
   that only renames the image to the locally built one (values-node.yaml and the overlay are
   what a user of a one-node test cluster writes). The job trains in containers as a non-root
   user on a claim bound to the node's hostPath volume; the Chief and the Worker find each other
   with no cluster DNS; `kubectl get tj` shows STEP and LAST-CKPT while it trains; it succeeds
   and the last checkpoint is on the volume.
3. Faults on the node, on a Chief + 2 Workers job under `restartScope: Replica` (the shape of
   examples/trainingjob-reference.yaml, shortened): a worker evicted through the Eviction API,
   a worker deleted with its grace period, a worker's process SIGKILLed, the kubelet restarted.
   The job succeeds, the chief is never re-created, no step is redone (the chief logs each step
   once, no replica reads a checkpoint, STEP never goes back), and the final parameters equal
   those of an uninterrupted run of the same job on the same node and image (fp32 tolerance).
4. `helm uninstall` and deleting the job while it trains leave the claim and its checkpoints;
   a second `helm install` and the same `kubectl apply -k` resume the job from them.

Images: OCI archives made by scripts/build-images.sh (`--worker cpu`), read from
$LONGHAUL_IMAGES_DIR (default <build>/images): longhaul-worker-cpu.oci.tar
(localhost/longhaul-worker:<version>-cpu) and longhaul-operator.oci.tar
(localhost/longhaul-operator:<version>). Skips, saying how to build them, when they are missing.

Run: tests/node/run_node_test.sh user_path_test.py  (as root; ctest does it: node_user_path_test).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import node_harness as nh  # noqa: E402

REPO = nh.REPO
CHART = REPO / "charts" / "longhaul"
EXAMPLES = REPO / "examples"
ENVTEST = os.environ.get("LONGHAUL_ENVTEST", "")
BINARY_DIR = pathlib.Path(os.environ.get("LONGHAUL_BINARY_DIR") or "/tmp")
IMAGES_DIR = pathlib.Path(os.environ.get("LONGHAUL_IMAGES_DIR") or BINARY_DIR / "images")
WORKDIR = BINARY_DIR / "node_user_path_test"
VERSION = re.search(r"project\(longhaul VERSION ([0-9.]+)",
                    (REPO / "CMakeLists.txt").read_text()).group(1)
WORKER_IMAGE = f"localhost/longhaul-worker:{VERSION}-cpu"
OPERATOR_IMAGE = f"localhost/longhaul-operator:{VERSION}"
RELEASE, RELEASE_NS, JOB_NS = "longhaul", "longhaul-system", "ml"
TRAIN_DEADLINE = 900.0  # two tiny replicas share 2 cores with the control plane and the operator


def log(msg: str):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def node():
    what = nh.missing()
    if not ENVTEST:
        what.append("LONGHAUL_ENVTEST naming the built longhaul-envtest (ctest sets it)")
    if not shutil.which("kubectl"):
        what.append("kubectl (the user's client: `kubectl apply -k`, `kubectl get tj`)")
    archives = [IMAGES_DIR / "longhaul-worker-cpu.oci.tar", IMAGES_DIR / "longhaul-operator.oci.tar"]
    absent = [str(a) for a in archives if not a.is_file()]
    if absent:
        what.append(f"the images {', '.join(absent)} (scripts/build-images.sh --worker cpu "
                    f"--prebuilt <a `cmake --preset cpu` build> --local-base --out {IMAGES_DIR})")
    if what:
        pytest.skip(nh.skip_message(what))
    shutil.rmtree(WORKDIR, ignore_errors=True)
    plane = nh.ControlPlane(ENVTEST, WORKDIR / "plane")
    try:
        with nh.Node(plane.info, WORKDIR / "node") as n:
            for archive in archives:
                n.import_image(archive)
            held = n.images()
            assert WORKER_IMAGE in held and OPERATOR_IMAGE in held, held
            yield n
    finally:
        plane.stop()


def kubectl(node: nh.Node, *args: str, input: str | None = None, check: bool = True) -> str:
    result = subprocess.run(["kubectl", f"--kubeconfig={node.admin_kubeconfig}", *args],
                            capture_output=True, text=True, input=input, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout}{result.stderr}")
    return result.stdout


def get_json(node: nh.Node, *args: str) -> dict:
    return json.loads(kubectl(node, "get", *args, "-o", "json"))


def pod_log(node: nh.Node, ns: str, pod: str) -> str:
    """The container log of the pod now named `pod` (the kubelet's files; no kubectl logs here)."""
    uid = get_json(node, "pod", pod, "-n", ns)["metadata"]["uid"]
    return "\n".join(f.read_text(errors="replace")
                     for f in sorted(pathlib.Path("/var/log/pods").glob(f"{ns}_{pod}_{uid}/*/*.log")))


def latest_checkpoint_step(volume: pathlib.Path) -> int:
    state = volume / "checkpoint"
    if not state.is_file():
        return 0
    m = re.search(r'model_checkpoint_path: "model\.ckpt-(\d+)', state.read_text())
    return int(m.group(1)) if m else 0


def helm_uninstall(node: nh.Node):
    import helm_python as helm
    with helm.Config(kubeconfig_path=str(node.admin_kubeconfig), namespace=RELEASE_NS) as cfg:
        cfg.uninstall(RELEASE, wait="watcher", timeout=120)


def helm_install(node: nh.Node) -> dict:
    import helm_python as helm
    values = yaml.safe_load((pathlib.Path(__file__).with_name("values-node.yaml")).read_text())
    with helm.Config(kubeconfig_path=str(node.admin_kubeconfig), namespace=RELEASE_NS) as cfg:
        return cfg.install(str(CHART), RELEASE, values, namespace=RELEASE_NS,
                           create_namespace=True, wait="watcher", timeout=300)


@pytest.fixture(scope="module")
def operator(node):
    """The chart installed; yields the operator pod once Ready."""
    release = helm_install(node)
    status = release.get("status") or (release.get("info") or {}).get("status")
    assert status == "deployed", {k: v for k, v in release.items() if k != "manifest"}
    pods = get_json(node, "pods", "-n", RELEASE_NS, "-l", "app.kubernetes.io/component=operator")
    assert len(pods["items"]) == 1, pods
    yield pods["items"][0]


def overlay(name: str, example: str, namespace: str = JOB_NS) -> pathlib.Path:
    """The example, unchanged, with a kustomization that points its image at the local build."""
    folder = WORKDIR / "overlays" / name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES / example, folder / example)
    (folder / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": namespace, "resources": [example],
        "images": [{"name": "ghcr.io/longhaul-dev/longhaul-worker",
                    "newName": WORKER_IMAGE.rsplit(":", 1)[0], "newTag": WORKER_IMAGE.rsplit(":", 1)[1]}]}))
    return folder


def get_tj_columns(node: nh.Node, job: str) -> dict[str, str]:
    """`kubectl get tj JOB` as {column: value}."""
    lines = kubectl(node, "get", "tj", job, "-n", JOB_NS).splitlines()
    header, row = lines[0], lines[1]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    cols = {}
    for i, s in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else None
        cols[header[s:end].strip()] = row[s:end].strip()
    return cols


def ensure_job_namespace(node: nh.Node, ns: str = JOB_NS):
    if kubectl(node, "get", "ns", ns, "--ignore-not-found", "-o", "name").strip():
        return
    kubectl(node, "create", "namespace", ns)
    nh.eventually("the default ServiceAccount of " + ns, lambda: kubectl(
        node, "get", "sa", "default", "-n", ns, "--ignore-not-found", "-o", "name").strip())


def dump_on_failure(node: nh.Node, job: str, ns: str = JOB_NS) -> str:
    out = [kubectl(node, "get", "tj,pods,pvc", "-n", ns, "-o", "wide", check=False),
           kubectl(node, "describe", "tj", job, "-n", ns, check=False)[-3000:]]
    for f in sorted(pathlib.Path("/var/log/pods").glob(f"{ns}_{job}-*/*/*.log"))[-4:]:
        out.append(f"--- {f}\n" + f.read_text(errors="replace")[-2000:])
    for f in sorted(pathlib.Path("/var/log/pods").glob(f"{RELEASE_NS}_*/*/*.log")):
        out.append(f"--- {f}\n" + f.read_text(errors="replace")[-2000:])
    return "\n".join(out)


# ------------------------------------------------------------------------------ tests


def test_operator_from_the_chart_runs_as_its_deployment_ready_by_its_probes(node, operator):
    spec = operator["spec"]
    container = spec["containers"][0]
    assert container["image"] == OPERATOR_IMAGE
    assert spec["serviceAccountName"] == "longhaul", spec["serviceAccountName"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert not spec.get("hostNetwork"), "the chart's pod network, not the host's"
    conditions = {c["type"]: c["status"] for c in operator["status"]["conditions"]}
    assert conditions.get("Ready") == "True", operator["status"]
    assert operator["status"]["containerStatuses"][0]["restartCount"] == 0
    deployment = get_json(node, "deployment", "-n", RELEASE_NS, "-l",
                          "app.kubernetes.io/component=operator")["items"][0]
    assert deployment["status"].get("availableReplicas") == 1, deployment["status"]
    # The leader's Lease names the pod: the operator reached the API server from inside its pod.
    lease = nh.eventually("the operator's Lease", lambda: kubectl(
        node, "get", "lease", "-n", RELEASE_NS, "-o", "jsonpath={.items[*].spec.holderIdentity}",
        check=False).strip())
    assert lease == operator["metadata"]["name"]
    assert container["securityContext"]["runAsNonRoot"] is True


def test_tiny_example_trains_to_success_with_step_and_last_ckpt_visible(node, operator):
    job = "tiny"
    ensure_job_namespace(node)
    _, volume = node.add_volume()
    kubectl(node, "apply", "-k", str(overlay(job, "trainingjob-tiny.yaml")))
    try:
        seen: dict[str, str] = {}

        def progress_while_training():
            cols = get_tj_columns(node, job)
            if cols.get("PHASE") in ("Failed", "Succeeded"):
                raise AssertionError(f"the job finished before STEP and LAST-CKPT showed: {cols}")
            if cols.get("PHASE") == "Running" and cols.get("STEP", "") not in ("", "<none>") \
                    and cols.get("LAST-CKPT", "") not in ("", "<none>"):
                seen.update(cols)
                return True
            return False
        nh.eventually("STEP and LAST-CKPT in `kubectl get tj` while the job trains",
                      progress_while_training, TRAIN_DEADLINE, interval=1.0)
        log(f"kubectl get tj {job}: {seen}")
        step, total = (int(x) for x in seen["STEP"].split("/"))
        assert 0 < step <= total == 160, seen

        nh.eventually("the job Succeeded", lambda: get_json(node, "tj", job, "-n", JOB_NS)
                      .get("status", {}).get("phase") in ("Succeeded", "Failed"), TRAIN_DEADLINE, 2.0)
        status = get_json(node, "tj", job, "-n", JOB_NS)["status"]
        assert status["phase"] == "Succeeded", status
        # Regression (#27): a job that trained 1,500 of 1,500 steps ended Succeeded showing STEP
        # 749/1500, the last metrics read before the chief exited. The finished job shows the
        # step it ended at and its last committed checkpoint, from the chief's termination
        # message, exactly.
        progress = status.get("progress", {})
        assert progress.get("step") == 160 and progress.get("steps") == "160/160", status
        assert progress.get("lastCheckpointStep") == 160, status
        cols = get_tj_columns(node, job)
        assert cols.get("STEP") == "160/160", cols
    except BaseException:
        print(dump_on_failure(node, job))
        raise

    # The checkpoints are on the node's volume, written by a non-root user.
    state = (volume / "checkpoint").read_text()
    assert 'model_checkpoint_path: "model.ckpt-160' in state, state
    final = volume / "model.ckpt-160.safetensors"
    assert final.is_file(), sorted(p.name for p in volume.iterdir())
    assert final.stat().st_uid != 0, "the worker wrote its checkpoint as root"


def test_reference_example_a_chief_and_two_workers_train_unchanged(node, operator):
    """examples/trainingjob-reference.yaml (every field at its default, a Chief and two Workers),
    unchanged but for the image: its claim binds the class it names (`standard`), the three
    replicas form their group with no cluster DNS, and STEP shows while it trains. Deleted once
    it is well into training (its 2000 steps would add minutes to the suite)."""
    job = "reference"
    ensure_job_namespace(node)
    node.add_volume(storage_class="standard")
    folder = overlay(job, "trainingjob-reference.yaml")
    kubectl(node, "apply", "-k", str(folder))
    try:
        def training() -> bool:
            cols = get_tj_columns(node, job)
            assert cols.get("PHASE") not in ("Failed", "Succeeded"), cols
            step = cols.get("STEP", "")
            return (cols.get("PHASE") == "Running" and cols.get("READY") == "3/3"
                    and "/" in step and int(step.split("/")[0]) >= 50)
        nh.eventually("the reference job training past step 50 with 3/3 ready", training,
                      TRAIN_DEADLINE, 1.0)
        log(f"kubectl get tj {job}: {get_tj_columns(node, job)}")
        claim = get_json(node, "pvc", f"{job}-logdir", "-n", JOB_NS)
        assert claim["spec"].get("storageClassName") == "standard", claim["spec"]
    except BaseException:
        print(dump_on_failure(node, job))
        raise
    kubectl(node, "delete", "-k", str(folder), "--wait=true")
    nh.eventually(f"{job}'s pods gone", lambda: not get_json(
        node, "pods", "-n", JOB_NS, "-l", f"longhaul.dev/job-name={job}")["items"], TRAIN_DEADLINE)


# ------------------------------------------------------------------------------ faults

# Long enough that each fault's window (FAULT_STEPS / 5 steps) outlasts a progress read (5 s)
# and a replacement's start at the worker's pace: at 400 steps the job outran the last fault.
FAULT_STEPS = 1000
# The pace is set by a CPU limit, not by the machine: unlimited, a faster machine than this one
# (CI's) trained the 1000 steps before the last fault. At a quarter CPU per replica (one thread:
# the worker follows its cgroup's limit) the tiny model trains at most ~13 steps/s here and
# about as fast on a faster machine, so each window lasts ~15 s.
FAULT_RESOURCES = {"requests": {"cpu": "100m"}, "limits": {"cpu": "250m"}}


def fault_job(name: str) -> dict:
    """examples/trainingjob-reference.yaml's shape (a Chief and two Workers, restartScope
    Replica: a lost replica is replaced alone and the survivors regroup in place), shortened to
    FAULT_STEPS steps with a checkpoint every 50, for the local image."""
    args = ["train", "--set=device=cpu", "--set=model.preset=tiny", "--set=training.batch_size=4",
            "--set=training.total_batch_tokens=768", f"--set=training.max_steps={FAULT_STEPS}",
            "--set=checkpoint.save_model_steps=50", "--set=checkpoint.save_model_secs=0",
            "--set=log.every_steps=10", "--set=summaries.every_steps=50", "--set=eval.every_steps=0",
            "--metrics-port=9400"]
    template = {"spec": {"terminationGracePeriodSeconds": 30, "containers": [{
        "name": "worker", "image": WORKER_IMAGE, "args": args, "resources": FAULT_RESOURCES,
        "ports": [{"name": "metrics", "containerPort": 9400}]}]}}
    return {"apiVersion": "longhaul.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": "ml-faults"},
            "spec": {"progressIntervalSeconds": 5,
                     "logdir": {"size": "1Gi", "accessModes": ["ReadWriteMany"]},
                     "runPolicy": {"restartScope": "Replica", "backoffLimit": 6,
                                   "backoff": {"initialSeconds": 1, "maxSeconds": 10}},
                     "replicaSpecs": {
                         "Chief": {"replicas": 1, "restartPolicy": "ExitCode", "template": template},
                         "Worker": {"replicas": 2, "restartPolicy": "ExitCode", "template": template}}}}


def read_safetensors(path: pathlib.Path) -> dict:
    import numpy as np
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=np.float32).reshape(t["shape"])
    return out


def worker_pid(pod: dict) -> int:
    """The longhaul-worker process of a pod's container, found by the pod's cgroup."""
    uid = pod["metadata"]["uid"]
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"pod{uid}" in (d / "cgroup").read_text() and \
                    b"longhaul-worker" in (d / "cmdline").read_bytes().split(b"\0")[0]:
                return int(d.name)
        except OSError:
            continue
    raise AssertionError(f"no longhaul-worker process in pod {pod['metadata']['name']}'s cgroups")


def run_fault_job(node: nh.Node, name: str, faults) -> pathlib.Path:
    """Runs fault_job(name) to success on a fresh volume; before each fault (fn(pods)), waits
    until the step advanced past the next multiple of FAULT_STEPS/(len(faults)+1) and every
    replica runs. Returns the volume."""
    ns = "ml-faults"
    ensure_job_namespace(node, ns)
    _, volume = node.add_volume()
    kubectl(node, "apply", "-f", "-", input=json.dumps(fault_job(name)))
    steps_seen = []

    def status():
        return get_json(node, "tj", name, "-n", ns).get("status", {})

    def step() -> int:
        s = int((status().get("progress") or {}).get("step", 0))
        steps_seen.append(s)
        return s
    try:
        for i, fault in enumerate(faults, start=1):
            target = FAULT_STEPS * i // (len(faults) + 1)
            def ready_for_fault() -> bool:
                st = status()
                assert st.get("phase") not in ("Failed", "Succeeded"), \
                    f"{name} ended before fault {i} (at step {target}) could be made: {st}"
                return (step() >= target and st.get("phase") == "Running"
                        and st.get("ready") == "3/3")
            nh.eventually(f"step {target} with every replica running before fault {i}",
                          ready_for_fault, TRAIN_DEADLINE, 0.5)
            pods = {p["metadata"]["name"]: p for p in get_json(
                node, "pods", "-n", ns, "-l", f"longhaul.dev/job-name={name}")["items"]
                if not p["metadata"].get("deletionTimestamp")}
            log(f"{name}: fault {i} at step {steps_seen[-1]}: {fault.__doc__}")
            fault(pods)
        nh.eventually(f"{name} Succeeded", lambda: (step() or True) and status().get("phase")
                      in ("Succeeded", "Failed"), TRAIN_DEADLINE, 1.0)
        assert status()["phase"] == "Succeeded", status()
    except BaseException:
        print(dump_on_failure(node, name, ns))
        raise
    assert steps_seen == sorted(steps_seen), f"STEP went back: {steps_seen}"
    return volume


def test_faults_on_the_node_redo_no_step_and_end_where_an_uninterrupted_run_ends(node, operator):
    ns = "ml-faults"
    reference = run_fault_job(node, "uninterrupted", [])

    chief_uid = {}

    def evict(pods):
        """worker-1 evicted through the Eviction API"""
        chief_uid["uid"] = pods["faults-chief-0"]["metadata"]["uid"]
        node.api.call("POST", f"/api/v1/namespaces/{ns}/pods/faults-worker-1/eviction", {
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "faults-worker-1", "namespace": ns}})

    def delete(pods):
        """worker-0 deleted with its grace period"""
        kubectl(node, "delete", "pod", "faults-worker-0", "-n", ns, "--wait=false")

    def sigkill(pods):
        """worker-1's longhaul-worker process killed with SIGKILL"""
        os.kill(worker_pid(pods["faults-worker-1"]), 9)

    def restart_kubelet(pods):
        """the kubelet restarted"""
        node.restart_kubelet()

    faulted = run_fault_job(node, "faults", [evict, delete, sigkill, restart_kubelet])

    status = get_json(node, "tj", "faults", "-n", ns)["status"]
    log(f"faults: status {json.dumps({k: status.get(k) for k in ('restartCount', 'preemptionCount', 'recoveries', 'failureBudget')})}")
    chief = get_json(node, "pod", "faults-chief-0", "-n", ns)
    assert chief["metadata"]["uid"] == chief_uid["uid"], "the chief was re-created, though never lost"
    # No step redone: the chief (never lost) logged each step once, in order; no replica read a
    # checkpoint (the replacements took the state from the survivors).
    chief_log = pod_log(node, ns, "faults-chief-0")
    # The worker follows its container's CPU limit (250m: one thread), not the node's CPUs.
    assert re.search(r"\) on cpu \(1 thread\) \|", chief_log), chief_log[:2000]
    logged = [int(m) for m in re.findall(r"step\s+(\d+)/" + str(FAULT_STEPS), chief_log)]
    assert logged == sorted(set(logged)) and logged[-1] == FAULT_STEPS, logged
    for f in pathlib.Path("/var/log/pods").glob(f"{ns}_faults-*/*/*.log"):
        assert "restored checkpoint" not in f.read_text(errors="replace"), f"{f} read a checkpoint"
    # The same parameters as the uninterrupted run (fp32 tolerance).
    import numpy as np
    want = read_safetensors(reference / f"model.ckpt-{FAULT_STEPS}.safetensors")
    got = read_safetensors(faulted / f"model.ckpt-{FAULT_STEPS}.safetensors")
    assert want.keys() == got.keys()
    params = [k for k in want if k.startswith(("transformer.", "lm_head"))]
    assert params
    for k in params:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_helm_uninstall_and_deleting_the_job_keep_the_claim_and_a_reinstall_resumes(node, operator):
    job, ns = "tiny", "ml-resume"
    ensure_job_namespace(node, ns)
    _, volume = node.add_volume()
    folder = overlay("resume", "trainingjob-tiny.yaml", namespace=ns)
    kubectl(node, "apply", "-k", str(folder))
    try:
        nh.eventually("a first checkpoint on the volume", lambda: latest_checkpoint_step(volume) > 0,
                      TRAIN_DEADLINE, interval=0.2)
        # The user deletes the job and uninstalls the chart while it trains.
        kubectl(node, "delete", "tj", job, "-n", ns, "--wait=false")
        helm_uninstall(node)
        nh.eventually("the operator pod gone after helm uninstall",
                      lambda: not get_json(node, "pods", "-n", RELEASE_NS)["items"], 120)
        nh.eventually("the job's pods deleted with it", lambda: not get_json(
            node, "pods", "-n", ns, "-l", f"longhaul.dev/job-name={job}")["items"], 120)
    except BaseException:
        print(dump_on_failure(node, job, ns))
        raise
    claim = get_json(node, "pvc", f"{job}-logdir", "-n", ns)
    assert claim["status"]["phase"] == "Bound", claim["status"]
    kept = latest_checkpoint_step(volume)
    assert 0 < kept < 160, f"the job was stopped at step {kept}: nothing left to resume"
    assert (volume / f"model.ckpt-{kept}.safetensors").is_file()

    # A second install and the same manifest: the job resumes from the kept checkpoint.
    helm_install(node)
    kubectl(node, "apply", "-k", str(folder))
    try:
        nh.eventually("the resumed job Succeeded", lambda: get_json(node, "tj", job, "-n", ns)
                      .get("status", {}).get("phase") in ("Succeeded", "Failed"), TRAIN_DEADLINE, 2.0)
        assert get_json(node, "tj", job, "-n", ns)["status"]["phase"] == "Succeeded"
        chief_log = pod_log(node, ns, f"{job}-chief-0")
    except BaseException:
        print(dump_on_failure(node, job, ns))
        raise
    restored = re.search(r'restored checkpoint.*model\.ckpt-(\d+)', chief_log)
    assert restored, "the resumed chief did not restore a checkpoint:\n" + chief_log[-3000:]
    assert int(restored.group(1)) >= kept
    assert not re.search(r"step\s+1/160", chief_log), "the resumed chief started again from step 1"
    assert latest_checkpoint_step(volume) == 160
