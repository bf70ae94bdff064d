#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The tree's C++ formatting against .clang-format (clang-format 14, Debian 12's package):
#   scripts/format.sh          checks every tracked C++ file; lists the files that drift, exits 1
#   scripts/format.sh --fix    formats them in place
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
fmt=${CLANG_FORMAT:-clang-format}
command -v "$fmt" >/dev/null 2>&1 || { echo "format: $fmt not found (apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.h' '*.cu')
if [ "${1:-}" = --fix ]; then
  "$fmt" -i "${files[@]}"
  exit 0
fi
drift=()
for f in "${files[@]}"; do
  "$fmt" --dry-run "$f" 2>&1 | grep -q 'warning:' && drift+=("$f")
done
if [ ${#drift[@]} -gt 0 ]; then
  echo "format: ${#drift[@]} of ${#files[@]} C++ files differ from .clang-format ($("$fmt" --version)):" >&2
  printf '  %s\n' "${drift[@]}" >&2
  echo "format: run scripts/format.sh --fix" >&2
  exit 1
fi
echo "format: ${#files[@]} C++ files match .clang-format"
