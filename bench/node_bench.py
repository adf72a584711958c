"""Benchmarks on a real node (bench/node_bench.sh runs this; README there and in bench/README.md).

The node of tests/node/node_harness.py (containerd + runc + CNI, the kubelet and kube-scheduler
against an envtest control plane), the images of scripts/build-images.sh (--worker cpu), and
the chart installed as tests/node/user_path_test.py installs it. Everything with the defaults a
user gets: no tuning keys in the jobs beyond what each row names.

1. Start-up: `kubectl apply -k` of examples/trainingjob-tiny.yaml (unchanged; the overlay only
   renames the image and suffixes the name per run), timed from the apply to the pods existing,
   the chief's container writing its first log line, its first completed step, and STEP showing
   in `kubectl get tj` (status.progress.step > 0).
2. Recovery: a Chief + 2 Workers job (examples/trainingjob-reference.yaml's shape: tiny preset,
   default runPolicy; a checkpoint every 50 steps and one log line per step so steps can be
   timed), one fault per fresh job once the chief printed step --lose-at, under restartScope
   Replica and Group (the workers then run supervisor.on_peer_loss=exit, as the local-cluster
   benchmark does): the time from the fault to the next step completed after the group resumed
   (the re-created victim (Replica) or the restarted chief (Group) says where it resumed; then a
   step past it in a replica that was not lost), steps redone, pods re-created, and whether a
   checkpoint was read.

Times are the container runtime's own log stamps (CRI log lines carry the time containerd read
them) against this machine's wall clock, which the node shares.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import shutil
import signal
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "node"))
import node_harness as nh  # noqa: E402
import user_path_test as up  # noqa: E402

NS = "bench"
STEP_RE = re.compile(r"^step +(\d+)/")
START_RE = re.compile(r"(starting|resuming) at step (\d+)/")


def stamp(text: str) -> float:
    """A CRI log line's RFC 3339 nanosecond stamp as Unix seconds."""
    whole, _, frac = text.rstrip("Z").partition(".")
    t = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.timezone.utc).timestamp()
    return t + (float("0." + frac) if frac else 0.0)


def log_lines(pod: str) -> list[tuple[float, str, str]]:
    """(stamp, pod uid, text) of every container log line of every pod named `pod` in NS."""
    out = []
    for f in pathlib.Path("/var/log/pods").glob(f"{NS}_{pod}_*/*/*.log"):
        uid = f.parent.parent.name.rsplit("_", 1)[1]
        for line in f.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)
            if len(parts) == 4:
                out.append((stamp(parts[0]), uid, parts[3]))
    out.sort(key=lambda x: x[0])
    return out


def wait(what: str, pred, timeout: float = 600.0, interval: float = 0.02):
    return nh.eventually(what, pred, timeout, interval)


def job_status(node: nh.Node, name: str) -> dict:
    return (node.api.get(f"/apis/longhaul.dev/v1alpha1/namespaces/{NS}/trainingjobs/{name}")
            or {}).get("status") or {}


def pods(node: nh.Node, job: str) -> list[dict]:
    return node.api.get(
        f"/api/v1/namespaces/{NS}/pods?labelSelector=longhaul.dev/job-name%3D{job}")["items"]


def delete_job(node: nh.Node, name: str):
    up.kubectl(node, "delete", "trainingjob", name, "-n", NS, "--ignore-not-found", "--wait=true")
    wait(f"{name}'s pods gone", lambda: not pods(node, name), 300.0, 0.5)


def overlay(name: str, suffix: str) -> pathlib.Path:
    folder = up.overlay(f"{name}{suffix}", "trainingjob-tiny.yaml", NS)
    kustomization = folder / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text() + f"nameSuffix: {suffix}\n")
    return folder


# ------------------------------------------------------------------------------ start-up


def startup_run(node: nh.Node, run: int) -> dict:
    name = f"tiny-r{run}"
    node.add_volume()
    folder = overlay("tiny", f"-r{run}")
    t0 = time.time()
    up.kubectl(node, "apply", "-k", str(folder))
    row: dict = {}

    def look() -> bool:
        now = time.time()
        if "pods" not in row and len(pods(node, name)) == 2:
            row["pods"] = now - t0
        lines = log_lines(f"{name}-chief-0")
        if lines and "container" not in row:
            row["container"] = lines[0][0] - t0
        for t, _, text in lines:
            if STEP_RE.match(text):
                row.setdefault("first_step", t - t0)
                break
        if "status" not in row and int((job_status(node, name).get("progress") or {})
                                       .get("step", 0)) > 0:
            row["status"] = now - t0
        phase = job_status(node, name).get("phase")
        if phase in ("Failed",):
            raise AssertionError(f"{name} failed: {job_status(node, name)}")
        return {"pods", "container", "first_step", "status"} <= row.keys()
    try:
        wait(f"{name}: the first step and STEP in status", look, 600.0, 0.05)
    finally:
        delete_job(node, name)
    return row


