#!/usr/bin/env bash
# The images' PYTHON_IMAGE where no registry is reachable: Debian bookworm's Python 3.11 (the
# version python:3.11-slim-bookworm carries) built from Debian packages with mmdebstrap and
# imported into podman's or docker's image store.
#
#   docker/base-image.sh ENGINE IMAGE      e.g. docker/base-image.sh podman localhost/tserve-python:3.11-bookworm
#
# The host's extra CA certificates (/usr/local/share/ca-certificates) go into the image: a build
# behind a TLS-inspecting proxy must trust what the host trusts to reach PyPI. Debian marks its
# Python EXTERNALLY-MANAGED; the images install into their own virtualenvs and a scratch export
# stage, so the marker is removed as the official python images have none.
set -euo pipefail

engine=${1:?usage: base-image.sh ENGINE IMAGE}
image=${2:?usage: base-image.sh ENGINE IMAGE}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates,passwd \
    --customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/" 2>/dev/null || true' \
    --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$work/rootfs.tar" "$mirror"

# pip inside the images reads the system bundle (which now holds the host's CAs), not certifi's.
"$engine" import \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$work/rootfs.tar" "$image" >/dev/null
echo "base-image: $image ($("$engine" image inspect --format '{{.Size}}' "$image") bytes)"
