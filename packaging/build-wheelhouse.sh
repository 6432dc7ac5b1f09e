#!/usr/bin/env bash
# Build the wheelhouse an offline install needs: the ingero wheel plus a wheel for every
# dependency, for the Python that runs it (CPython 3.11 on Debian 12).
#   packaging/build-wheelhouse.sh [DIR]      (default build/wheelhouse)
# Also writes DIR/../ingero-wheelhouse-<version>.tar, the same wheels as one file (what the
# Ansible roles copy to each host; stable ordering and times, so copying it is idempotent).
# The dependency wheels are cached: they are fetched again only when pyproject.toml's
# dependency list changes. The ingero wheel is always rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-build/wheelhouse}")
py=${PYTHON:-/usr/bin/python3}
mkdir -p "$out"

deps=$("$py" - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
PY
)
stamp="$out/.deps.sha256"
want=$(printf '%s\n' "$deps" | sha256sum | cut -d' ' -f1)
rm -f "$out"/ingero-*.whl
"$py" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$out" . >&2
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  mapfile -t reqs <<<"$deps"
  "$py" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$out" "${reqs[@]}" >&2
  echo "$want" > "$stamp"
fi
# prove the set is complete: resolve ingero from the wheelhouse alone
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$py" -m pip download --quiet --disable-pip-version-check --no-index --find-links "$out" \
  --dest "$tmp" ingero >&2
wheel=$(ls "$out"/ingero-*.whl)
version=$(basename "$wheel" | cut -d- -f2)
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --exclude=.deps.sha256 \
  -C "$out" -cf "$(dirname "$out")/ingero-wheelhouse-$version.tar" .
echo "$wheel"
