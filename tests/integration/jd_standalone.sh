#!/bin/bash
# Runs a standalone systemd-journald (no systemd as PID 1) in a private mount namespace,
# runs "$@" inside that namespace (writers and journalctl must run there), then stops it.
# Adapted from the lab recipe; used through tests/integration/journald_harness.py.
set -euo pipefail
if [[ "${1:-}" != __inner ]]; then
  exec unshare --mount --propagation private -- "$0" __inner "$@"
fi
shift
mkdir -p /run/systemd /run/log /var/log/journal
mount -t tmpfs -o mode=755 jd-run /run/systemd
mount -t tmpfs -o mode=755 jd-log /run/log
mount -t tmpfs -o mode=2755 jd-var /var/log/journal
mkdir -p /run/systemd/journal
# RAM only, no kernel ring buffer import, no rate limit, nothing forwarded to the host.
printf '[Journal]\nStorage=volatile\nReadKMsg=no\nRateLimitIntervalSec=0\nForwardToSyslog=no\nForwardToWall=no\n' \
  > /run/systemd/journald.test.conf
mount --bind /run/systemd/journald.test.conf /etc/systemd/journald.conf
/lib/systemd/systemd-journald &
jpid=$!
for _ in $(seq 250); do [[ -S /run/systemd/journal/socket ]] && break; sleep 0.02; done
if [[ ! -S /run/systemd/journal/socket ]]; then
  echo "journald did not come up" >&2; kill "$jpid"; exit 1
fi
rc=0; "$@" || rc=$?
kill -TERM "$jpid"; wait "$jpid" || true
exit $rc
