#!/usr/bin/env python3
"""Checks that the runtime stages of docker/*.Dockerfile carry every shared library the built
binaries load, without a container engine (tests/images/images_test.py runs `ldd` inside the
images where podman is installed): each library `ldd` lists for a binary must come from a
Debian package that `scripts/install-deps.sh --runtime worker|operator` installs for its image
(or one they depend on), from the debian:12-slim base (its essential and required packages),
or, for the CUDA libraries, from the CUDA runtime packages the worker image installs from
NVIDIA's repository.

  tests/chart/runtime_deps_test.py BINARY...      (ctest passes longhaul-worker, longhaul-operator)

Exit 0 when covered, 1 with the missing libraries and their packages, 77 when dpkg is absent.
Only the Python standard library is used.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
# The CUDA runtime packages installed by the worker image's runtime stage, by library name.
CUDA_LIBRARIES = {
    "libcudart.so": "cuda-cudart-13-0",
    "libcublas.so": "libcublas-13-0",
    "libcublasLt.so": "libcublas-13-0",
    "libnccl.so": "libnccl2",
}
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")  # the node's driver, mounted at run time


def runtime_packages(binary: str) -> list[str]:
    """The packages `install-deps.sh --runtime <image>` installs for the binary's image: the
    runtime_packages=( ... ) array both images install, plus <image>_runtime_packages=( ... ) for
    longhaul-worker / longhaul-operator (any other binary: every array)."""
    text = (REPO / "scripts" / "install-deps.sh").read_text()

    def array(name: str) -> list[str]:
        m = re.search(rf"^{name}=\(([^)]*)\)", text, re.M)
        if not m:
            raise SystemExit(f"FAILED: scripts/install-deps.sh has no {name}=( ... ) array")
        return m.group(1).split()

    image = pathlib.Path(binary).name.removeprefix("longhaul-")
    own = [image] if image in ("worker", "operator") else ["worker", "operator"]
    return array("runtime_packages") + [p for i in own for p in array(f"{i}_runtime_packages")]


class InstalledPackages:
    """Every installed package with its relations, from one dpkg-query call."""

    def __init__(self):
        fields = ["Package", "Status", "Essential", "Priority", "Provides", "Depends", "Pre-Depends"]
        fmt = "\t".join(f"${{{f}}}" for f in fields) + "\n"
        listing = subprocess.run(["dpkg-query", "-W", f"-f={fmt}"], capture_output=True,
                                 text=True, check=True).stdout
        self.depends: dict[str, list[list[str]]] = {}
        self.provides: dict[str, set[str]] = {}
        self.required: list[str] = []
        for line in listing.splitlines():
            name, status, essential, priority, provided, depends, pre = line.split("\t")
            if not status.endswith(" installed"):
                continue
            clauses = [c for c in (depends + "," + pre).split(",") if c.strip()]
            self.depends[name] = [[a.strip().split(" ")[0].split(":")[0] for a in c.split("|")]
                                  for c in clauses]
            for p in provided.split(","):
                if p.strip():
                    self.provides.setdefault(p.strip().split(" ")[0], set()).add(name)
            if essential == "yes" or priority == "required":
                self.required.append(name)

    def closure(self, roots) -> set[str]:
        """Packages reachable through Depends and Pre-Depends (every installed alternative;
        virtual packages through the installed packages that provide them)."""
        seen: set[str] = set()
        todo = [r.split(":")[0] for r in roots]
        while todo:
            package = todo.pop()
            if package in seen:
                continue
            seen.add(package)
            for clause in self.depends.get(package, []):
                for name in clause:
                    if name in self.depends:
                        todo.append(name)
                    todo.extend(self.provides.get(name, ()))
        return seen


def owning_packages(paths: list[str]) -> dict[str, str]:
    """path -> package for the paths dpkg knows (looked up as given and fully resolved)."""
    candidates = {}
    for path in paths:
        candidates[path] = path
        candidates[str(pathlib.Path(path).resolve())] = path
    out = subprocess.run(["dpkg", "-S", *candidates], capture_output=True, text=True).stdout
    owners = {}
    for line in out.splitlines():
        package, _, path = line.partition(": ")
        if path in candidates:
            owners.setdefault(candidates[path], package.split(":")[0].split(",")[0].strip())
    return owners


def shared_libraries(binary: str) -> dict[str, str]:
    """soname -> resolved path (or "not found") from ldd."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libraries = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(.*?)\s+\(0x", line) or re.match(r"\s*(\S+) => (not found)", line)
        if m:
            libraries[m.group(1)] = m.group(2)
    return libraries


def main(binaries: list[str]) -> int:
    if not binaries:
        print("usage: runtime_deps_test.py BINARY...", file=sys.stderr)
        return 2
    if not shutil.which("dpkg-query") or not shutil.which("ldd"):
        print("SKIPPED: dpkg-query/ldd not found (this check needs a Debian system)")
        return 77
    installed = InstalledPackages()
    # debian:12-slim holds the essential and required packages.
    base = installed.closure(installed.required) | set(CUDA_LIBRARIES.values())
    problems = []
    for binary in binaries:
        covered = base | installed.closure(runtime_packages(binary))
        libraries = shared_libraries(binary)
        owners = owning_packages([p for p in libraries.values() if p != "not found"])
        for soname, path in sorted(libraries.items()):
            stem = soname.split(".so")[0] + ".so"
            if stem in DRIVER_LIBRARIES or stem in CUDA_LIBRARIES:
                continue  # the node's driver / NVIDIA's packages in docker/worker.Dockerfile
            if path == "not found":
                problems.append(f"{binary}: {soname} is not found on this machine")
            elif path not in owners:
                problems.append(f"{binary}: {soname} ({path}) belongs to no Debian package")
            elif owners[path] not in covered:
                image = pathlib.Path(binary).name.removeprefix("longhaul-")
                problems.append(f"{binary}: {soname} comes from {owners[path]}, which "
                                f"scripts/install-deps.sh --runtime {image} does not install")
    for p in problems:
        print("FAIL:", p, file=sys.stderr)
    print(f"{len(binaries) - len({p.split(':')[0] for p in problems})} passed, "
          f"{len({p.split(':')[0] for p in problems})} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
