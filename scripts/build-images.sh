#!/usr/bin/env bash
# Builds longhaul's container images from docker/*.Dockerfile and writes each as an OCI archive,
# the form `podman load`, `docker load` and `ctr -n k8s.io images import` read. Users, CI and the
# tests (tests/images, the real-node suites in tests/node) all call this script.
#
#   scripts/build-images.sh [--worker cpu|cuda|none] [--no-operator] [--prebuilt BUILD_DIR]
#                           [--local-base [--refresh-base]] [--out DIR] [--engine podman|docker]
#                           [--if-changed]
#
#   --worker V        the worker variant: cuda (default for users; needs NVIDIA's apt repository
#                     at build time), cpu (built without CUDA, no CUDA library), none
#   --no-operator     skip the operator image
#   --prebuilt DIR    the fast path: pack DIR/worker/cli/longhaul-worker and
#                     DIR/operator/cli/longhaul-operator, already built on this Debian 12 host
#                     (`cmake --preset cpu` for --worker cpu), into the SAME runtime stages
#                     (targets cpu-prebuilt / cuda-prebuilt / prebuilt) instead of compiling
#                     them in the images' build stages. Without it: the full multi-stage build
#                     from the source tree (its build context is the tree less .dockerignore).
#   --local-base      use a Debian 12 base made here from Debian's archive with mmdebstrap
#                     (image localhost/longhaul-debian:12, made once and reused) instead of
#                     pulling debian:12 / debian:12-slim from a registry
#   --refresh-base    make that base again (new Debian point release or security updates)
#   --out DIR         where the archives go (default: BUILD_DIR/images with --prebuilt, else
#                     build/images)
#   --engine E        podman (default when installed) or docker (when its daemon answers)
#   --if-changed      CI: build only when docker/ (less *.md), scripts/install-deps.sh or this
#                     script changed since the last successful build on this machine (a stamp
#                     keyed by their hash under the cache folder); otherwise say so and exit 0
#
# What it produces (the real-node harness consumes exactly these; keep them stable):
#   OUT/longhaul-worker-cpu.oci.tar    image localhost/longhaul-worker:<version>-cpu
#   OUT/longhaul-worker-cuda.oci.tar   image localhost/longhaul-worker:<version>
#   OUT/longhaul-operator.oci.tar      image localhost/longhaul-operator:<version>
#   OUT/images.tsv                     one line per image built: name, archive, size in bytes
# <version> is the project(VERSION) of CMakeLists.txt (0.1.0). The images also stay in the
# engine's own store under those names (`podman run localhost/longhaul-worker:0.1.0-cpu ...`);
# the fast path and the full build use the same names, so the one that ran last holds them.
# The archive's index names the image with its full name (org.opencontainers.image.ref.name),
# so `ctr -n k8s.io images import OUT/longhaul-worker-cpu.oci.tar` registers it as
# localhost/longhaul-worker:<version>-cpu; pods use it with imagePullPolicy: Never.
# In ctest, images_test (tests/images) runs `--local-base --worker cpu --prebuilt <CPU-only
# build>` with OUT = <build>/images (CMake: LONGHAUL_IMAGES_DIR) and is the fixture
# longhaul-images: a suite that runs the images declares FIXTURES_REQUIRED longhaul-images and
# imports ${LONGHAUL_IMAGES_DIR}/longhaul-worker-cpu.oci.tar and longhaul-operator.oci.tar.
#
# Idempotent and cached: the base is made once (its tarball and image are reused), the engine's
# layer cache skips unchanged steps, and an archive is rewritten only when its image changed
# (OUT/<archive>.id holds the image ID it was saved from). Podman runs with a containers.conf of
# this script's own (CACHE/containers.conf, unless CONTAINERS_CONF is set): runc, cgroupfs and
# file-descriptor limits a container may set without CAP_SYS_RESOURCE. Builds use the host's
# network (the runtime stages install Debian packages with apt).
#
# CACHE is $LONGHAUL_CACHE_DIR, else /var/cache/longhaul when writable, else ~/.cache/longhaul.
# Exit codes: 0 built (or nothing to do), 1 a build failed, 2 bad usage or no usable engine.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

worker=cuda
operator=1
prebuilt=""
local_base=0
refresh_base=0
out=""
engine=${LONGHAUL_IMAGE_ENGINE:-}
if_changed=0

usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "build-images: $1" >&2; exit "${2:-1}"; }  # die MESSAGE [EXIT_CODE]

while (($#)); do
  case "$1" in
    --worker) worker=${2:-}; shift 2 ;;
    --no-operator) operator=0; shift ;;
    --prebuilt) prebuilt=${2:-}; shift 2 ;;
    --local-base) local_base=1; shift ;;
    --refresh-base) refresh_base=1; local_base=1; shift ;;
    --out) out=${2:-}; shift 2 ;;
    --engine) engine=${2:-}; shift 2 ;;
    --if-changed) if_changed=1; shift ;;
    -h|--help) usage ;;
    *) echo "build-images: unknown argument $1" >&2; usage ;;
  esac
