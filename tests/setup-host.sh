#!/usr/bin/env bash
# Host set-up the integration tests need, as root; idempotent. Each part adds its own block.
set -euo pipefail

# --- trace (eBPF): kernel headers for BCC, tracefs/debugfs mounts -------------------------
# BCC compiles against /lib/modules/$(uname -r)/build. A custom kernel has no matching
# package, so Debian's headers stand in: fine for tracepoint args and uprobe registers
# (all ingero reads), wrong for kernel struct offsets (which ingero never reads).
KREL="$(uname -r)"
if [ ! -e "/lib/modules/$KREL/build/include/generated/autoconf.h" ] && [ ! -e /sys/kernel/kheaders.tar.xz ]; then
  if apt-cache show "linux-headers-$KREL" >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "linux-headers-$KREL" >/dev/null
  else
    HB="$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1 || true)"
    HC="$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1 || true)"
    if [ -n "$HB" ] && [ -n "$HC" ]; then
      mkdir -p "/lib/modules/$KREL"
      ln -sfn "$HB" "/lib/modules/$KREL/build"
      ln -sfn "$HC" "/lib/modules/$KREL/source"
    fi
  fi
fi
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing || true
mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug || true
