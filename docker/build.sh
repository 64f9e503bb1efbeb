#!/usr/bin/env bash
# Build the CPU or GPU image with whatever this machine has: docker where an engine answers,
# else podman, else buildah (Debian packages: bash .ci/install-tools.sh). `make image` and
# `make image-gpu` call this; the container tests (tests/deploy) too.
#
#   docker/build.sh cpu|gpu [TAG]          default TAG: tserve:VERSION-cpu|gpu (the k8s overlays' image)
#   docker/build.sh engine                 print the engine and the environment it runs with
#
# What it decides, each overridable:
#   TSERVE_BUILDER   docker | podman | buildah
#   PYTHON_IMAGE     python:3.11-slim-bookworm when a registry answers; otherwise a Debian
#                    bookworm image built here from Debian packages (docker/base-image.sh)
#   TORCH_INDEX_URL  where the export stage gets torch; empty = PyPI. With PIP_FIND_LINKS naming
#                    a folder that holds a torch wheel (podman/buildah), that folder is mounted
#                    into the build instead, so the build needs no torch index at all.
#   TSERVE_IMAGE_ARTEFACTS  a folder of the default models' artefacts, already exported (podman/
#                    buildah: mounted into the build as the Dockerfile's ARTEFACTS): the export
#                    stage exports only what is not current there. Empty: it exports everything.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
local_base=localhost/tserve-python:3.11-bookworm
official_base=python:3.11-slim-bookworm

pick_engine() {
    if [ -n "${TSERVE_BUILDER:-}" ]; then echo "$TSERVE_BUILDER"; return; fi
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then echo docker; return; fi
    for tool in podman buildah; do
        if command -v "$tool" >/dev/null 2>&1; then echo "$tool"; return; fi
    done
    echo "build.sh: no docker engine, podman or buildah here (bash .ci/install-tools.sh installs podman)" >&2
    exit 1
}

# podman and buildah set each container's rlimits to podman's defaults, which a nested or
# sandboxed host may forbid (the open-file hard limit, or nproc above the kernel's pid_max).
# Unless the user has a containers.conf of their own, use one with limits this host allows.
podman_conf() {
    [ -n "${CONTAINERS_CONF:-}" ] && return
    local nofile nproc pid_max
    nofile=$(ulimit -Hn)
    nproc=$(ulimit -Hu)
    pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo "$nproc")
    [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ] && nproc=$pid_max
    [ "$nofile" = unlimited ] && nofile=1048576
    mkdir -p build
    cat > build/containers.conf <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
events_logger = "file"
CONF
    export CONTAINERS_CONF=$PWD/build/containers.conf
}

registry_reachable() {
    timeout 15 "$engine" pull -q "$official_base" >/dev/null 2>&1
}

image_exists() {
    case $engine in
        buildah) buildah inspect --type image "$1" >/dev/null 2>&1 ;;
        *) "$engine" image inspect "$1" >/dev/null 2>&1 ;;
    esac
}

engine=$(pick_engine)
[ "$engine" = docker ] || podman_conf

if [ "${1:-}" = engine ]; then
    echo "ENGINE=$engine"
    echo "CONTAINERS_CONF=${CONTAINERS_CONF:-}"
    exit 0
fi

flavour=${1:?usage: docker/build.sh cpu|gpu [TAG] | engine}
case $flavour in
    cpu) dockerfile=docker/Dockerfile ;;
    gpu) dockerfile=docker/Dockerfile.gpu ;;
    *) echo "build.sh: flavour must be cpu or gpu, not $flavour" >&2; exit 2 ;;
esac
tag=${2:-tserve:$version-$flavour}

if [ -z "${PYTHON_IMAGE:-}" ]; then
    if image_exists "$official_base" || registry_reachable; then
        PYTHON_IMAGE=$official_base
    else
        image_exists "$local_base" || bash docker/base-image.sh "$engine" "$local_base"
        PYTHON_IMAGE=$local_base
    fi
fi

args=(--file "$dockerfile" --tag "$tag" --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
[ -n "${TORCH_INDEX_URL:-}" ] && args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
if [ "$engine" != docker ]; then
    # HEALTHCHECK exists only in the docker image format; host networking reaches whatever
    # proxy or mirror the host is set up for.
    args+=(--format docker --network host --layers)
    for folder in ${PIP_FIND_LINKS:-}; do
        if compgen -G "$folder/torch-*.whl" >/dev/null; then
            args+=(--volume "$(realpath "$folder"):/wheels:ro" --build-arg TORCH_WHEELS=/wheels)
            break
        fi
    done
    if [ -n "${TSERVE_IMAGE_ARTEFACTS:-}" ]; then
        args+=(--volume "$(realpath "$TSERVE_IMAGE_ARTEFACTS"):/seed:ro" --build-arg ARTEFACTS=/seed)
    fi
elif [ -n "${TSERVE_IMAGE_ARTEFACTS:-}" ]; then
    echo "build.sh: docker mounts no folder into a build: TSERVE_IMAGE_ARTEFACTS unused, the build exports" >&2
fi

echo "build.sh: $engine building $tag from $dockerfile on $PYTHON_IMAGE"
start=$(date +%s)
case $engine in
    buildah) buildah bud "${args[@]}" . ;;
    *) "$engine" build "${args[@]}" . ;;
esac
size=$("$engine" image inspect --format '{{.Size}}' "$tag" 2>/dev/null || echo '?')
echo "build.sh: built $tag in $(( $(date +%s) - start )) s, $size bytes"
