package routecache

import "errors"

// Sentinel errors returned (wrapped with context) by this package. Callers
// test for them with errors.Is. Failures of individual stores and lookups are
// never returned: they are counted (see Stats and the metrics).
var (
	// ErrInvalidConfig means a Config failed validation: a negative or
	// zero-after-defaults size, rate or duration.
	ErrInvalidConfig = errors.New("routecache: invalid config")

	// ErrUnsupportedURL is returned by Open for a URL it cannot turn into a
	// Redis client (an unknown scheme or malformed options).
	ErrUnsupportedURL = errors.New("routecache: unsupported URL")

	// ErrRunning is returned by Run when the cache's workers already run:
	// a cache has one set of workers at a time.
	ErrRunning = errors.New("routecache: already running")

	// ErrClosed is returned by Flush after Close.
	ErrClosed = errors.New("routecache: closed")

	// errBadValue means a stored value is not a route encoding; such a
	// lookup counts as an error, never as a hit.
	errBadValue = errors.New("routecache: malformed value")
)
