#!/usr/bin/env bash
# Installs what building rtcedge needs beyond Go when it is missing: a C
# compiler and libopus-dev (internal/opus links libopus through
# cgo; docs/codec.md). Safe to run again; does nothing when everything is
# there. A build without them: `go build -tags noopus` (or CGO_ENABLED=0)
# gives a binary whose Realtime backend reports the codec unavailable.
set -euo pipefail

need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
# The header and the static library the image links (libopus.a).
[ -r /usr/include/opus/opus.h ] && compgen -G '/usr/lib/*/libopus.a' >/dev/null || need+=(libopus-dev)
[ ${#need[@]} -eq 0 ] && exit 0

exec "$(dirname "$0")/apt-install.sh" build-deps "${need[@]}"
