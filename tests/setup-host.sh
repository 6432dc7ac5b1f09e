#!/usr/bin/env bash
# Host set-up the integration tests need, as root; idempotent. Each part adds its own block.
set -euo pipefail
