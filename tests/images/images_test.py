#!/usr/bin/env python3
"""Builds the CPU worker and operator images the way the tests ship them and checks, inside the
running images, what a cluster relies on. The build is scripts/build-images.sh's fast path:
the binaries this test run already compiled, packed into the same runtime stages of
docker/*.Dockerfile that users build (on a Debian 12 base made here with mmdebstrap: no
registry is needed). Then, with `podman run`:

  - the images run as the non-root UID 65532 (the chart's runAsUser), with no compiler (cc, gcc,
    g++, c++, clang, nvcc) and, in the CPU worker, no CUDA library anywhere;
  - `ldd` finds every library of both binaries;
  - `longhaul-worker doctor` passes and `longhaul-operator --version` names the version;
  - a training container with a read-only root filesystem reaches max_steps and exits 0;
  - the worker's PID 1 is longhaul-worker itself, and a SIGTERM to the container's PID 1 (what
    the kubelet sends on preemption) makes a training worker commit its final checkpoint, named
    by the logdir's `checkpoint` file, and exit 143 ("stopped by SIGTERM after the final
    checkpoint was committed", worker/cli/exit_codes.h);
  - the image sizes, printed as a table; the CPU worker image must stay within its budget.

  images_test.py --prebuilt BUILD_DIR --out DIR [--budget-mib 200]     (ctest: the fast path)
  images_test.py --from-source [--if-changed] --out DIR                (.ci/run: every stage)

Exit 0 when every check passed, 1 with the failed checks named, 77 (skipped) when not root or
podman/mmdebstrap is missing. Only the Python standard library is used.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
UID = 65532  # docker/*.Dockerfile USER; charts/longhaul values podSecurityContext.runAsUser
COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++", "nvcc", "ld")
CUDA_LIBRARY = re.compile(r"lib(cuda|cudart|cublas|cublasLt|nccl|cudnn)\.so")


def version() -> str:
    m = re.search(r"project\(longhaul VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text())
    assert m, "CMakeLists.txt has no project(longhaul VERSION ...)"
    return m.group(1)


class Checks:
    """Collects failures so one run reports every broken property, not just the first."""

    def __init__(self):
        self.failures: list[str] = []

    def expect(self, ok: bool, what: str, detail: str = "") -> bool:
        print(("PASS  " if ok else "FAIL  ") + what + ("" if ok or not detail else f"\n      {detail}"))
        if not ok:
            self.failures.append(what)
        return ok


def podman(*args: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check,
                          timeout=timeout)


def run_in(image: str, *command: str, entrypoint: str | None = None,
           user: str | None = None) -> subprocess.CompletedProcess:
    """`podman run --rm` without a network (nothing here needs one), as the image's user unless
    `user` is given."""
    args = ["run", "--rm", "--network", "none"]
    if user is not None:
        args += ["--user", user]
    if entrypoint is not None:
        args += ["--entrypoint", entrypoint]
    return podman(*args, image, *command)


def wait_for(predicate, deadline_s: float, what: str):
    """Polls `predicate` until it returns a truthy value or the generous deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {deadline_s:.0f} s")