# ------------------------------------------------------------------------------ recovery


def recovery_job(name: str, scope: str) -> dict:
    args = ["train", "--set=device=cpu", "--set=model.preset=tiny",
            "--set=training.max_steps=1000000", "--set=checkpoint.save_model_steps=50",
            "--set=log.every_steps=1", "--metrics-port=9400"]
    if scope == "Group":
        args.append("--set=supervisor.on_peer_loss=exit")
    template = {"spec": {"containers": [{
        "name": "worker", "image": up.WORKER_IMAGE, "args": args,
        "ports": [{"name": "metrics", "containerPort": 9400}]}]}}
    return {"apiVersion": "longhaul.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"logdir": {"size": "1Gi"},
                     "runPolicy": {"restartScope": scope},
                     "replicaSpecs": {
                         "Chief": {"replicas": 1, "template": template},
                         "Worker": {"replicas": 2, "template": template}}}}


def make_fault(node: nh.Node, kind: str, pod: dict):
    name = pod["metadata"]["name"]
    if kind == "kill":
        os.kill(up.worker_pid(pod), signal.SIGKILL)
    elif kind == "evict":
        node.api.call("POST", f"/api/v1/namespaces/{NS}/pods/{name}/eviction", {
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": NS}})
    elif kind == "delete":
        up.kubectl(node, "delete", "pod", name, "-n", NS, "--wait=false")
    else:
        raise ValueError(kind)


FAULTS = {"worker SIGKILL": ("worker-1", "kill"), "chief SIGKILL": ("chief-0", "kill"),
          "worker evicted (Eviction API)": ("worker-1", "evict"),
          "worker pod deleted (SIGTERM)": ("worker-1", "delete")}


def recovery_run(node: nh.Node, scope: str, fault: str, lose_at: int, index: int) -> dict:
    name = f"rec-{scope.lower()}-{index}"
    node.add_volume()
    up.kubectl(node, "apply", "-f", "-", input=json.dumps(recovery_job(name, scope)))
    victim_role, kind = FAULTS[fault]
    victim = f"{name}-{victim_role}"
    chief = f"{name}-chief-0"
    watch = f"{name}-worker-0"  # never lost here: the survivor whose steps are timed
    try:
        def at_lose_step() -> bool:
            if job_status(node, name).get("phase") == "Failed":
                raise AssertionError(f"{name} failed: {job_status(node, name)}")
            return any(STEP_RE.match(x) and int(STEP_RE.match(x).group(1)) >= lose_at
                       for _, _, x in log_lines(chief))
        wait(f"{name}: step {lose_at}", at_lose_step, 600.0, 0.05)
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(node, name)}
        target = next(p for p in pods(node, name) if p["metadata"]["name"] == victim)
        t_fault = time.time()
        make_fault(node, kind, target)
        resumer = chief if scope == "Group" else victim
        row: dict = {}

        old_uids = set(before.values())
        row["before"] = 0

        def resumed_and_stepped() -> bool:
            # The last step of the pods lost or re-created, read while their logs exist (the
            # kubelet removes a deleted pod's logs).
            for t, uid, text in log_lines(chief) + log_lines(watch):
                m = STEP_RE.match(text)
                if m and uid in old_uids and t < row.get("resumed_at", float("inf")):
                    row["before"] = max(row["before"], int(m.group(1)))
            if "resumed_at" not in row:
                for t, _, text in log_lines(resumer):
                    m = START_RE.search(text)
                    if m and t >= t_fault:  # the lost replica's successor (or the chief's)
                        row["resumed_at"], row["resumed"] = t, int(m.group(2))
                        break
            if "resumed_at" in row:
                for t, _, text in log_lines(watch):
                    m = STEP_RE.match(text)
                    if m and t >= row["resumed_at"] and int(m.group(1)) > row["resumed"]:
                        row["next_step_at"] = t
                        return True
            return False
        wait(f"{name}: the next step after {fault}", resumed_and_stepped, 600.0, 0.05)
        last_before = row["before"]
        after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(node, name)}
        return {
            "fault_to_step": row["next_step_at"] - t_fault,
            "redone": max(0, last_before - row["resumed"]),
            "recreated": sum(1 for n, u in after.items() if before.get(n) != u),
            "ckpt_read": any("restored checkpoint" in x for p in (chief, watch, victim)
                             for t, _, x in log_lines(p) if t >= t_fault),
            "resume": f"{last_before}->{row['resumed']}",
        }
    finally:
        delete_job(node, name)


