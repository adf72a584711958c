"""Static checks of docker/*.Dockerfile and .dockerignore. No container engine runs here, so this
guards what CI's image build relies on: multi-stage, the same install script and CMake preset
as CI, a minimal runtime stage that runs as the non-root UID the chart expects, the right
entrypoint, and COPY sources and binary paths that exist in the repository.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART_VALUES = REPO / "charts" / "longhaul" / "values.yaml"


def instructions(path: pathlib.Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, f"{path.name} ends inside a continued line"
    return out


def stages(path: pathlib.Path) -> dict[str, list[tuple[str, str]]]:
    result: dict[str, list[tuple[str, str]]] = {}
    current = None
    for word, rest in instructions(path):
        if word == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert m and m.group(2), f"{path.name}: every stage is named: FROM {rest}"
            current = m.group(2)
            result[current] = [(word, m.group(1))]
        elif current:
            result[current].append((word, rest))
    return result


IMAGES = {
    "worker.Dockerfile": ("longhaul-worker", "worker/cli", "${DEBIAN_SLIM_IMAGE}"),
    "operator.Dockerfile": ("longhaul-operator", "operator/cli", "${DEBIAN_SLIM_IMAGE}"),
}


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_image_is_multi_stage_and_builds_like_ci(dockerfile):
    path = REPO / "docker" / dockerfile
    binary, cli_dir, runtime_base = IMAGES[dockerfile]
    s = stages(path)
    assert list(s) == ["build", "runtime"], list(s)
    text = path.read_text()
    assert re.search(r"ARG DEBIAN_SLIM_IMAGE=debian:12-slim", text)
    build_runs = " ".join(rest for word, rest in s["build"] if word == "RUN")
    assert "scripts/install-deps.sh" in build_runs and "--runtime" not in build_runs
    assert "cmake --preset ci" in build_runs
    assert f"cmake --build --preset ci --target {binary}" in build_runs
    assert f"build/ci/{cli_dir}/{binary}" in build_runs
    runtime = s["runtime"]
    assert runtime[0] == ("FROM", runtime_base)
    runtime_runs = " ".join(rest for word, rest in runtime if word == "RUN")
    assert "install-deps.sh --runtime" in runtime_runs
    assert "ldd /usr/local/bin/" + binary in runtime_runs
    for forbidden in ("build-essential", "cmake", "-dev ", "nvcc"):
        assert forbidden not in runtime_runs, f"runtime stage installs {forbidden}"
    assert [w for w, _ in runtime][-1] == "ENTRYPOINT" or ("ENTRYPOINT", f'["{binary}"]') in runtime
    assert ("ENTRYPOINT", f'["{binary}"]') in runtime
    users = [rest for word, rest in runtime if word == "USER"]
    assert users and re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", users[-1]), users
    uid = int(users[-1].split(":")[0])
    chart_uid = yaml.safe_load(CHART_VALUES.read_text())["podSecurityContext"]["runAsUser"]
    if binary == "longhaul-operator":
        assert uid == chart_uid, "the chart's runAsUser must be the image's user"
    # Every COPY source from the build context exists.
    for stage in s.values():
        for word, rest in stage:
            if word == "COPY" and "--from=" not in rest:
                sources = rest.split()[:-1]
                for src in sources:
                    assert src == "." or (REPO / src).exists(), f"COPY {src}: no such path"
    # Where the binary comes from: its CMake folder names the target.
    cli_cmake = REPO / cli_dir / "CMakeLists.txt"
    if cli_cmake.exists():
        assert re.search(rf"add_executable\(\s*{binary}\b", cli_cmake.read_text()), \
            f"{cli_cmake} does not define {binary}: fix the path in {dockerfile}"


def test_worker_image_compiles_and_ships_cuda():
    text = (REPO / "docker" / "worker.Dockerfile").read_text()
    s = stages(REPO / "docker" / "worker.Dockerfile")
    build = " ".join(rest for word, rest in s["build"] if word == "RUN")
    runtime = " ".join(rest for word, rest in s["runtime"] if word == "RUN")
    assert "cuda-nvcc-${CUDA_PACKAGE_VERSION}" in build and "libnccl-dev" in build
    assert "CMAKE_CUDA_COMPILER" in build, "the build must fail when nvcc was not found"
    for lib in ("cuda-cudart-${CUDA_PACKAGE_VERSION}", "libcublas-${CUDA_PACKAGE_VERSION}", "libnccl2"):
        assert lib in runtime
    assert "ARG CUDA_PACKAGE_VERSION=13-0" in text
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in text


def test_dockerignore_keeps_build_outputs_out_of_the_context():
    entries = {l.strip() for l in (REPO / ".dockerignore").read_text().splitlines()
               if l.strip() and not l.startswith("#")}
    assert {"build/", ".venv/", "runs/", ".git"} <= entries
