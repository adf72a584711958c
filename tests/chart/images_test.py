"""Static checks of docker/*.Dockerfile and .dockerignore, which run without a container engine
(tests/images/images_test.py builds and runs the images where podman is installed): multi-stage,
the same install script and CMake preset as CI, Debian bases as build arguments, a CPU worker
variant built without CUDA, runtime stages that run as the non-root UID the chart expects with
the binary as PID 1, prebuilt targets that are the same runtime stages, and COPY sources and
binary paths that exist in the repository.
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


# dockerfile -> binary, its CMake folder, and per variant: (build stage, runtime stage, target
# built from source, target packing prebuilt binaries). The last stage is what `docker build`
# gives users by default.
IMAGES = {
    "worker.Dockerfile": ("longhaul-worker", "worker/cli", {
        "cpu": ("build-cpu", "runtime-cpu", "cpu", "cpu-prebuilt"),
        "cuda": ("build-cuda", "runtime-cuda", "cuda", "cuda-prebuilt"),
    }, "cuda"),
    "operator.Dockerfile": ("longhaul-operator", "operator/cli", {
        "operator": ("build", "runtime-base", "runtime", "prebuilt"),
    }, "runtime"),
}


def runs(stage) -> str:
    return " ".join(rest for word, rest in stage if word == "RUN")


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_image_is_multi_stage_and_builds_like_ci(dockerfile):
    path = REPO / "docker" / dockerfile
    binary, cli_dir, variants, default_target = IMAGES[dockerfile]
    s = stages(path)
    assert list(s)[-1] == default_target, f"{dockerfile}: users' default is the last stage"
    text = path.read_text()
    assert re.search(r"^ARG DEBIAN_IMAGE=debian:12$", text, re.M)
    assert re.search(r"^ARG DEBIAN_SLIM_IMAGE=debian:12-slim$", text, re.M)
    chart_uid = yaml.safe_load(CHART_VALUES.read_text())["podSecurityContext"]["runAsUser"]
    for build, runtime, from_source, prebuilt in variants.values():
        assert s[build][0] == ("FROM", "${DEBIAN_IMAGE}"), "the build base is a build argument"
        build_runs = runs(s[build])
        assert "scripts/install-deps.sh --build" in build_runs and "--runtime" not in build_runs
        assert "cmake --preset ci" in build_runs
        assert f"cmake --build --preset ci --target {binary}" in build_runs
        assert f"build/ci/{cli_dir}/{binary}" in build_runs
        rt = s[runtime]
        assert rt[0] == ("FROM", "${DEBIAN_SLIM_IMAGE}"), "the runtime base is a build argument"
        runtime_runs = runs(rt)
        image = binary.removeprefix("longhaul-")
        assert f"install-deps.sh --runtime {image}" in runtime_runs
        for forbidden in ("build-essential", "cmake", "-dev ", "nvcc"):
            assert forbidden not in runtime_runs, f"{runtime} installs {forbidden}"
        # Exec form: PID 1 is the binary itself, which handles SIGTERM.
        assert ("ENTRYPOINT", f'["{binary}"]') in rt
        users = [rest for word, rest in rt if word == "USER"]
        assert users and re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", users[-1]), users
        if binary == "longhaul-operator":
            assert int(users[-1].split(":")[0]) == chart_uid, \
                "the chart's runAsUser must be the image's user"
        # The source-built and the prebuilt targets are the SAME runtime stage plus the binary,
        # checked by ldd.
        for target, source in ((from_source, f"--from={build} /out/{binary}"),
                               (prebuilt, f"prebuilt/{binary}")):
            assert s[target][0] == ("FROM", runtime), f"{target} must start from {runtime}"
            assert [w for w, _ in s[target]] == ["FROM", "COPY", "RUN"], target
            assert s[target][1] == ("COPY", f"{source} /usr/local/bin/{binary}"), s[target][1]
            assert f"ldd /usr/local/bin/{binary}" in runs(s[target])
    # Every COPY source from the build context exists (prebuilt/ is made by build-images.sh).
    for stage in s.values():
        for word, rest in stage:
            if word == "COPY" and "--from=" not in rest:
                for src in rest.split()[:-1]:
                    assert src == "." or src.startswith("prebuilt/") or (REPO / src).exists(), \
                        f"COPY {src}: no such path"
    # Where the binary comes from: its CMake folder names the target.
    cli_cmake = REPO / cli_dir / "CMakeLists.txt"
    if cli_cmake.exists():
        assert re.search(rf"add_executable\(\s*{binary}\b", cli_cmake.read_text()), \
            f"{cli_cmake} does not define {binary}: fix the path in {dockerfile}"


def test_worker_cpu_variant_is_built_without_cuda():
    s = stages(REPO / "docker" / "worker.Dockerfile")
    assert "-DLONGHAUL_CUDA=OFF" in runs(s["build-cpu"])
    for stage in ("build-cpu", "runtime-cpu"):
        text = " ".join(rest for _, rest in s[stage]).lower().replace("-dlonghaul_cuda=off", "")
        assert "cuda" not in text and "nccl" not in text, f"{stage} mentions CUDA"
    for target in ("cpu", "cpu-prebuilt"):
        assert "libcudart" in runs(s[target]), f"{target} must refuse a worker linked to CUDA"


def test_worker_image_compiles_and_ships_cuda():
    text = (REPO / "docker" / "worker.Dockerfile").read_text()
    s = stages(REPO / "docker" / "worker.Dockerfile")
    build = runs(s["build-cuda"])
    runtime = runs(s["runtime-cuda"])
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
