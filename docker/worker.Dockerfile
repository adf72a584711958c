# syntax=docker/dockerfile:1.7
# longhaul-worker: the training program. Two variants, chosen by the build target:
#
#   cuda (the default, the last stage): the CUDA backend (bf16, cuBLASLt, NCCL)
#     docker build -f docker/worker.Dockerfile -t longhaul-worker:0.1.0 .
#     docker run --gpus all longhaul-worker:0.1.0 train --set device=cuda
#   cpu: the worker built WITHOUT CUDA (fp32, OpenBLAS, Gloo), no CUDA library in the image
#     docker build -f docker/worker.Dockerfile --target cpu -t longhaul-worker:0.1.0-cpu .
#
# scripts/build-images.sh builds both with podman or docker, and the `*-prebuilt` targets: the
# same runtime stages with binaries taken from the build context's prebuilt/ folder (what the
# tests do with the binaries they already compiled). docker/README.md compares the variants.
#
# Base: Debian 12 in every stage (DEBIAN_IMAGE, DEBIAN_SLIM_IMAGE; the tests pass a base made
# locally with mmdebstrap). The project's scripts/install-deps.sh names Debian 12 packages
# (libyaml-cpp0.7, libprotobuf32, libgloo0, ...), so the build runs the exact install and build
# steps CI runs on Debian 12; an nvidia/cuda Ubuntu 24.04 base would need different package
# names (t64 renames, yaml-cpp 0.8) and would drift from CI. The CUDA variant adds NVIDIA's
# CUDA apt repository for Debian 12 and takes only the CUDA packages each stage needs: nvcc,
# cudart, cuBLAS(Lt) and NCCL headers to build; cudart, cuBLAS(Lt) and NCCL to run. The driver
# (libcuda.so.1) comes from the node through the NVIDIA container toolkit.

ARG DEBIAN_IMAGE=debian:12
ARG DEBIAN_SLIM_IMAGE=debian:12-slim
# CUDA 13.0 packages (apt names use a dash: 13-0).
ARG CUDA_PACKAGE_VERSION=13-0
ARG CUDA_KEYRING_URL=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb

