"""A real Kubernetes node for tests, as tests/envtest is a real API server: containerd (its CRI
plugin, runc), a kubelet and a kube-scheduler started against an envtest control plane, so that
pods the scheduler binds really run as containers on this machine, like kind's single node.

What a test gets (`Node`): a Ready Node named `longhaul-node`; images loaded from OCI archives
(`ctr images import`, pods use `imagePullPolicy: Never` or `IfNotPresent`); a default
StorageClass `longhaul-node` and static hostPath PersistentVolumes for it (`add_volume`), standing
for a cluster's ReadWriteMany storage; pods reach the API server at the `kubernetes` Service
address (10.96.0.1:443, DNAT to the loopback API server: there is no kube-proxy), and each other
by pod IP over a bridge (there is no cluster DNS).

Host state it changes, and undoes on every path (`stop()`, and at the next start after a killed
run): the bridge `lhnode0` (10.89.0.1/24), a `LONGHAUL-NODE` nat chain jumped to from
PREROUTING, the `kubepods` cgroups, kernel settings the kubelet writes (saved in the node's root
before the first change and restored from there), mounts under its root, and the paths the
kubelet and CNI hard-code (/var/log/pods, /var/log/containers, /var/lib/kubelet, /var/lib/cni,
/run/containerd) when they did not exist before. Its root is $LONGHAUL_NODE_ROOT (default
/var/tmp/longhaul-node); one node per machine at a time (an abstract-socket lock).

Binaries: containerd, ctr, runc, the CNI plugins in /usr/lib/cni, catatonit (the pause image is
built from it), ip, iptables, openssl (Debian: containerd runc containernetworking-plugins
catatonit iproute2 iptables openssl); kubelet and kube-scheduler from $LONGHAUL_KUBE_ASSETS or
the nearest shared/kube (plain or .xz, checked against SHA256SUMS, unpacked into the build
tree), like tests/envtest. `missing()` says what is absent; tests skip with that message.

Command line (for a look by hand; Ctrl-C stops it and cleans up):
    sudo python3 tests/node/node_harness.py up --envtest build/ci/tests/envtest/longhaul-envtest
    sudo python3 tests/node/node_harness.py clean      # what a killed run left

Thread-safety: a Node is used from one thread.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import io
import json
import os
import pathlib
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "support" / "python"))
import kube_client  # noqa: E402  (needs the sys.path entry above)

ROOT = pathlib.Path(os.environ.get("LONGHAUL_NODE_ROOT") or "/var/tmp/longhaul-node")
NODE_NAME = "longhaul-node"
BRIDGE = "lhnode0"
SUBNET = "10.89.0.0/24"
NODE_IP = "10.89.0.1"
CHAIN = "LONGHAUL-NODE"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service (envtest's --service-cluster-ip-range)
PAUSE_IMAGE = "localhost/longhaul-pause:1"
STORAGE_CLASS = "longhaul-node"
# LONGHAUL_NODE_DEBUG=1: the kubelet logs at -v=4 and the API server audits every pod write
# with its request body (<workdir>/plane/audit.log): for finding who wrote what to a pod.
DEBUG = bool(os.environ.get("LONGHAUL_NODE_DEBUG"))
# Written by the kubelet (and the bridge plugin): saved before the node starts, restored after.
SYSCTLS = ["vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops", "net.ipv4.ip_forward"]
# Paths the kubelet, CNI and the containerd shims hard-code whatever their configuration says.
HOST_PATHS = ["/var/log/pods", "/var/log/containers", "/var/lib/kubelet", "/var/lib/cni",
              "/run/containerd"]
CGROUP_NAME = "kubepods"
START_TIMEOUT = 180.0  # generous: a loaded 2-core machine


class NodeError(Exception):
    """The node could not be started or stopped; the message names the component and its log."""


# ----------------------------------------------------------------------------- what it needs


def _kube_assets_folders() -> list[pathlib.Path]:
    if os.environ.get("LONGHAUL_KUBE_ASSETS"):
        return [pathlib.Path(os.environ["LONGHAUL_KUBE_ASSETS"])]
    out, d = [], REPO.parent
    while True:
        out.append(d / "shared" / "kube")
        if d.parent == d:
            return out
        d = d.parent


def _cache_root() -> pathlib.Path:
    build = os.environ.get("LONGHAUL_BINARY_DIR")
    return pathlib.Path(build) / "envtest-assets" if build else ROOT.parent / "longhaul-kube-assets"


def kube_binary(name: str) -> pathlib.Path | None:
    """kubelet / kube-scheduler: plain, or .xz verified against SHA256SUMS and unpacked once."""
    for folder in _kube_assets_folders():
        plain = folder / name
        if plain.is_file() and os.access(plain, os.X_OK):
            return plain
        packed = folder / (name + ".xz")
        if not packed.is_file():
            continue
        sha = hashlib.sha256(packed.read_bytes()).hexdigest()
        sums = folder / "SHA256SUMS"
        if sums.is_file():
            listed = {line.split()[1].lstrip("*"): line.split()[0]
                      for line in sums.read_text().splitlines() if len(line.split()) == 2}
            if listed.get(packed.name, sha) != sha:
                raise NodeError(f"{packed} has SHA-256 {sha} but {sums} lists "
                                f"{listed[packed.name]}: the file is corrupt, fetch it again")
        target = _cache_root() / sha[:16] / name
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            temp = target.with_name(f"{name}.tmp.{os.getpid()}")
            with open(temp, "wb") as out:
                subprocess.run(["xz", "-dc", str(packed)], stdout=out, check=True)
            temp.chmod(0o755)
            temp.rename(target)
        return target
    return None


def missing() -> list[str]:
    """What this machine lacks to run a node (empty: it can)."""
    out = []
    if os.geteuid() != 0:
        out.append("root (the node mounts, makes cgroups, a bridge and nat rules)")
    for tool, package in (("containerd", "containerd"), ("ctr", "containerd"), ("runc", "runc"),
                          ("catatonit", "catatonit"), ("ip", "iproute2"),
                          ("iptables", "iptables"), ("openssl", "openssl"), ("xz", "xz-utils")):
        if not shutil.which(tool):
            out.append(f"{tool} (Debian package {package})")
    for plugin in ("bridge", "host-local", "loopback"):
        if not pathlib.Path("/usr/lib/cni", plugin).exists():
            out.append(f"/usr/lib/cni/{plugin} (Debian package containernetworking-plugins)")
    if not any(pathlib.Path("/sys/fs/cgroup", c).is_dir() for c in ("cpu", "unified", "cgroup.procs")):
        out.append("cgroups under /sys/fs/cgroup")
    for name in ("kubelet", "kube-scheduler"):
        try:
            if kube_binary(name) is None:
                out.append(f"{name} (in $LONGHAUL_KUBE_ASSETS, plain or .xz; e.g. "
                           f"https://dl.k8s.io/v1.26.4/bin/linux/amd64/{name})")
        except (NodeError, subprocess.CalledProcessError) as e:
            out.append(f"{name}: {e}")
    return out


def skip_message(what: list[str]) -> str:
    return ("the real-node tests need " + "; ".join(what) +
            " (scripts/install-deps.sh installs the Debian packages; see tests/node/README.md)")


# ----------------------------------------------------------------------------- small helpers


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    # PR_SET_PDEATHSIG: the child is killed when the thread that started it dies (also SIGKILL).
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    os.setpgrp()


def _run(*argv: str, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, input=input)


def _write_atomically(path: pathlib.Path, text: str | bytes, mode: int = 0o644):
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".tmp")
    temp.write_bytes(text.encode() if isinstance(text, str) else text)
    temp.chmod(mode)
    temp.rename(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sysctl_path(key: str) -> pathlib.Path:
    return pathlib.Path("/proc/sys", *key.split("."))


def _fail(message: str):
    raise NodeError(message)


def eventually(what: str, pred, timeout: float = START_TIMEOUT, interval: float = 0.2):
    """Polls pred() until it returns something truthy (returned); raises NodeError at the deadline."""
    return kube_client.eventually(what, pred, timeout, interval, _fail)


class NodeApiError(NodeError, kube_client.ApiError):
    """An API call of the node's admin client failed (a NodeError, as the node's other failures)."""


class Api(kube_client.Api):
    """The shared REST client (tests/support/python/kube_client.py) as the envtest admin (client
    certificate); failed calls raise NodeApiError."""

    error_type = NodeApiError

    def __init__(self, server: str, ca_file: str, cert: str, key: str):
        super().__init__(server, ca_file, cert=(cert, key))


# ----------------------------------------------------------------------------- OCI archives


def write_oci_archive(out: pathlib.Path, name: str, files: dict[str, object],
                      entrypoint: list[str], user: str = "") -> pathlib.Path:
    """An OCI image archive (one uncompressed layer) that `ctr images import` names `name`.
    `files` maps a path in the image to a host file (pathlib.Path), bytes, ("symlink", target)
    or ("dir", mode)."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        dirs = set()
        for path in sorted(files):
            parts = pathlib.PurePosixPath(path).parts[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i]).lstrip("/")
                if d and d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    layer.addfile(info)
            source = files[path]
            info = tarfile.TarInfo(path.lstrip("/"))
            if isinstance(source, tuple) and source[0] == "dir":
                info.type, info.mode = tarfile.DIRTYPE, source[1]
                dirs.add(info.name)
                layer.addfile(info)
                continue
            if isinstance(source, tuple):
                info.type, info.linkname = tarfile.SYMTYPE, source[1]
                layer.addfile(info)
                continue
            data = source.read_bytes() if isinstance(source, pathlib.Path) else source
            info.size, info.mode = len(data), 0o755
            layer.addfile(info, io.BytesIO(data))
    layer_bytes = layer_buf.getvalue()
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(layer_bytes)}
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": entrypoint, "User": user,
                         "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
              "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]}}
    config_desc = {"mediaType": "application/vnd.oci.image.config.v1+json",
                   **blob(json.dumps(config).encode())}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_desc, "layers": [layer_desc]}
    manifest_desc = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                     **blob(json.dumps(manifest).encode()),
                     "platform": {"architecture": "amd64", "os": "linux"},
                     "annotations": {"io.containerd.image.name": name,
                                     "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}
    index = {"schemaVersion": 2, "manifests": [manifest_desc]}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as archive:
        def add(path: str, data: bytes):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for digest, data in blobs.items():
            add("blobs/sha256/" + digest.split(":")[1], data)
    return out


def pause_image_archive(out: pathlib.Path) -> pathlib.Path:
    """The pod sandbox image: catatonit alone, in pause mode (no registry is needed)."""
    return write_oci_archive(out, PAUSE_IMAGE, {"/catatonit": pathlib.Path(shutil.which("catatonit"))},
                             ["/catatonit", "-P"], user="65535")


# ----------------------------------------------------------------------------- the node


class _Process:
    def __init__(self, name: str, argv: list[str], log: pathlib.Path):
        self.name, self.log = name, log
        self._out = open(log, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, grace: float = 20.0):
        kube_client.stop_process(self.proc, grace)
        self._out.close()


class node_lock:
    """One node per machine: an abstract unix socket (nothing on disk, released when the process
    dies), waited for up to 10 minutes. Reentrant within a process, so that a test can hold it
    around a Node's whole life (e.g. to compare host state before and after it)."""

    _sock: socket.socket | None = None
    _depth = 0

    def __enter__(self):
        cls = node_lock
        if cls._depth == 0:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            end = time.monotonic() + 600
            while True:
                try:
                    sock.bind("\0longhaul-node-lock")
                    break
                except OSError:
                    if time.monotonic() > end:
                        sock.close()
                        raise NodeError("another longhaul node runs on this machine for 10 minutes")
                    time.sleep(1)
            cls._sock = sock
        cls._depth += 1
        return self

    def __exit__(self, *exc):
        cls = node_lock
        cls._depth -= 1
        if cls._depth == 0 and cls._sock is not None:
            cls._sock.close()
            cls._sock = None


class Node:
    """One real node against the control plane described by `plane` (longhaul-envtest's info
    file: server, caFile, workDir, kubeconfig). start() cleans up what a killed run left, then
    brings containerd, the kubelet and the scheduler up; stop() undoes everything. Component
    logs go to `log_dir` (kept; everything under the node's root is removed)."""

    def __init__(self, plane: dict, log_dir: pathlib.Path):
        self.plane = plane
        self.log_dir = pathlib.Path(log_dir)
        self.root = ROOT
        pki = pathlib.Path(plane["workDir"]) / "pki"
        self.pki = pki
        self.api = Api(plane["server"], plane["caFile"], str(pki / "admin.crt"), str(pki / "admin.key"))
        self.admin_kubeconfig = pathlib.Path(plane["kubeconfig"])
        self.api_port = int(plane["server"].rsplit(":", 1)[1])
        self.socket = self.root / "containerd" / "containerd.sock"
        self._procs: list[_Process] = []
        self._lock: node_lock | None = None
        self._volumes = 0
        self._started = int(time.time() * 1000) % (1 << 32)  # names this node's volumes

    # -- lifecycle

    def __enter__(self) -> Node:
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        self._take_lock()
        try:
            clean_leftovers()
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._save_host_state()
            self._network()
            self._start_containerd()
            self.import_image(pause_image_archive(self.root / "images" / "pause.oci.tar"))
            self._start_kubelet()
            self._start_scheduler()
            self._storage_class()
        except BaseException:
            self.stop()
            raise

    def stop(self):
        """Stops every component and container and undoes every host change. Idempotent."""
        for p in reversed(self._procs):
            if p.name != "containerd":
                p.stop()
        _kill_container_processes()
        for p in self._procs:
            if p.name == "containerd":
                p.stop()
        self._procs.clear()
        clean_leftovers()
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None

    def _take_lock(self):
        self._lock = node_lock()
        self._lock.__enter__()

    def _spawn(self, name: str, argv: list[str]) -> _Process:
        p = _Process(name, argv, self.log_dir / f"{name}.log")
        self._procs.append(p)
        return p

    def _wait(self, proc: _Process, what: str, pred, timeout: float = START_TIMEOUT):
        def check():
            if not proc.alive():
                raise NodeError(f"{proc.name} exited {proc.proc.returncode} before {what}; "
                                f"its log ({proc.log}) ends:\n{proc.tail()}")
            return pred()
        try:
            return eventually(what, check, timeout)
        except NodeError as e:
            if "timed out" in str(e):
                raise NodeError(f"{e}; {proc.name}'s log ({proc.log}) ends:\n{proc.tail()}") from None
            raise

    # -- host state

    def _save_host_state(self):
        self.root.mkdir(parents=True)
        state = {"sysctls": {k: _sysctl_path(k).read_text().strip() for k in SYSCTLS
                             if _sysctl_path(k).exists()},
                 "created": [p for p in HOST_PATHS if not os.path.lexists(p)]}
        _write_atomically(self.root / "state.json", json.dumps(state, indent=2))

    def _network(self):
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        # Pods reach the API server (loopback only) at the `kubernetes` Service address.
        _sysctl_path(f"net.ipv4.conf.{BRIDGE}.route_localnet").write_text("1")
        _run("iptables", "-t", "nat", "-N", CHAIN)
        _run("iptables", "-t", "nat", "-A", CHAIN, "-d", f"{SERVICE_IP}/32", "-p", "tcp",
             "--dport", "443", "-j", "DNAT", "--to-destination", f"127.0.0.1:{self.api_port}")
        _run("iptables", "-t", "nat", "-I", "PREROUTING", "-i", BRIDGE, "-j", CHAIN)
        conflist = {"cniVersion": "0.4.0", "name": "longhaul-node",
                    "plugins": [{"type": "bridge", "bridge": BRIDGE, "isGateway": True,
                                 "ipMasq": False, "hairpinMode": True,
                                 "ipam": {"type": "host-local", "subnet": SUBNET,
                                          "gateway": NODE_IP,
                                          "dataDir": str(self.root / "cni" / "ipam"),
                                          "routes": [{"dst": "0.0.0.0/0"}]}},
                                {"type": "loopback"}]}
        _write_atomically(self.root / "cni" / "net.d" / "10-longhaul-node.conflist",
                          json.dumps(conflist, indent=2))

    # -- containerd

    def _start_containerd(self):
        c = self.root / "containerd"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{c}/root"
state = "{c}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [{cri}.containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{self.root}/runc"
  [{cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{self.root}/cni/net.d"
    max_conf_num = 1
"""
        _write_atomically(c / "config.toml", config)
        proc = self._spawn("containerd", ["containerd", "--config", str(c / "config.toml")])
        self._wait(proc, "containerd's socket",
                   lambda: self.socket.exists() and self.ctr("version", check=False).returncode == 0)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return _run("ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args, check=check)

    def import_image(self, archive: pathlib.Path) -> list[str]:
        """Loads an OCI (or docker) archive into the node; returns the image names it holds."""
        before = set(self.images())
        result = self.ctr("images", "import", str(archive), check=False)
        if result.returncode != 0:
            raise NodeError(f"ctr images import {archive} failed: {result.stderr.decode()}")
        return sorted(set(self.images()) - before) or [
            line.split()[1] for line in result.stdout.decode().splitlines() if line.startswith("unpacking")]

    def images(self) -> list[str]:
        return [line.split()[0] for line in self.ctr("images", "ls", "-q").stdout.decode().split("\n")
                if line.strip()]

    # -- kubelet

    def _kubelet_kubeconfig(self) -> pathlib.Path:
        k = self.root / "kubelet-pki"
        k.mkdir(parents=True)
        key, csr, crt = k / "kubelet.key", k / "kubelet.csr", k / "kubelet.crt"
        _run("openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
        _run("openssl", "req", "-new", "-key", str(key), "-out", str(csr),
             "-subj", f"/O=system:nodes/CN=system:node:{NODE_NAME}")
        ext = k / "ext.cnf"
        ext.write_text("keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n")
        _run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(self.pki / "ca.crt"),
             "-CAkey", str(self.pki / "ca.key"), "-CAcreateserial", "-CAserial", str(k / "ca.srl"),
             "-days", "2", "-out", str(crt), "-extfile", str(ext))
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "node",
                  "clusters": [{"name": "envtest", "cluster": {"server": self.plane["server"],
                                                               "certificate-authority": self.plane["caFile"]}}],
                  "users": [{"name": "node", "user": {"client-certificate": str(crt),
                                                      "client-key": str(key)}}],
                  "contexts": [{"name": "node", "context": {"cluster": "envtest", "user": "node"}}]}
        path = k / "kubeconfig"
        _write_atomically(path, json.dumps(config))
        return path

    def _start_kubelet(self):
        kubelet = kube_binary("kubelet")
        kubeconfig = self._kubelet_kubeconfig()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs", "failSwapOn": False, "protectKernelDefaults": False,
            "oomScoreAdj": 0, "makeIPTablesUtilChains": False,
            "address": "127.0.0.1", "port": _free_port(), "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": _free_port(),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1%", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "clusterDomain": "cluster.local", "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False, "volumePluginDir": str(self.root / "kubelet-plugins"),
            # Status updates often enough that tests see Node and pod changes promptly.
            "nodeStatusUpdateFrequency": "4s", "syncFrequency": "10s",
        }
        path = self.root / "kubelet-config.json"
        _write_atomically(path, json.dumps(config))
        self._kubelet_argv = [
            str(kubelet), f"--config={path}", f"--kubeconfig={kubeconfig}",
            f"--container-runtime-endpoint=unix://{self.socket}",
            f"--pod-infra-container-image={PAUSE_IMAGE}", f"--root-dir={self.root / 'kubelet'}",
            f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}", f"--v={4 if DEBUG else 1}"]
        proc = self._spawn("kubelet", self._kubelet_argv)
        self._wait(proc, f"Node {NODE_NAME} Ready", self.node_ready)

    def node_ready(self) -> bool:
        node = self.api.get(f"/api/v1/nodes/{NODE_NAME}")
        return bool(node) and any(c["type"] == "Ready" and c["status"] == "True"
                                  for c in node.get("status", {}).get("conditions", []))

    def restart_kubelet(self):
        """SIGKILL (a crash, as fault injection) or SIGTERM, then a new kubelet with the same
        configuration; returns when the Node is Ready again. Containers keep running meanwhile."""
        old = next(p for p in self._procs if p.name == "kubelet")
        old.proc.kill()
        old.stop()
        self._procs.remove(old)
        proc = self._spawn("kubelet", self._kubelet_argv)
        self._wait(proc, f"Node {NODE_NAME} Ready after a kubelet restart", self.node_ready)

    def kubelet_log(self) -> str:
        return (self.log_dir / "kubelet.log").read_text(errors="replace")

    # -- scheduler

    def _start_scheduler(self):
        scheduler = kube_binary("kube-scheduler")
        config = {"apiVersion": "kubescheduler.config.k8s.io/v1",
                  "kind": "KubeSchedulerConfiguration",
                  "clientConnection": {"kubeconfig": str(self.admin_kubeconfig)},
                  "leaderElection": {"leaderElect": False}}
        path = self.root / "scheduler-config.json"
        _write_atomically(path, json.dumps(config))
        port = _free_port()
        proc = self._spawn("kube-scheduler", [
            str(scheduler), f"--config={path}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--authentication-kubeconfig={self.admin_kubeconfig}",
            f"--authorization-kubeconfig={self.admin_kubeconfig}"])
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def healthy():
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=insecure,
                                            timeout=5) as r:
                    return r.status == 200
            except OSError:
                return False
        self._wait(proc, "the scheduler's /healthz", healthy)

    # -- storage

    def _storage_class(self, name: str = STORAGE_CLASS, default: bool = True):
        # Kept by the control plane across nodes (a plane may outlive several): 409 is fine.
        annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
        status, answer = self.api.request("POST", "/apis/storage.k8s.io/v1/storageclasses", {
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name, "annotations": annotations},
            "provisioner": "kubernetes.io/no-provisioner", "reclaimPolicy": "Retain",
            "volumeBindingMode": "Immediate"})
        if status not in (201, 409):
            raise NodeError(f"cannot create StorageClass {name}: HTTP {status}: {answer}")

    def add_volume(self, size: str = "10Gi",
                   storage_class: str = STORAGE_CLASS) -> tuple[str, pathlib.Path]:
        """A static hostPath PersistentVolume (ReadWriteMany, Retain) writable by any user, of
        the default class or of `storage_class` (made, not default, when it is another: what a
        manifest that names a class, like the reference example's `standard`, binds to).
        Returns its name and its folder on this machine."""
        if storage_class != STORAGE_CLASS:
            self._storage_class(storage_class, default=False)
        self._volumes += 1
        name = f"longhaul-node-{self._started:x}-{self._volumes}"
        folder = self.root / "volumes" / name
        folder.mkdir(parents=True)
        folder.chmod(0o1777)
        self.api.call("POST", "/api/v1/persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": storage_class,
                     "hostPath": {"path": str(folder), "type": "Directory"}}})
        return name, folder

    # -- a look inside

    def container_pids(self) -> list[int]:
        return _cgroup_pids()


# ----------------------------------------------------------------------------- cleanup


def _cgroup_roots() -> list[pathlib.Path]:
    base = pathlib.Path("/sys/fs/cgroup")
    roots = [base / CGROUP_NAME]
    if base.is_dir():
        roots += [d / CGROUP_NAME for d in base.iterdir() if d.is_dir()]
    return [r for r in roots if r.is_dir()]


def _cgroup_pids() -> list[int]:
    pids = set()
    for root in _cgroup_roots():
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return sorted(pids)


def _kill_container_processes():
    """SIGKILL to every process in the kubepods cgroups (thawed first), until none is left."""
    for root in _cgroup_roots():
        for state in root.rglob("freezer.state"):
            with contextlib.suppress(OSError):
                state.write_text("THAWED")
    end = time.monotonic() + 30
    while (pids := _cgroup_pids()) and time.monotonic() < end:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def node_processes() -> list[tuple[int, str]]:
    """Processes of a node (any run): containerd and its shims on the node's socket, kubelets and
    schedulers from the node's root, and whatever runs in the kubepods cgroups."""
    out = []
    root = str(ROOT)
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if root in cmdline and any(n in cmdline for n in ("containerd", "kubelet", "kube-scheduler", "runc")):
            out.append((int(d.name), cmdline.strip()))
    out += [(pid, "in the kubepods cgroups") for pid in _cgroup_pids() if pid != os.getpid()]
    return out


def node_mounts() -> list[str]:
    root = str(ROOT)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == root or point.startswith(root + "/") or point.startswith("/var/lib/kubelet/"):
                out.append(point)
    return out


def leftovers() -> list[str]:
    """What a node left on this machine (empty after a clean stop)."""
    out = [f"process {pid}: {cmd[:160]}" for pid, cmd in node_processes()]
    out += [f"mount {m}" for m in node_mounts()]
    out += [f"cgroup {r}" for r in _cgroup_roots()]
    if pathlib.Path("/sys/class/net", BRIDGE).exists():
        out.append(f"network interface {BRIDGE}")
    if _run("iptables", "-t", "nat", "-S", CHAIN, check=False).returncode == 0:
        out.append(f"iptables nat chain {CHAIN}")
    if ROOT.exists():
        out.append(f"folder {ROOT}")
    out += [f"file {p}" for p in pathlib.Path("/var/lib/cni/results").glob("longhaul-node-*")]
    return out


def clean_leftovers(log=lambda msg: None) -> list[str]:
    """Undoes whatever a node (this run's, or an earlier killed one's) left: processes, mounts,
    cgroups, the bridge, the nat chain, kernel settings, hard-coded host paths, its root.
    Returns what it found. Safe to call when nothing is there."""
    found = leftovers()
    state_file = ROOT / "state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    # 1. Processes: containers first (so that shims do not restart them), then the daemons.
    _kill_container_processes()
    for pid, cmd in node_processes():
        log(f"killing {pid}: {cmd[:120]}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    eventually("the node's processes to exit", lambda: not node_processes(), 30)
    # 2. Mounts, deepest first (lazily when still busy).
    for point in sorted(node_mounts(), key=lambda p: p.count("/"), reverse=True):
        if _run("umount", point, check=False).returncode != 0:
            _run("umount", "-l", point, check=False)
    if node_mounts():
        raise NodeError(f"cannot unmount {node_mounts()}; refusing to remove {ROOT} through them")
    # 3. Cgroups, leaves first.
    for root in _cgroup_roots():
        for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                        reverse=True) + [root]:
            with contextlib.suppress(FileNotFoundError):
                eventually(f"rmdir {d}", lambda d=d: _rmdir(d), 30)
    # 4. Network.
    if pathlib.Path("/sys/class/net", BRIDGE).exists():
        _run("ip", "link", "del", BRIDGE, check=False)
    while _run("iptables", "-t", "nat", "-D", "PREROUTING", "-i", BRIDGE, "-j", CHAIN,
               check=False).returncode == 0:
        pass
    if _run("iptables", "-t", "nat", "-S", CHAIN, check=False).returncode == 0:
        _run("iptables", "-t", "nat", "-F", CHAIN, check=False)
        _run("iptables", "-t", "nat", "-X", CHAIN, check=False)
    # 5. Kernel settings and host paths as they were before the first node started.
    for key, value in state.get("sysctls", {}).items():
        with contextlib.suppress(OSError):
            _sysctl_path(key).write_text(value)
    for path in state.get("created", []):
        if os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)
    # libcni caches each attachment's result under /var/lib/cni/results, named by network.
    for cached in pathlib.Path("/var/lib/cni/results").glob("longhaul-node-*"):
        cached.unlink(missing_ok=True)
    # 6. The root, state file last.
    if ROOT.exists():
        for child in ROOT.iterdir():
            if child != state_file:
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        with contextlib.suppress(FileNotFoundError):
            state_file.unlink()
        ROOT.rmdir()
    return found


def _rmdir(d: pathlib.Path) -> bool:
    try:
        d.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


# ----------------------------------------------------------------------------- control plane


class ControlPlane:
    """longhaul-envtest as a child process (etcd + kube-apiserver + kube-controller-manager with
    the project's CRDs); `info` is its info file (server, kubeconfig, caFile, workDir)."""

    def __init__(self, envtest: str, workdir: pathlib.Path, extra_crds: list[pathlib.Path] = ()):
        workdir.mkdir(parents=True, exist_ok=True)
        info_file = workdir / "plane.json"
        info_file.unlink(missing_ok=True)
        self.log_path = workdir / "envtest.log"
        self._log = open(self.log_path, "wb")
        argv = [envtest, "--info-file", str(info_file)]
        for crd in extra_crds:
            argv += ["--crd", str(crd)]
        if DEBUG:
            # Who wrote what to a pod's status, with the body (AUDIT_LOG in the workdir).
            policy = workdir / "audit-policy.yaml"
            policy.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\n"
                              "omitStages: [RequestReceived]\nrules:\n"
                              "  - level: Request\n    verbs: [create, update, patch, delete]\n"
                              "    resources: [{group: '', resources: [pods, pods/status]}]\n"
                              "  - level: None\n")
            argv += [f"--apiserver-flag=--audit-policy-file={policy}",
                     f"--apiserver-flag=--audit-log-path={workdir / 'audit.log'}",
                     "--apiserver-flag=--audit-log-format=json",
                     "--apiserver-flag=--audit-log-mode=blocking"]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent)
        try:
            def ready():
                if self.proc.poll() is not None:
                    raise NodeError(f"longhaul-envtest exited {self.proc.returncode}:\n"
                                    f"{self.log_path.read_text(errors='replace')[-3000:]}")
                return info_file.exists()
            eventually("longhaul-envtest's control plane", ready, 300)
        except BaseException:
            self.stop()
            raise
        self.info = json.loads(info_file.read_text())

    def stop(self):
        kube_client.stop_process(self.proc)
        self._log.close()


# ----------------------------------------------------------------------------- command line


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a control plane and a node; Ctrl-C stops both")
    up.add_argument("--envtest", required=True, help="the longhaul-envtest binary")
    up.add_argument("--workdir", default=tempfile.gettempdir() + "/longhaul-node-logs",
                    help="logs and the control plane's info file")
    up.add_argument("--image", action="append", default=[], help="an OCI archive to load")
    up.add_argument("--info-file", help="write {server, kubeconfig, ...} here once the node is Ready")
    sub.add_parser("clean", help="remove what a killed node left")
    args = parser.parse_args(argv)
    if args.command == "clean":
        for item in clean_leftovers(log=print):
            print("removed:", item)
        return 0
    if what := missing():
        print(skip_message(what), file=sys.stderr)
        return 2
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(1))
    workdir = pathlib.Path(args.workdir)
    plane = ControlPlane(args.envtest, workdir)
    try:
        with Node(plane.info, workdir / "node") as node:
            for image in args.image:
                print("loaded", node.import_image(pathlib.Path(image)), flush=True)
            if args.info_file:
                _write_atomically(pathlib.Path(args.info_file), json.dumps(plane.info))
            print(f"node {NODE_NAME} Ready; export KUBECONFIG={plane.info['kubeconfig']}", flush=True)
            while not stop:
                time.sleep(0.2)
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
