#!/usr/bin/env bash
# Installs, with apt-get, the Debian 12 packages troupe's build, tests and demo need.
# Idempotent: packages already installed are skipped and nothing is printed for them.
# CUDA and NCCL are not installed here: the build uses them when /usr/local/cuda has them.
set -euo pipefail

PACKAGES=(
  build-essential cmake make ccache pkg-config
  libcaf-dev                 # in-process actors (CAF 0.17)
  libucx-dev                 # data plane (UCP/UCS)
  libmsgpack-cxx-dev         # call arguments, wire data
  libboost-dev               # Asio/Beast (header-only)
  libtorch-dev               # models, training (CPU)
  libopenblas0-pthread       # switches libblas.so.3 to OpenBLAS: ~30x faster matmul for libtorch
  doctest-dev                # tests
  libsqlite3-dev             # the head's store
  libssl-dev                 # HMAC of the control plane's handshake (OpenSSL 3)
  libarchive-dev             # job packages (tar)
  libelf-dev                 # the libraries a program needs, read ahead before it starts
  libcli11-dev               # CLI flags
  nlohmann-json3-dev         # JSON (HTTP bodies, metrics, bench output)
  libspdlog-dev              # logs
  libtomlplusplus-dev        # config files
  gnuplot-nox                # reward / accuracy plots
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
