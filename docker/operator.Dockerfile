# syntax=docker/dockerfile:1.7
# longhaul-operator: the TrainingJob controller. No CUDA: built and run on plain Debian 12.
#
#   docker build -f docker/operator.Dockerfile -t longhaul-operator:0.1.0 .
#   (deployed by charts/longhaul; the chart runs it as UID 65532 with a read-only root)
#
# The build stage runs the same scripts/install-deps.sh and CMake `ci` preset as CI; the runtime
# stage is Debian 12 slim with only the shared libraries from `install-deps.sh --runtime operator`. The
# `prebuilt` target is the same runtime stage with the binary taken from the build context's
# prebuilt/ folder (scripts/build-images.sh --prebuilt; what the tests use). The Debian base
# images are build arguments (the tests pass one made locally with mmdebstrap).

ARG DEBIAN_IMAGE=debian:12
ARG DEBIAN_SLIM_IMAGE=debian:12-slim

# ---------------------------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh --build && rm -rf /var/lib/apt/lists/*

COPY . .
RUN --mount=type=cache,target=/root/.cache/ccache \
    cmake --preset ci -DLONGHAUL_CUDA=OFF \
 && cmake --build --preset ci --target longhaul-operator \
 && install -D -m 0755 -s build/ci/operator/cli/longhaul-operator /out/longhaul-operator

# ---------------------------------------------------------------------------------------------
FROM ${DEBIAN_SLIM_IMAGE} AS runtime-base
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh --runtime operator \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /tmp/install-deps.sh \
 && useradd --uid 65532 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin longhaul
USER 65532:65532
# /metrics and /healthz + /readyz (--metrics-port, --health-port).
EXPOSE 8080 8081
ENTRYPOINT ["longhaul-operator"]

# From a binary already built on a Debian 12 host (the build context holds prebuilt/).
FROM runtime-base AS prebuilt
COPY prebuilt/longhaul-operator /usr/local/bin/longhaul-operator
RUN missing="$(ldd /usr/local/bin/longhaul-operator | grep 'not found' || true)"; \
    if [ -n "$missing" ]; then echo "longhaul-operator lacks runtime libraries:"; echo "$missing"; exit 1; fi

# Built from source: what users get by default.
FROM runtime-base AS runtime
COPY --from=build /out/longhaul-operator /usr/local/bin/longhaul-operator
RUN missing="$(ldd /usr/local/bin/longhaul-operator | grep 'not found' || true)"; \
    if [ -n "$missing" ]; then echo "longhaul-operator lacks runtime libraries:"; echo "$missing"; exit 1; fi
