#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetches the headers of the newest Kokkos Debian packages (libkokkos-dev from Debian unstable:
# Kokkos 5.x, OpenMP configuration, C++20) into a cache, for the compile-only checks that pmt's
# headers build against a current Kokkos on the host and on Kokkos::Cuda (tests/kokkos_next/).
# Its compiled library targets a newer glibc than Debian 12's, so nothing is linked against it.
#
# apt-get downloads the package by name with a private package list (the machine's own apt
# sources are not touched). Idempotent; prints `KOKKOS_NEXT_INCLUDE=<dir>` on its last line.
# PMT_KOKKOS_NEXT=off skips it (prints an empty directory: the checks are then not registered).
set -euo pipefail

log() { echo "[pmt kokkos-next] $*" >&2; }
if [ "${PMT_KOKKOS_NEXT:-on}" = off ]; then
  log "PMT_KOKKOS_NEXT=off: no Kokkos-next compile checks"
  echo "KOKKOS_NEXT_INCLUDE="
  exit 0
fi
CACHE=${PMT_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pmt}
DIR="$CACHE/kokkos-next"
if [ -f "$DIR/.pmt-complete" ]; then
  echo "KOKKOS_NEXT_INCLUDE=$DIR/include"
  exit 0
fi

log "fetching libkokkos-dev from Debian unstable into $DIR"
apt_dir=$(mktemp -d)
trap 'rm -rf "$apt_dir"' EXIT
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" \
  >"$apt_dir/sources.list"
apt_opts=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o APT::Architectures::=amd64
          -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update -qq >"$apt_dir/update.log" 2>&1 || { cat "$apt_dir/update.log" >&2; exit 1; }
(cd "$apt_dir" && apt-get "${apt_opts[@]}" download -qq libkokkos-dev >download.log 2>&1) \
  || { cat "$apt_dir/download.log" >&2; exit 1; }
rm -rf "$DIR" && mkdir -p "$DIR/root"
dpkg-deb -x "$apt_dir"/libkokkos-dev_*.deb "$DIR/root"
[ -f "$DIR/root/usr/include/kokkos/Kokkos_Core.hpp" ] || { log "libkokkos-dev holds no Kokkos_Core.hpp"; exit 1; }
ln -s root/usr/include/kokkos "$DIR/include"
basename "$apt_dir"/libkokkos-dev_*.deb >"$DIR/package"
touch "$DIR/.pmt-complete"
log "Kokkos $(sed -n 's/^#define KOKKOS_VERSION \([0-9]*\)$/\1/p' "$DIR/include/KokkosCore_config.h") headers in $DIR/include"
echo "KOKKOS_NEXT_INCLUDE=$DIR/include"
