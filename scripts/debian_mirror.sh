#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Prints the Debian archive this machine's apt is configured with, as two words: its URI and the
# keyring that signs it ("-" when the entry names none), taken from the first `deb` entry of
# /etc/apt/sources.list or /etc/apt/sources.list.d/ (one-line or deb822 format) whose suites hold
# the release's own codename (not its -security suite) with the main component. Other suites of
# the same archive (backports, deb-src of the release, unstable) are then reached through the same
# mirror, so a machine behind a mirror or a proxy keeps working and no host name is written here.
# Exits 1, saying why, when no such entry exists.
set -euo pipefail
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$codename" ] || { echo "debian_mirror: /etc/os-release names no VERSION_CODENAME" >&2; exit 1; }
shopt -s nullglob
found=$(
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    # deb [options] URI suite components...
    sed -e 's/#.*//' "$f" | awk -v c="$codename" '
      $1 == "deb" {
        key = "-"; i = 2
        if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) { if ($i ~ /signed-by=/) { k = $i; sub(/.*signed-by=/, "", k); sub(/\]$/, "", k); key = k } i++ }
                          if ($i ~ /signed-by=/) { k = $i; sub(/.*signed-by=/, "", k); sub(/\]$/, "", k); key = k } i++ }
        uri = $i; suite = $(i + 1); main = 0
        for (j = i + 2; j <= NF; j++) if ($j == "main") main = 1
        if (suite == c && main) { print uri, key; exit }
      }'
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    # deb822 stanzas separated by blank lines
    awk -v c="$codename" '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " c " ") && (" " comps " ") ~ / main /) { split(uris, u, " "); print u[1], (key == "" ? "-" : key); done = 1; exit }
        types = ""; suites = ""; comps = ""; uris = ""; key = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      { line = $0; name = line; sub(/:.*/, "", name); val = line; sub(/^[^:]*:[ \t]*/, "", val)
        if (name == "Types") types = val; else if (name == "URIs") uris = val
        else if (name == "Suites") suites = val; else if (name == "Components") comps = val
        else if (name == "Signed-By") key = val }
      END { if (!done) flush() }' "$f"
  done
)
line=$(echo "$found" | sed -n '/./{p;q}')
[ -n "$line" ] || { echo "debian_mirror: no 'deb' entry for $codename main in /etc/apt/sources.list{,.d}" >&2; exit 1; }
echo "$line"
