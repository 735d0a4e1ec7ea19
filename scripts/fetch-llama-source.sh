#!/usr/bin/env bash
# Produce a source archive of llama.cpp for air-gapped builds and the tests, from
# the PyPI sdist of llama-cpp-python, which vendors llama.cpp at a recorded
# commit in vendor/llama.cpp:
#
#   scripts/fetch-llama-source.sh [OUTPUT_DIR]        (default: .cache/harness)
#
# Leaves in OUTPUT_DIR:
#   llama.cpp-<commit12>.tar.gz   just the llama.cpp tree, one top directory
#                                 (llama.cpp-<commit12>/), the layout the llama_cpp
#                                 role's llama_cpp_source_archive expects
#   llama.cpp-source.json         where it came from: commit, sdist, sha256
#
# Idempotent: when the archive and its record are current it does nothing, and
# a rebuild is byte-identical (sorted entries, fixed owners, gzip -n), so the
# role's build key (it hashes the archive) does not move.
# Env: PIP (default: the project's .venv pip, else python3 -m pip).
set -euo pipefail

# The pin: llama-cpp-python 0.3.36 vendors llama.cpp at this commit (its
# CHANGELOG says ggml-org/llama.cpp@0c1e57098; the sdist's git metadata,
# .git/modules/vendor/llama.cpp/HEAD, holds the full hash). 2026-10-01.
SDIST_NAME=llama-cpp-python
SDIST_VERSION=0.3.36
COMMIT=0c1e57098bba43ac29e6e3b677cdceebdd22334f
# Every entry of the archive gets the commit's date, so rebuilds are identical.
COMMIT_DATE=2026-10-01T05:44:09Z

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.cache/harness}
mkdir -p "$out"
out=$(cd "$out" && pwd)
short=${COMMIT:0:12}
archive="$out/llama.cpp-$short.tar.gz"
record="$out/llama.cpp-source.json"

if [ -f "$archive" ] && [ -f "$record" ] && grep -q "\"commit\": \"$COMMIT\"" "$record" \
  && [ "$(sha256sum "$archive" | cut -d' ' -f1)" = "$(sed -n 's/.*"sha256": "\([0-9a-f]*\)".*/\1/p' "$record")" ]; then
  echo "llama.cpp source $short is current: $archive"
  exit 0
fi

if [ -z "${PIP:-}" ]; then
  if [ -x "$root/.venv/bin/pip" ]; then PIP="$root/.venv/bin/pip"; else PIP="python3 -m pip"; fi
fi

work=$(mktemp -d /var/tmp/llama-source.XXXXXX)
trap 'rm -rf "$work"' EXIT
start=$SECONDS
sdist="$out/llama_cpp_python-$SDIST_VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  echo "fetch-llama-source: downloading the $SDIST_NAME==$SDIST_VERSION sdist"
  $PIP download -q --no-deps --no-binary :all: "$SDIST_NAME==$SDIST_VERSION" -d "$work/dl"
  mv "$work"/dl/llama_cpp_python-"$SDIST_VERSION".tar.gz "$sdist"
fi

tar -xzf "$sdist" -C "$work"
top="$work/llama_cpp_python-$SDIST_VERSION"
tree="$top/vendor/llama.cpp"
[ -f "$tree/CMakeLists.txt" ] || { echo "fetch-llama-source: $sdist has no vendor/llama.cpp/CMakeLists.txt" >&2; exit 1; }

# Check the sdist vendors the commit this script pins.
seen=$(cat "$top/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null || true)
if [ -z "$seen" ]; then
  seen=$(sed -n 's/.*ggml-org\/llama.cpp@\([0-9a-f]*\).*/\1/p' "$top/CHANGELOG.md" | head -n1)
fi
case "$COMMIT" in
  "$seen"*) ;;
  *) echo "fetch-llama-source: $SDIST_NAME $SDIST_VERSION vendors llama.cpp '$seen', not the pinned $COMMIT;" \
       "update COMMIT in $0 together with SDIST_VERSION" >&2; exit 1 ;;
esac

# Just the llama.cpp tree: without the sdist's git pointer file (it names a
# gitdir that does not exist outside the sdist).
rm -f "$tree/.git"
mv "$tree" "$work/llama.cpp-$short"
tar --sort=name --owner=0 --group=0 --numeric-owner --format=gnu --mtime="$COMMIT_DATE" \
  -C "$work" -cf - "llama.cpp-$short" | gzip -n -6 > "$work/archive.tar.gz"
mv "$work/archive.tar.gz" "$archive"
sum=$(sha256sum "$archive" | cut -d' ' -f1)
cat > "$record" <<EOF
{
  "commit": "$COMMIT",
  "archive": "$(basename "$archive")",
  "sha256": "$sum",
  "top_directory": "llama.cpp-$short",
  "origin": "PyPI sdist $SDIST_NAME==$SDIST_VERSION, vendor/llama.cpp"
}
EOF
echo "fetch-llama-source: $archive ($(du -h "$archive" | cut -f1), sha256 ${sum:0:16}...) in $((SECONDS - start)) s"
