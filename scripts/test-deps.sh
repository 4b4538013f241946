#!/usr/bin/env bash
# Installs what the test suite needs when it is missing: redis-server for the
# route-cache tests, Debian's chromium for the browser tests, iproute2 and
# nftables for the UDP-blocked browser test, npm for the SDK tests, and podman with
# runc for the container image tests (deploy/imagetest), espeak-ng and sox
# for the speech the audio tests send (internal/audiotest), sip-tester (SIPp)
# and baresip-core for the SIP tests with real SIP software. What the build
# needs (libopus-dev, pkg-config) comes from scripts/build-deps.sh, which the
# Makefile's test-deps target runs first. Safe to run again; does nothing
# when everything is there.
#
# Podman: rootful with host networking it needs only podman (which brings
# conmon and containers-common) and runc, the runtime the image tests pass
# explicitly; uidmap (newuidmap) and slirp4netns are what rootless podman
# needs, for runs as a non-root user.
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v gcc >/dev/null 2>&1 || need+=(gcc) # bench/relay's C forwarder
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
command -v sox >/dev/null 2>&1 || need+=(sox)
# SIPp (Debian's sip-tester) sends the SIP front malformed and
# out-of-dialog messages (sipfront's TestSIPp).
command -v sipp >/dev/null 2>&1 || need+=(sip-tester)
# The SDK tests (e2e/sdk_*_test.go) install OpenAI's JavaScript SDKs with
# npm (a Node.js 22 for them comes from the npm registry when the system's
# is older).
command -v npm >/dev/null 2>&1 || need+=(npm)
# baresip (its core package: aufile, sndfile, alsa, g711) places a phone
# call through the dev world with a WAV in and records what it hears
# (e2e TestBaresipCallsEcho).
command -v baresip >/dev/null 2>&1 || need+=(baresip-core)
# The UDP-blocked browser test (e2e TestBrowserOverTCPWithUDPBlocked):
# a network namespace with a veth pair (iproute2) whose nftables ruleset
# drops all UDP.
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
# The fast path's tests (internal/fastpath/fptest): namespaces with veth
# pairs, one end's checksum offload turned off.
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
if [ "$(id -u)" -ne 0 ]; then
	command -v newuidmap >/dev/null 2>&1 || need+=(uidmap)
	command -v slirp4netns >/dev/null 2>&1 || need+=(slirp4netns)
fi
[ ${#need[@]} -eq 0 ] && exit 0

exec "$(dirname "$0")/apt-install.sh" test-deps "${need[@]}"
