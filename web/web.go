// Package web holds the demo page that signaling serves at "/": a call
// button that talks to the pods' backend (the echo or a Realtime model)
// through the relays, with live WebRTC statistics and the events channel.
package web

import (
	"embed"
	"io/fs"
)

//go:embed index.html static
var files embed.FS

// FS returns the page's files, rooted so that "index.html" is at the top.
func FS() fs.FS { return files }
