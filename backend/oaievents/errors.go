package oaievents

// The package's sentinel errors.

import "errors"

// ErrMalformed is wrapped by the errors of events that are not one JSON
// object read alike by every parser (duplicate members in any case, data
// after the value, a byte-order mark, invalid UTF-8, numbers out of
// range, nesting deeper than 32, objects over 256 members).
var ErrMalformed = errors.New("malformed event")
