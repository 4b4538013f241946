// Package soak holds the soak and chaos run, `make soak` (build tag soak,
// so `make test` leaves it out): calls through the dev world at production
// gossip timings, with real Redis, while cluster relays, global relay
// replicas, Redis and one whole POP are killed and restarted on a
// schedule; at the end it reports per-call loss and gaps, the loss outside
// the injected faults, and leaks. See docs/benchmarks.md.
package soak