done
case "$worker" in cpu|cuda|none) ;; *) die "--worker must be cpu, cuda or none, not '$worker'" 2 ;; esac

version=$(sed -n 's/^project(longhaul VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[[ -n "$version" ]] || die "no project(longhaul VERSION x.y.z) in CMakeLists.txt" 2

if [[ -n "${LONGHAUL_CACHE_DIR:-}" ]]; then cache=$LONGHAUL_CACHE_DIR
elif mkdir -p /var/cache/longhaul 2>/dev/null && [[ -w /var/cache/longhaul ]]; then cache=/var/cache/longhaul
else cache=${XDG_CACHE_HOME:-$HOME/.cache}/longhaul
fi
cache=$cache/images
mkdir -p "$cache"

# ---- the stamp for --if-changed: what the full build depends on beyond the sources CI builds ----
inputs_hash() {  # docker/ less its documentation, the dependency script and this script
  (cd "$repo" && find docker scripts/install-deps.sh scripts/build-images.sh -type f ! -name '*.md' \
     -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}
stamp=""
if ((if_changed)); then
  stamp="$cache/full-build-${worker}-$(inputs_hash).ok"
  if [[ -f "$stamp" ]]; then
    # images_test.py --if-changed reads the "; skipped" at the end of this line.
    echo "build-images: docker/, scripts/install-deps.sh and scripts/build-images.sh" \
      "unchanged since the full build of $(cat "$stamp"); skipped"
    exit 0
  fi
fi

# ---- the engine ----
if [[ -z "$engine" ]]; then
  if command -v podman >/dev/null; then engine=podman
  elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker
  else die "no container engine: install podman (scripts/install-deps.sh does) or start docker" 2
  fi
fi
case "$engine" in
  podman)
    command -v podman >/dev/null || die "podman is not installed (scripts/install-deps.sh installs it)" 2
    if [[ -z "${CONTAINERS_CONF:-}" ]]; then
      conf="$cache/containers.conf"
      wanted='# Written by scripts/build-images.sh: runc (crun refuses hybrid cgroup hierarchies),
# cgroupfs (no systemd needed), limits a container may set without CAP_SYS_RESOURCE.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"'
      if command -v runc >/dev/null; then wanted+=$'\nruntime = "runc"'; fi
      if [[ "$(cat "$conf" 2>/dev/null)" != "$wanted" ]]; then
        printf '%s\n' "$wanted" > "$conf.tmp.$$" && mv "$conf.tmp.$$" "$conf"
      fi
      export CONTAINERS_CONF=$conf
    fi
    build_flags=(--network host --layers)
    ;;
  docker)
    docker info >/dev/null 2>&1 || die "docker's daemon does not answer (docker info)" 2
    export DOCKER_BUILDKIT=1
    build_flags=(--network host)
    ;;
  *) die "--engine must be podman or docker, not '$engine'" 2 ;;
esac

image_id() { "$engine" image inspect --format '{{.Id}}' "$1" 2>/dev/null; }

# ---- the base ----
base_args=()
if ((local_base)); then
  base=localhost/longhaul-debian:12
  base_tar="$cache/debian-12-minbase.tar"
  if ((refresh_base)); then rm -f "$base_tar"; fi
  if ((refresh_base)) || [[ -z "$(image_id "$base")" ]]; then
    if [[ ! -s "$base_tar" ]]; then
      command -v mmdebstrap >/dev/null ||
        die "--local-base needs mmdebstrap (scripts/install-deps.sh installs it)" 2
      echo "build-images: making the Debian 12 base with mmdebstrap (once; kept in $base_tar)"
      # Like the debian:12-slim image: minbase, merged /usr without the usrmerge package (which
      # pulls in perl: +46 MB), no manual pages, docs or translations, Debian's archive with
      # updates and security updates.
      # shellcheck disable=SC2016  # $1 is the hook's argument (the new root), for mmdebstrap
      mmdebstrap --variant=minbase --format=tar --skip=output/dev \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --aptopt='Acquire::Languages "none"' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
        bookworm "$base_tar.tmp" \
        "deb http://deb.debian.org/debian bookworm main" \
        "deb http://deb.debian.org/debian bookworm-updates main" \
        "deb http://deb.debian.org/debian-security bookworm-security main"
      mv "$base_tar.tmp" "$base_tar"
    fi
    "$engine" import --change 'CMD ["/bin/bash"]' "$base_tar" "$base" >/dev/null
  fi
  base_args=(--build-arg "DEBIAN_IMAGE=$base" --build-arg "DEBIAN_SLIM_IMAGE=$base")
  if [[ "$engine" == podman ]]; then base_args+=(--pull=never); fi
