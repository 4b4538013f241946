// Package imagetest holds the tests that build the rtcedge container image
// (Containerfile, scripts/build-image.sh) and run it: every role starts in a
// container from the image with the configs of deploy/examples, a real call
// goes global relay -> cluster relay -> transceiver -> echo and back, and
// SIGTERM drains each container to a clean exit. A second test runs
// `rtcedge dev -backend ref` from the image and places a call through the
// Realtime connector (libopus linked into the static binary) to the
// reference server.
//
// The containers run under podman with runc and the cgroupfs cgroup
// manager, host networking, explicit ulimits below the host's hard limits,
// a read-only root file system, no capabilities and no new privileges — the
// way the Kubernetes modules in terraform/ run them. scripts/test-deps.sh
// installs podman and runc; without podman the tests fail saying so.
//
// RTCEDGE_TEST_IMAGE names an image to test instead of building one (CI can
// build once with `make image` and pass the tag).
package imagetest
