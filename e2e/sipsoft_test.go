// The helpers of the tests that drive real SIP software (baresip): its
// WAV input and the ports it listens on. Outside baresip_test.go, which
// -race leaves out, since the DTMF test runs under it too.

package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
)

// wav is pcm as a mono 16-bit WAV file.
func wav(pcm []int16, rate int) []byte {
	var b bytes.Buffer
	le := binary.LittleEndian
	b.WriteString("RIFF")
	_ = binary.Write(&b, le, uint32(36+2*len(pcm)))
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(rate), uint32(2 * rate), uint16(2), uint16(16)} {
		_ = binary.Write(&b, le, v)
	}
	b.WriteString("data")
	_ = binary.Write(&b, le, uint32(2*len(pcm)))
	_ = binary.Write(&b, le, pcm)
	return b.Bytes()
}

// freePort returns a loopback port that was free a moment ago for both
// TCP (bound without SO_REUSEADDR) and UDP, for a program that listens on
// both and picks no port itself (baresip's sip_listen, ctrl_tcp). It is
// below the kernel's ephemeral range: a port 0 from that range can be the
// local port of a connection another test made or left in TIME_WAIT, which
// baresip's TCP listener then cannot bind (it failed so once, with 670 of
// them on the machine).
func freePort(t *testing.T) int {
	t.Helper()
	noReuse := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 0)
		}); err != nil {
			return err
		}
		return serr
	}}
	for range 200 {
		port := 20000 + rand.IntN(10000) // below rtp_ports 31000-31999
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		ln, err := noReuse.Listen(context.Background(), "tcp4", addr)
		if err != nil {
			continue
		}
		c, err := net.ListenPacket("udp4", addr)
		ln.Close()
		if err != nil {
			continue
		}
		c.Close()
		return port
	}
	t.Fatal("no loopback port free for both TCP and UDP in 20000-29999 after 200 tries")
	return 0
}