fi

# ---- the build context ----
if [[ -n "$prebuilt" ]]; then
  [[ -d "$prebuilt" ]] || die "--prebuilt $prebuilt: no such build folder" 2
  prebuilt=$(cd "$prebuilt" && pwd)
  out=${out:-$prebuilt/images}
  # A small context of its own: the dependency script and the binaries, stripped of debug
  # information like the build stages' `install -s`.
  context="$out/context"
  mkdir -p "$context/scripts" "$context/prebuilt"
  cp -p scripts/install-deps.sh "$context/scripts/install-deps.sh"
  pack() {  # pack BINARY: strip into the context unless the copy there is already up to date
    local src=$1 dst
    dst="$context/prebuilt/$(basename "$1")"
    [[ -x "$src" ]] ||
      die "--prebuilt: $src is missing; build it first (cmake --build $prebuilt --target $(basename "$1"))" 2
    if [[ ! -f "$dst" || "$src" -nt "$dst" ]]; then
      strip -o "$dst.tmp" "$src" && touch -r "$src" "$dst.tmp" && mv "$dst.tmp" "$dst"
    fi
  }
  if [[ "$worker" != none ]]; then pack "$prebuilt/worker/cli/longhaul-worker"; fi
  if ((operator)); then pack "$prebuilt/operator/cli/longhaul-operator"; fi
  if [[ "$worker" == cpu ]] && grep -Eq '^CMAKE_CUDA_COMPILER:[A-Z]+=/' "$prebuilt/CMakeCache.txt" 2>/dev/null &&
     grep -q '^LONGHAUL_CUDA:[A-Z]*=\(ON\|AUTO\)' "$prebuilt/CMakeCache.txt"; then
    die "--worker cpu --prebuilt $prebuilt: that build compiled CUDA; use a build without it (cmake --preset cpu)" 2
  fi
else
  out=${out:-$repo/build/images}
  context=$repo
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

# ---- build, then save each image whose ID changed ----
: > "$out/images.tsv.tmp"
build_one() {  # build_one DOCKERFILE TARGET IMAGE ARCHIVE
  local dockerfile=$1 target=$2 image=$3 archive=$out/$4 started id hint
  started=$(date +%s)
  echo "build-images: $image (docker/$dockerfile, target $target, $engine)"
  "$engine" build "${build_flags[@]}" "${base_args[@]}" -f "docker/$dockerfile" \
    --target "$target" -t "$image" "$context" || {
    hint=""
    if ((!local_base)); then
      hint="; if debian:12 could not be pulled, --local-base makes the base without a registry"
    fi
    die "building $image failed (docker/$dockerfile, target $target)$hint"
  }
  id=$(image_id "$image")
  if [[ ! -s "$archive" || "$(cat "$archive.id" 2>/dev/null)" != "$id" ]]; then
    rm -f "$archive" "$archive.id"
    if [[ "$engine" == podman ]]; then
      podman save --format oci-archive -o "$archive.tmp" "$image"
    else
      docker save -o "$archive.tmp" "$image"
    fi
    mv "$archive.tmp" "$archive" && echo "$id" > "$archive.id"
  fi
  printf '%s\t%s\t%s\n' "$image" "$archive" "$("$engine" image inspect --format '{{.Size}}' "$image")" \
    >> "$out/images.tsv.tmp"
  echo "build-images: $image -> $archive ($(($(date +%s) - started)) s)"
}

suffix=""; if [[ -n "$prebuilt" ]]; then suffix="-prebuilt"; fi
case "$worker" in
  cpu) build_one worker.Dockerfile "cpu$suffix" "localhost/longhaul-worker:$version-cpu" longhaul-worker-cpu.oci.tar ;;
  cuda) build_one worker.Dockerfile "cuda$suffix" "localhost/longhaul-worker:$version" longhaul-worker-cuda.oci.tar ;;
esac
if ((operator)); then
  if [[ -n "$prebuilt" ]]; then target=prebuilt; else target=runtime; fi
  build_one operator.Dockerfile "$target" "localhost/longhaul-operator:$version" longhaul-operator.oci.tar
fi
mv "$out/images.tsv.tmp" "$out/images.tsv"
# The size table (bench/README.md): uncompressed, as a node stores it, and the archive shipped.
while IFS=$'\t' read -r image archive size; do
  printf '%s\t%s\t%s\n' "$image" "$size" "$(stat -c %s "$archive")"
done < "$out/images.tsv" |
  awk -F'\t' 'BEGIN { printf "\n%-40s %9s %12s\n", "image", "size_MiB", "archive_MiB" }
               { printf "%-40s %9.1f %12.1f\n", $1, $2 / 1048576, $3 / 1048576 }'

if [[ -n "$stamp" ]]; then date -u +%FT%TZ > "$stamp"; fi
