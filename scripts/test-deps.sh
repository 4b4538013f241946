#!/usr/bin/env bash
# Installs what the test suite needs when it is missing: redis-server for the
# route-cache tests and Debian's chromium for the browser tests. Safe to run
# again; does nothing when everything is there.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	SUDO=sudo
else
	SUDO=
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "test-deps: missing ${need[*]}; install them with your package manager" >&2
	exit 1
fi
echo "test-deps: installing ${need[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
