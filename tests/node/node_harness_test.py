"""The real-node harness itself (label `node;slow`): a Node becomes Ready, a pod with a locally
loaded image runs as a non-root user and writes into a claim bound to the node's hostPath volume,
reaches the API server at the `kubernetes` Service address and another pod by its IP; stop()
leaves nothing behind (processes, mounts, cgroups, the bridge, the nat chain, kernel settings,
host paths); and what a SIGKILLed run left is removed by the next start.

Run: tests/node/run_node_test.sh node_harness_test.py  (as root, LONGHAUL_ENVTEST set; ctest
does it: node_harness_test). Skips with what is missing when it cannot run.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import node_harness as nh  # noqa: E402

ENVTEST = os.environ.get("LONGHAUL_ENVTEST", "")
WORKDIR = pathlib.Path(os.environ.get("LONGHAUL_BINARY_DIR") or "/tmp") / "node_harness_test"
DEADLINE = 120.0
BUSYBOX_IMAGE = "localhost/longhaul-busybox:1"


def host_state() -> dict:
    return {"sysctls": {k: nh._sysctl_path(k).read_text().strip() for k in nh.SYSCTLS},
            "paths": {p: os.path.lexists(p) for p in nh.HOST_PATHS}}


@pytest.fixture(scope="module")
def plane():
    what = nh.missing()
    if not ENVTEST:
        what.append("LONGHAUL_ENVTEST naming the built longhaul-envtest (ctest sets it)")
    if not pathlib.Path("/bin/busybox").is_file():
        what.append("/bin/busybox (Debian package busybox-static: the test image)")
    if what:
        pytest.skip(nh.skip_message(what))
    shutil.rmtree(WORKDIR, ignore_errors=True)
    cp = nh.ControlPlane(ENVTEST, WORKDIR / "plane")
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def busybox(plane) -> pathlib.Path:
    return nh.write_oci_archive(WORKDIR / "busybox.oci.tar", BUSYBOX_IMAGE,
                                {"/bin/busybox": pathlib.Path("/bin/busybox"),
                                 "/bin/sh": ("symlink", "busybox"), "/tmp": ("dir", 0o1777)},
                                ["/bin/sh"])


def pod(name: str, script: str, claim: str | None = None) -> dict:
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
            "securityContext": {"runAsUser": 1234, "runAsGroup": 1234, "runAsNonRoot": True},
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", script],
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    if claim:
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        spec["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def pod_phase(node: nh.Node, ns: str, name: str) -> str:
    got = node.api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    return (got or {}).get("status", {}).get("phase", "")


def container_log(name: str) -> str:
    return "\n".join(p.read_text(errors="replace")
                     for p in pathlib.Path("/var/log/pods").glob(f"*_{name}_*/*/*.log"))


def test_a_pod_with_a_local_image_runs_as_non_root_on_the_nodes_volume_then_nothing_is_left(
        plane, busybox):
    before = host_state()
    ns = "harness"
    with nh.Node(plane.info, WORKDIR / "node") as node:
        assert node.node_ready()
        loaded = node.import_image(busybox)
        assert BUSYBOX_IMAGE in node.images(), loaded
        node.api.call("POST", "/api/v1/namespaces",
                      {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        nh.eventually("the default ServiceAccount",
                      lambda: node.api.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"))
        _, folder = node.add_volume()
        node.api.call("POST", f"/api/v1/namespaces/{ns}/persistentvolumeclaims", {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}})
        nh.eventually("the claim bound to the node's volume (default StorageClass)", lambda: (
            node.api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/shared")
            ["status"].get("phase") == "Bound"), DEADLINE)

        # A server pod; a client pod reaches it by IP and the API server at the Service address.
        node.api.call("POST", f"/api/v1/namespaces/{ns}/pods", pod(
            "server", "echo hello-from-server > /tmp/index.html && exec httpd -f -p 8080 -h /tmp"))
        nh.eventually("the server pod Running",
                      lambda: pod_phase(node, ns, "server") in ("Running", "Failed"), DEADLINE)
        assert pod_phase(node, ns, "server") == "Running", container_log("server")
        server_ip = node.api.get(f"/api/v1/namespaces/{ns}/pods/server")["status"]["podIP"]
        assert server_ip.startswith("10.89.0."), server_ip
        script = (f"id -u > /data/uid && wget -q -O /data/from-server http://{server_ip}:8080/ && "
                  "(echo | nc $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT && "
                  "echo reached > /data/api) ; echo done")
        node.api.call("POST", f"/api/v1/namespaces/{ns}/pods", pod("client", script, claim="shared"))
        nh.eventually("the client pod Succeeded",
                      lambda: pod_phase(node, ns, "client") in ("Succeeded", "Failed"), DEADLINE)
        assert pod_phase(node, ns, "client") == "Succeeded", container_log("client")
        assert (folder / "uid").read_text().strip() == "1234"
        assert (folder / "uid").stat().st_uid == 1234, "the file was not written as the pod's user"
        assert (folder / "from-server").read_text().strip() == "hello-from-server"
        assert (folder / "api").read_text().strip() == "reached", \
            "the pod could not connect to the API server at $KUBERNETES_SERVICE_HOST"
        assert node.container_pids(), "the server's container is not in the kubepods cgroups"

    assert nh.leftovers() == []
    assert host_state() == before, "kernel settings or host paths differ after stop()"


def test_what_a_killed_run_left_is_removed_by_the_next_start(plane, busybox):
    before = host_state()
    info = WORKDIR / "killed" / "info.json"
    info.parent.mkdir(parents=True, exist_ok=True)
    log = open(WORKDIR / "killed" / "harness.log", "wb")
    # A whole harness (its own control plane) in a child process, SIGKILLed while a pod runs.
    child = subprocess.Popen([sys.executable, nh.__file__, "up", "--envtest", ENVTEST,
                              "--workdir", str(WORKDIR / "killed"), "--image", str(busybox),
                              "--info-file", str(info)], stdout=log, stderr=subprocess.STDOUT)
    try:
        nh.eventually("the child harness's node", lambda: info.exists() or child.poll() is not None,
                      300)
        assert child.poll() is None, (WORKDIR / "killed" / "harness.log").read_text()
        killed_plane = json.loads(info.read_text())
        pki = pathlib.Path(killed_plane["workDir"]) / "pki"
        api = nh.Api(killed_plane["server"], killed_plane["caFile"], str(pki / "admin.crt"),
                     str(pki / "admin.key"))
        api.call("POST", "/api/v1/namespaces/default/pods", pod("sleeper", "exec sleep 3600"))
        nh.eventually("the pod Running", lambda: (api.get(
            "/api/v1/namespaces/default/pods/sleeper") or {}).get("status", {}).get("phase")
            == "Running", DEADLINE)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        log.close()
    left = nh.leftovers()
    assert any("kubepods" in item for item in left), left
    assert any(nh.BRIDGE in item for item in left), left
    assert any(item.startswith("mount ") for item in left), left

    with nh.Node(plane.info, WORKDIR / "node-after-kill") as node:
        assert node.node_ready()
    assert nh.leftovers() == []
    assert host_state() == before