# ------------------------------------------------------------------------------ main


def helm_install(node: nh.Node, operator_args: list[str]):
    """tests/node's install (values-node.yaml), with `operator_args` as operator.extraArgs."""
    import helm_python as helm
    import yaml
    values = yaml.safe_load((HERE.parent / "tests" / "node" / "values-node.yaml").read_text())
    values.setdefault("operator", {}).setdefault("extraArgs", []).extend(operator_args)
    with helm.Config(kubeconfig_path=str(node.admin_kubeconfig), namespace=up.RELEASE_NS) as cfg:
        cfg.install(str(up.CHART), up.RELEASE, values, namespace=up.RELEASE_NS,
                    create_namespace=True, wait="watcher", timeout=300)



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per start-up / recovery row")
    ap.add_argument("--only", choices=["startup", "recovery"])
    ap.add_argument("--scopes", default="Replica,Group")
    ap.add_argument("--faults", default=",".join(FAULTS), help="comma-separated: " + ", ".join(FAULTS))
    ap.add_argument("--lose-at", type=int, default=120)
    ap.add_argument("--startup-runs", type=int, help="runs of the start-up row (default --runs)")
    ap.add_argument("--operator-arg", action="append", default=[],
                    help="an extra longhaul-operator flag (the chart's operator.extraArgs), e.g. "
                         "--operator-arg=--pod-name-release-delay=0; repeatable")
    a = ap.parse_args()
    what = nh.missing()
    if not up.ENVTEST:
        what.append("LONGHAUL_ENVTEST naming the built longhaul-envtest")
    archives = [up.IMAGES_DIR / "longhaul-worker-cpu.oci.tar",
                up.IMAGES_DIR / "longhaul-operator.oci.tar"]
    what += [f"the image {x} (scripts/build-images.sh --worker cpu)" for x in archives
             if not x.is_file()]
    if what:
        print(nh.skip_message(what), file=sys.stderr)
        return 2
    up.WORKDIR = up.BINARY_DIR / "node_bench"
    shutil.rmtree(up.WORKDIR, ignore_errors=True)
    plane = nh.ControlPlane(up.ENVTEST, up.WORKDIR / "plane")
    try:
        with nh.Node(plane.info, up.WORKDIR / "node") as node:
            for archive in archives:
                node.import_image(archive)
            t0 = time.time()
            helm_install(node, a.operator_arg)
            install = time.time() - t0
            up.ensure_job_namespace(node, NS)
            print(f"helm install --wait (operator Ready by its probes): {install:.1f} s; "
                  f"operator flags: {' '.join(a.operator_arg) or 'the defaults'}\n", flush=True)
            if a.only in (None, "startup"):
                rows = [startup_run(node, r) for r in range(1, (a.startup_runs or a.runs) + 1)]
                print("Start-up of examples/trainingjob-tiny.yaml (Chief + Worker), seconds from "
                      "`kubectl apply -k`")
                print(f"{'':8} {'pods exist':>11} {'chief log':>10} {'first step':>11} "
                      f"{'STEP shown':>11}")
                for i, r in enumerate(rows, 1):
                    print(f"run {i:<4} {r['pods']:>11.2f} {r['container']:>10.2f} "
                          f"{r['first_step']:>11.2f} {r['status']:>11.2f}")
                print(f"{'median':8} " + " ".join(
                    f"{statistics.median(r[k] for r in rows):>{w}.2f}" for k, w in
                    (("pods", 11), ("container", 10), ("first_step", 11), ("status", 11))))
                print(flush=True)
            if a.only in (None, "recovery"):
                print(f"Recovery on the real node: Chief + 2 Workers, tiny, lost at step "
                      f"{a.lose_at}, {a.runs} runs (median; min-max)")
                print(f"{'scope':8} {'fault':32} {'fault->step s':>22} {'redone':>7} "
                      f"{'re-created':>10} {'ckpt':>5} {'resume':>10}")
                index = 0
                for scope in a.scopes.split(","):
                    for fault in a.faults.split(","):
                        rs = []
                        for _ in range(a.runs):
                            index += 1
                            rs.append(recovery_run(node, scope, fault, a.lose_at, index))
                        times = [r["fault_to_step"] for r in rs]
                        print(f"{scope:8} {fault:32} {statistics.median(times):>8.2f} "
                              f"({min(times):.2f}-{max(times):.2f}) "
                              f"{max(r['redone'] for r in rs):>7} "
                              f"{max(r['recreated'] for r in rs):>10} "
                              f"{'yes' if any(r['ckpt_read'] for r in rs) else 'no':>5} "
                              f"{rs[-1]['resume']:>10}", flush=True)
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
