#!/usr/bin/env bash
# Installs PgBouncer (the Debian package) for `deno task test:pgbouncer`, when it is missing.
# Needs root or sudo, and apt (Debian/Ubuntu). The package enables a system service; the tests do
# not use it: they start private instances (tests/kit/pgbouncer.ts).
set -euo pipefail
if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null
echo "install_pgbouncer: $(/usr/sbin/pgbouncer --version | head -n 1)"
