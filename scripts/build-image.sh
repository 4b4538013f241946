#!/usr/bin/env bash
# Builds the rtcedge container image (Containerfile) with podman, or docker
# when podman is not installed. The image is tagged $IMAGE, by default
# rtcedge:$VERSION with VERSION from `git describe --tags --always --dirty`;
# the Terraform modules' image variables follow the same scheme
# (<repository>:<version>, see docs/deploy.md).
#
# Environment: VERSION, IMAGE (full reference), IMAGE_REPO (default rtcedge),
# ENGINE (podman or docker), CA_BUNDLE (default the host's
# /etc/ssl/certs/ca-certificates.crt), GO (default go), CONTEXT_DIR (where
# the build context is staged, default bin/image).
# Prints the image reference on the last line of its output.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
IMAGE_REPO=${IMAGE_REPO:-rtcedge}
IMAGE=${IMAGE:-$IMAGE_REPO:$VERSION}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
SOURCE=${SOURCE:-https://github.com/rtcedge/rtcedge}
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)

if [ -z "${ENGINE:-}" ]; then
	if command -v podman >/dev/null 2>&1; then
		ENGINE=podman
	elif command -v docker >/dev/null 2>&1; then
		ENGINE=docker
	else
		echo "build-image: neither podman nor docker is installed; run scripts/test-deps.sh (installs podman) or install one" >&2
		exit 1
	fi
fi
if [ ! -r "$CA_BUNDLE" ]; then
	echo "build-image: no CA bundle at $CA_BUNDLE (install ca-certificates or set CA_BUNDLE)" >&2
	exit 1
fi

# libopus and a C compiler: the binary links libopus (internal/opus).
./scripts/build-deps.sh

# The build context holds only what the image needs.
ctx=${CONTEXT_DIR:-bin/image}
rm -rf "$ctx"
mkdir -p "$ctx"
# A static binary with cgo: libopus.a and glibc linked in, so the image
# stays FROM scratch. netgo and osusergo keep the resolver and user lookups
# in Go (static glibc cannot load their NSS modules); docs/codec.md.
CGO_ENABLED=1 "$GO" build -trimpath -tags netgo,osusergo \
	-ldflags "-s -w -linkmode external -extldflags -static" -o "$ctx/rtcedge" ./cmd/rtcedge
if ldd "$ctx/rtcedge" >/dev/null 2>&1; then
	echo "build-image: $ctx/rtcedge is dynamically linked; the image has no libc" >&2
	exit 1
fi
cp "$CA_BUNDLE" "$ctx/ca-certificates.crt"
cp deploy/image/passwd deploy/image/group "$ctx/"

args=(build --file Containerfile --tag "$IMAGE"
	--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION"
	--build-arg "CREATED=$CREATED" --build-arg "SOURCE=$SOURCE")
if [ "$ENGINE" = podman ]; then
	# Manifest annotations as well as the config labels the Containerfile
	# sets; no intermediate layers (each would stay behind as an image).
	args+=(--layers=false
		--annotation "org.opencontainers.image.version=$VERSION"
		--annotation "org.opencontainers.image.revision=$REVISION"
		--annotation "org.opencontainers.image.source=$SOURCE")
fi
"$ENGINE" "${args[@]}" "$ctx" >&2
echo "$IMAGE"
