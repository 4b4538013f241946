#!/usr/bin/env bash
# apt-install.sh WHO PACKAGE...: installs Debian packages with apt-get (sudo
# when not root) for build-deps.sh and test-deps.sh, or says what to
# install where apt-get is missing. WHO names the caller in its messages.
set -euo pipefail
who=$1
shift
if [ "$(id -u)" -ne 0 ]; then
	SUDO=sudo
else
	SUDO=
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "$who: missing $*; install them with your package manager" >&2
	exit 1
fi
echo "$who: installing $* with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
