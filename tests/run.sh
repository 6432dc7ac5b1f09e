#!/usr/bin/env bash
# Runs the whole test suite on a Debian 12 machine, installing what it needs first:
# as root, the Debian packages in tests/apt-packages.txt and the host set-up in
# tests/setup-host.sh (mounts, header links); always, a venv in .venv with the test extras.
# Arguments go to pytest. Without root, tests that need privileges skip and say why.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  mapfile -t packages < <(sed -e 's/#.*//' -e '/^\s*$/d' tests/apt-packages.txt | awk '{print $1}')
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  [ -x tests/setup-host.sh ] && bash tests/setup-host.sh
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
exec .venv/bin/python -m pytest "$@"