def check_common(c: Checks, image: str, binary: str) -> None:
    user = podman("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    c.expect(user == f"{UID}:{UID}", f"{image}: USER is {UID}:{UID}", f"image config says {user!r}")
    uid = run_in(image, "-u", entrypoint="id")
    c.expect(uid.returncode == 0 and uid.stdout.strip() == str(UID),
             f"{image}: runs as uid {UID}", uid.stdout + uid.stderr)
    probe = " ".join(f"command -v {x};" for x in COMPILERS)
    found = run_in(image, "-c", probe + " ls /usr/local/cuda 2>/dev/null; true", entrypoint="sh")
    c.expect(found.returncode == 0 and not found.stdout.strip(),
             f"{image}: no compiler or CUDA toolkit ({', '.join(COMPILERS)})", found.stdout)
    ldd = run_in(image, f"/usr/local/bin/{binary}", entrypoint="ldd")
    c.expect(ldd.returncode == 0 and "not found" not in ldd.stdout,
             f"{image}: ldd finds every library of {binary}", ldd.stdout + ldd.stderr)


def check_cpu_worker(c: Checks, image: str) -> None:
    check_common(c, image, "longhaul-worker")
    # As root, so that no folder is unreadable to the search.
    libs = run_in(image, "/", "-xdev", "-name", "lib*.so*", entrypoint="find", user="0")
    cuda = [l for l in libs.stdout.splitlines() if CUDA_LIBRARY.search(l)]
    c.expect(libs.returncode == 0 and not cuda, f"{image}: no CUDA library in the image",
             " ".join(cuda) or libs.stderr)
    doctor = run_in(image, "doctor")
    c.expect(doctor.returncode == 0 and "All checks passed" in doctor.stdout,
             f"{image}: `longhaul-worker doctor` passes",
             f"exit {doctor.returncode}: {(doctor.stdout + doctor.stderr)[-800:]}")
    check_training_finishes(c, image)
    check_sigterm(c, image)


def latest_checkpoint_step(logdir: str) -> int:
    """The step of the checkpoint the logdir's `checkpoint` state file names, when its
    safetensors file exists; -1 otherwise."""
    state = pathlib.Path(logdir, "checkpoint")
    m = re.search(r'^model_checkpoint_path: "(model\.ckpt-(\d+))"',
                  state.read_text() if state.exists() else "", re.M)
    if not m or not pathlib.Path(logdir, m.group(1) + ".safetensors").is_file():
        return -1
    return int(m.group(2))


def check_training_finishes(c: Checks, image: str) -> None:
    """A job that reaches max_steps exits 0 with its last step committed."""
    with tempfile.TemporaryDirectory(prefix="longhaul-images-logdir-") as logdir:
        os.chown(logdir, UID, UID)
        run = podman("run", "--rm", "--network", "none", "--read-only", "-v", f"{logdir}:/logdir",
                     image, "train", "--logdir", "/logdir", "--set", "training.max_steps=20")
        step = latest_checkpoint_step(logdir)
        c.expect(run.returncode == 0 and step == 20,
                 f"{image}: a 20-step training run exits 0 with model.ckpt-20 committed",
                 f"exit {run.returncode}, latest checkpoint step {step}: "
                 f"{(run.stdout + run.stderr)[-800:]}")


def check_sigterm(c: Checks, image: str) -> None:
    """A training container gets SIGTERM on its PID 1: final checkpoint, exit 143."""
    name = f"longhaul-images-test-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="longhaul-images-logdir-") as logdir:
        os.chown(logdir, UID, UID)
        podman("rm", "-f", name)
        # A read-only root, as a hardened pod runs it: the worker writes only to its logdir.
        started = podman("run", "-d", "--name", name, "--network", "none", "--read-only",
                         "-v", f"{logdir}:/logdir", image,
                         "train", "--logdir", "/logdir", "--set", "training.max_steps=1000000")
        if not c.expect(started.returncode == 0, f"{image}: a training container starts",
                        started.stderr):
            return
        try:
            pid1 = podman("exec", name, "cat", "/proc/1/cmdline").stdout.split("\0")
            c.expect(pid1[0] in ("longhaul-worker", "/usr/local/bin/longhaul-worker"),
                     f"{image}: PID 1 is longhaul-worker", f"PID 1 runs {pid1}")
            status = podman("exec", name, "cat", "/proc/1/status").stdout
            c.expect(re.search(rf"^Uid:\s+{UID}\s", status, re.M) is not None,
                     f"{image}: PID 1 runs as uid {UID}", status[:300])

            def training_steps():
                logs = podman("logs", name)
                return re.search(r"^step\s+\d+/", logs.stdout + logs.stderr, re.M)

            wait_for(training_steps, 300, f"{image}: the first step line")
            podman("kill", "--signal", "TERM", name, check=True)
            exit_code = int(podman("wait", name, timeout=300).stdout.strip() or -1)
            logs = podman("logs", name)
            c.expect(exit_code == 143, f"{image}: SIGTERM to PID 1 exits 143 (final checkpoint)",
                     f"exit {exit_code}: {(logs.stdout + logs.stderr)[-800:]}")
            step = latest_checkpoint_step(logdir)
            c.expect(step > 0, f"{image}: the final checkpoint is committed in the logdir",
                     f"latest valid checkpoint step: {step}")
            said = "final checkpoint committed" in logs.stdout + logs.stderr
            c.expect(said, f"{image}: the worker logs that it stopped after the final checkpoint")
        finally:
            podman("rm", "-f", name)


def check_operator(c: Checks, image: str, expected_version: str) -> None:
    check_common(c, image, "longhaul-operator")
    # The chart runs it with a read-only root filesystem.
    shown = podman("run", "--rm", "--network", "none", "--read-only", image, "--version")
    c.expect(shown.returncode == 0 and f"longhaul-operator {expected_version}" in shown.stdout,
             f"{image}: `longhaul-operator --version` says {expected_version}",
             f"exit {shown.returncode}: {shown.stdout}{shown.stderr}")


def main() -> int:
    parser = argparse.ArgumentParser()
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prebuilt", help="the build folder whose binaries to pack (fast path)")
    source.add_argument("--from-source", action="store_true",
                        help="build every stage from the source tree instead (.ci/run)")
    parser.add_argument("--if-changed", action="store_true",
                        help="with --from-source: only when the images' inputs changed")
    parser.add_argument("--out", required=True, help="where the OCI archives go")
    parser.add_argument("--budget-mib", type=float, default=200.0,
                        help="the CPU worker image's size budget (uncompressed, MiB)")
    args = parser.parse_args()

    if os.geteuid() != 0:
        print("SKIPPED: the image tests need root (rootful podman with runc builds and runs the "
              "images); run ctest as root or build them with scripts/build-images.sh")
        return 77
    for tool in ("podman", "mmdebstrap"):
        if not shutil.which(tool):
            print(f"SKIPPED: {tool} is not installed; scripts/install-deps.sh installs it")
            return 77

    command = [str(REPO / "scripts" / "build-images.sh"), "--local-base", "--worker", "cpu",
               "--out", args.out]
    command += ["--prebuilt", args.prebuilt] if args.prebuilt else []
    command += ["--if-changed"] if args.if_changed else []
    # The build's output is passed through as it comes; its last line tells a skipped build.
    last_line = ""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as build:
        for line in build.stdout:
            print(line, end="", flush=True)
            last_line = line.strip() or last_line
    if build.returncode != 0:
        print(f"FAIL  scripts/build-images.sh exited {build.returncode}")
        return 1
    if args.if_changed and last_line.endswith("; skipped"):
        print("OK: the images' inputs are unchanged since their last full build; nothing to check")
        return 0
    # Use the containers.conf the script used (runc, limits without CAP_SYS_RESOURCE).
    if "CONTAINERS_CONF" not in os.environ:
        for cache in (os.environ.get("LONGHAUL_CACHE_DIR"), "/var/cache/longhaul"):
            if cache and pathlib.Path(cache, "images", "containers.conf").exists():
                os.environ["CONTAINERS_CONF"] = str(pathlib.Path(cache, "images", "containers.conf"))
                break

    ver = version()
    worker, operator = f"localhost/longhaul-worker:{ver}-cpu", f"localhost/longhaul-operator:{ver}"
    out = pathlib.Path(args.out)
    c = Checks()
    for archive in ("longhaul-worker-cpu.oci.tar", "longhaul-operator.oci.tar"):
        c.expect((out / archive).is_file(), f"{out / archive} written")
    check_cpu_worker(c, worker)
    check_operator(c, operator, ver)

    # Sizes: uncompressed (what a node stores) and the archive (what is shipped).
    print(f"\n{'image':<40} {'size_MiB':>9} {'archive_MiB':>12} {'budget_MiB':>11}")
    sizes = {}
    for image, archive, budget in ((worker, "longhaul-worker-cpu.oci.tar", args.budget_mib),
                                   (operator, "longhaul-operator.oci.tar", None)):
        size = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout.strip() or 0)
        packed = (out / archive).stat().st_size if (out / archive).exists() else 0
        sizes[image] = size / 2**20
        print(f"{image:<40} {size / 2**20:9.1f} {packed / 2**20:12.1f} "
              f"{'-' if budget is None else f'{budget:.0f}':>11}")
    print()
    c.expect(0 < sizes[worker] <= args.budget_mib,
             f"{worker}: {sizes[worker]:.1f} MiB within the budget of {args.budget_mib:.0f} MiB",
             "trim the runtime stage (docker/worker.Dockerfile) or raise the budget with a reason")

    if c.failures:
        print(f"FAILED: {len(c.failures)} check(s): " + "; ".join(c.failures))
        return 1
    print("OK: every image check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
