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
  # Slurm 25.11 beside Debian's 22.05, for the pyslurm tests: built once from the vendored
  # source into a prefix that later runs reuse (tests/slurm25/build.sh); skipped without it.
  # The build (5-7 min on two cores) runs in the background at the lowest priority while the
  # suite runs: the first test that needs it waits for it and installs its pyslurm wheel
  # (tests/integration/slurm/slurm25.py). After `exec` below the build is pytest's child.
  slurm25_tarball=${INGERO_SLURM25_TARBALL:-../shared/vendor/slurm-25.11.7.tar.xz}
  slurm25_prefix=${INGERO_SLURM25_PREFIX:-/opt/slurm-25.11}
  if [ -f "$slurm25_tarball" ]; then
    mkdir -p "$(dirname "$slurm25_prefix")"
    nice -n 19 bash tests/slurm25/build.sh "$slurm25_tarball" "$slurm25_prefix" \
      >"$slurm25_prefix.build.log" 2>&1 &
    export INGERO_SLURM25_BUILD_PID=$! INGERO_SLURM25_BUILD_LOG=$slurm25_prefix.build.log
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# Debian sid's CPython 3.14 for the stack tests, downloaded and verified once into the
# user's cache (the tests themselves reach nothing off the host); without it they skip.
"$PY" -m tests.python314.fetch || echo "CPython 3.14 stack tests will skip" >&2
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
# pyslurm only where Slurm 25.11 was built: it cannot even be built without it. A build
# still running installs it later (above); an earlier run's build, now.
slurm25_wheel=$(ls "${INGERO_SLURM25_PREFIX:-/opt/slurm-25.11}"/wheels/pyslurm-*.whl 2>/dev/null | head -1 || true)
if [ -n "$slurm25_wheel" ] && [ -z "${INGERO_SLURM25_BUILD_PID:-}" ]; then
  .venv/bin/pip install -q --disable-pip-version-check --no-deps "$slurm25_wheel"
fi
# The whole suite (no test path given, as CI runs it) in three pytest processes side by
# side: the unit tests (CPU-bound, touching nothing host-wide); tests/integration/systemd,
# whose systemd hosts live in namespaces of their own and mostly wait on apt, Ansible and
# unit start-ups; and the rest of tests/integration, which mostly waits on the daemons it
# starts. The other two's output follows the main part's, and any failing fails the run.
for arg in "$@"; do
  case $arg in -*) ;; *) exec .venv/bin/python -m pytest "$@" ;; esac
done
unit_log=$(mktemp)
systemd_log=$(mktemp)
.venv/bin/python -m pytest -p no:cacheprovider "$@" tests/unit >"$unit_log" 2>&1 &
unit_pid=$!
.venv/bin/python -m pytest -p no:cacheprovider "$@" tests/integration/systemd >"$systemd_log" 2>&1 &
systemd_pid=$!
set +e
.venv/bin/python -m pytest "$@" tests/integration --ignore=tests/integration/systemd
integration_rc=$?
wait "$systemd_pid"
systemd_rc=$?
wait "$unit_pid"
unit_rc=$?
echo "==== tests/integration/systemd"
cat "$systemd_log"
echo "==== tests/unit"
cat "$unit_log"
rm -f "$unit_log" "$systemd_log"
for rc in "$integration_rc" "$systemd_rc" "$unit_rc"; do
  [ "$rc" -ne 0 ] && exit "$rc"
done
exit 0