# ---------------------------------------------------------------------------------------------
# Build, CPU variant: CI's preset (warnings are errors) with CUDA switched off explicitly, so a
# build machine that has nvcc still produces a worker that loads no CUDA library.
FROM ${DEBIAN_IMAGE} AS build-cpu
WORKDIR /src
# The same dependency script as CI and the README (its own layer: cached until it changes).
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh --build && rm -rf /var/lib/apt/lists/*

COPY . .
RUN --mount=type=cache,target=/root/.cache/ccache \
    cmake --preset ci -DLONGHAUL_CUDA=OFF \
 && cmake --build --preset ci --target longhaul-worker \
 && install -D -m 0755 -s build/ci/worker/cli/longhaul-worker /out/longhaul-worker

# ---------------------------------------------------------------------------------------------
# Build, CUDA variant.
FROM ${DEBIAN_IMAGE} AS build-cuda
ARG CUDA_PACKAGE_VERSION
ARG CUDA_KEYRING_URL
# GPU architectures compiled into the binary: A100 (80), H100/H200 (90), B200 (100).
ARG CUDA_ARCHITECTURES="80;90;100"
ADD ${CUDA_KEYRING_URL} /tmp/cuda-keyring.deb
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends ca-certificates \
 && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      cuda-nvcc-${CUDA_PACKAGE_VERSION} cuda-cudart-dev-${CUDA_PACKAGE_VERSION} \
      libcublas-dev-${CUDA_PACKAGE_VERSION} libnccl-dev libnccl2 \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:${PATH} \
    CUDACXX=/usr/local/cuda/bin/nvcc

WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh --build && rm -rf /var/lib/apt/lists/*

COPY . .
# CI's preset (CUDA compiled because nvcc is on PATH); only the worker target is built. The grep
# fails the build if CMake did not find nvcc: a CPU-only worker would otherwise ship silently
# under the CUDA image's name.
RUN --mount=type=cache,target=/root/.cache/ccache \
    cmake --preset ci -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
 && cmake --build --preset ci --target longhaul-worker \
 && grep -Eq '^CMAKE_CUDA_COMPILER:[A-Z]+=/' build/ci/CMakeCache.txt \
 && install -D -m 0755 -s build/ci/worker/cli/longhaul-worker /out/longhaul-worker

# ---------------------------------------------------------------------------------------------
# Runtime, CPU variant: Debian 12 slim, the worker's shared libraries (`install-deps.sh
# --runtime worker`), a non-root user. No compiler, no CUDA. PID 1 is longhaul-worker itself
# (exec-form ENTRYPOINT): `train` handles SIGTERM (final checkpoint, exit 143) and starts no
# child process.
FROM ${DEBIAN_SLIM_IMAGE} AS runtime-cpu
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh --runtime worker \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /tmp/install-deps.sh \
 && useradd --uid 65532 --user-group --create-home --home-dir /home/longhaul \
      --shell /usr/sbin/nologin longhaul
USER 65532:65532
WORKDIR /home/longhaul
# Prometheus metrics (`train --metrics-port 9400` or metrics_port in the config; the chart's
# PodMonitor scrapes the container port named "metrics").
EXPOSE 9400
ENTRYPOINT ["longhaul-worker"]
CMD ["train"]

# The CPU image from binaries already built on a Debian 12 host (`cmake --preset cpu`): the
# build context holds prebuilt/longhaul-worker (scripts/build-images.sh --prebuilt makes it).
FROM runtime-cpu AS cpu-prebuilt
COPY prebuilt/longhaul-worker /usr/local/bin/longhaul-worker
# Fail the image build, not the first training job, when a shared library is missing, or when a
# CUDA library is linked into what must be a CPU-only worker.
RUN missing="$(ldd /usr/local/bin/longhaul-worker | grep 'not found' || true)"; \
    if [ -n "$missing" ]; then echo "longhaul-worker lacks runtime libraries:"; echo "$missing"; exit 1; fi; \
    cuda="$(ldd /usr/local/bin/longhaul-worker | grep -E 'libcuda|libcudart|libcublas|libnccl' || true)"; \
    if [ -n "$cuda" ]; then echo "the CPU worker links CUDA libraries (build it with -DLONGHAUL_CUDA=OFF):"; echo "$cuda"; exit 1; fi

# The CPU image built from source.
FROM runtime-cpu AS cpu
COPY --from=build-cpu /out/longhaul-worker /usr/local/bin/longhaul-worker
RUN missing="$(ldd /usr/local/bin/longhaul-worker | grep 'not found' || true)"; \
    if [ -n "$missing" ]; then echo "longhaul-worker lacks runtime libraries:"; echo "$missing"; exit 1; fi; \
    cuda="$(ldd /usr/local/bin/longhaul-worker | grep -E 'libcuda|libcudart|libcublas|libnccl' || true)"; \
    if [ -n "$cuda" ]; then echo "the CPU worker links CUDA libraries (build it with -DLONGHAUL_CUDA=OFF):"; echo "$cuda"; exit 1; fi

# ---------------------------------------------------------------------------------------------
# Runtime, CUDA variant: the CPU runtime's libraries plus NVIDIA's cudart, cuBLAS(Lt) and NCCL.
FROM ${DEBIAN_SLIM_IMAGE} AS runtime-cuda
ARG CUDA_PACKAGE_VERSION
ARG CUDA_KEYRING_URL
ADD ${CUDA_KEYRING_URL} /tmp/cuda-keyring.deb
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends ca-certificates \
 && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      cuda-cudart-${CUDA_PACKAGE_VERSION} libcublas-${CUDA_PACKAGE_VERSION} libnccl2 \
 && /tmp/install-deps.sh --runtime worker \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /tmp/install-deps.sh \
 && useradd --uid 65532 --user-group --create-home --home-dir /home/longhaul \
      --shell /usr/sbin/nologin longhaul
# The NVIDIA container toolkit mounts the driver for these capabilities; the CUDA libraries live
# under /usr/local/cuda (set before the checks below so that they see what the container sees).
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LD_LIBRARY_PATH=/usr/local/cuda/lib64
USER 65532:65532
WORKDIR /home/longhaul
EXPOSE 9400
ENTRYPOINT ["longhaul-worker"]
CMD ["train"]

# The CUDA image from binaries already built on a Debian 12 host with nvcc (`cmake --preset ci`).
FROM runtime-cuda AS cuda-prebuilt
COPY prebuilt/longhaul-worker /usr/local/bin/longhaul-worker
# libcuda.so.1 is the node's driver, mounted at run time.
RUN missing="$(ldd /usr/local/bin/longhaul-worker | grep 'not found' | grep -v 'libcuda\.so' || true)"; \
    if [ -n "$missing" ]; then echo "longhaul-worker lacks runtime libraries:"; echo "$missing"; exit 1; fi

# The CUDA image built from source: what users get by default.
FROM runtime-cuda AS cuda
COPY --from=build-cuda /out/longhaul-worker /usr/local/bin/longhaul-worker
RUN missing="$(ldd /usr/local/bin/longhaul-worker | grep 'not found' | grep -v 'libcuda\.so' || true)"; \
    if [ -n "$missing" ]; then echo "longhaul-worker lacks runtime libraries:"; echo "$missing"; exit 1; fi
