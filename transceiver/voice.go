package transceiver

import (
	"fmt"
	"io"

	"github.com/pion/interceptor"
	"github.com/pion/interceptor/pkg/report"
	"github.com/pion/rtp"
	"github.com/pion/transport/v5/packetio"
	"github.com/pion/webrtc/v4"
)

// What a voice session needs from Pion, and no more. Every session of a pod
// pays for each interceptor, timer and buffer below, so each one is here
// because an audio-only browser call uses it (docs/benchmarks.md,
// "What a voice call does not need").
//
// Interceptors: only RTCP sender and receiver reports. The browser builds
// its quality figures from them (remote-inbound-rtp roundTripTime and
// fractionLost from our receiver reports, remote-outbound-rtp from our
// sender reports). Pion's defaults add more that a voice call does not use:
//   - NACK generator and responder: Chromium offers no "nack" feedback for
//     Opus (it relies on in-band FEC), so they never bind to a stream, yet
//     the generator runs a 100 ms ticker goroutine per session.
//   - TWCC: Chromium offers transport-cc for audio too; answering it makes
//     the pod send a feedback packet every 100 ms per session (+10 % packets
//     on top of 50 pps audio) and run another 100 ms ticker, only for the
//     browser's send-side bandwidth estimate, which does not steer an
//     audio-only call's Opus bitrate. Not registering the header extension
//     leaves it out of the answer.
//   - The stats interceptor: it records every RTP packet for
//     PeerConnection.GetStats, which the pod never calls (7 % of the pod's
//     CPU at 300 sessions).
//   - Simulcast header extensions: video only.

// voiceInterceptors returns the registry every session's API uses.
func voiceInterceptors() (*interceptor.Registry, error) {
	ir := &interceptor.Registry{}
	// First, so that it is innermost: the report interceptor reads the
	// header it has parsed.
	ir.Add(headerCacheFactory{})
	recv, err := report.NewReceiverInterceptor()
	if err != nil {
		return nil, fmt.Errorf("receiver reports: %w", err)
	}
	send, err := report.NewSenderInterceptor()
	if err != nil {
		return nil, fmt.Errorf("sender reports: %w", err)
	}
	ir.Add(recv)
	ir.Add(send)
	return ir, nil
}

// headerCacheFactory makes the interceptor that parses every received RTP
// header once, into a header and attributes map reused for each packet of
// the stream. The receiver report interceptor otherwise allocates both for
// every packet it counts (interceptor.Attributes.GetRTPHeader on a nil
// map): 43 % of the bytes the pod allocated at 300 sessions, and the GC
// work that comes with them.
type headerCacheFactory struct{}

// NewInterceptor implements interceptor.Factory.
func (headerCacheFactory) NewInterceptor(string) (interceptor.Interceptor, error) {
	return &headerCache{}, nil
}

type headerCache struct{ interceptor.NoOp }

// BindRemoteStream parses the header into the stream's reused attributes
// when the reader above passed none (Pion's track reader never does). The
// attributes are valid until the next read, as the stream has one reader.
func (*headerCache) BindRemoteStream(_ *interceptor.StreamInfo, reader interceptor.RTPReader) interceptor.RTPReader {
	attrs := interceptor.Attributes{}
	var hdr *rtp.Header
	return interceptor.RTPReaderFunc(func(b []byte, a interceptor.Attributes) (int, interceptor.Attributes, error) {
		n, a, err := reader.Read(b, a)
		if err != nil || a != nil {
			return n, a, err
		}
		if hdr == nil {
			// The first packet: GetRTPHeader parses it into a new header
			// and keeps that in attrs, where later reads find it.
			hdr, err = attrs.GetRTPHeader(b[:n])
		} else {
			_, err = hdr.Unmarshal(b[:n])
		}
		if err != nil {
			// Not cached: the interceptors above parse it again and
			// report the error themselves.
			hdr = nil
			clear(attrs)
			return n, nil, nil
		}
		return n, attrs, nil
	})
}

// Buffer sizes for one Opus stream each way and a data channel of small
// JSON events.
const (
	// sctpReceiveBuffer bounds what a client can make the pod hold for its
	// data channel (Pion's default: 1 MiB). Events are small JSON messages;
	// this still takes a burst of a hundred 1 KiB events.
	sctpReceiveBuffer = 128 << 10
	// rtpReadBuffer bounds the decrypted RTP waiting for the session's
	// track reader (Pion's default: 1 MB, some 10 000 Opus packets, which
	// only a stalled reader ever fills). 64 KiB is over 2 s of audio.
	rtpReadBuffer = 64 << 10
	// rtcpReadBuffer bounds the RTCP kept for a stream (Pion's default:
	// 100 KB). The pod reads none of it (sender and receiver reports are
	// generated, not consumed), so without a small bound every call's
	// unread reports from the browser pile up until that limit: about
	// 100 KB per session after half an hour.
	rtcpReadBuffer = 4 << 10
)

// sizeForVoice sets a session SettingEngine's buffers for one voice stream
// and an events channel.
func sizeForVoice(se *webrtc.SettingEngine) {
	se.SetSCTPMaxReceiveBufferSize(sctpReceiveBuffer)
	// The events channel is detached: the session reads it with a buffer
	// sized for events (eventReadBuffer) instead of Pion's 64 KiB one per
	// channel, the largest single allocation of an idle session.
	se.DetachDataChannels()
	se.BufferFactory = func(kind packetio.BufferPacketType, _ uint32) io.ReadWriteCloser {
		b := &streamBuffer{Buffer: packetio.NewBuffer()}
		if kind == packetio.RTCPBufferPacket {
			b.SetLimitSize(rtcpReadBuffer)
		} else {
			b.SetLimitSize(rtpReadBuffer)
		}
		return b
	}
}

// streamBuffer is a packetio.Buffer as the io.ReadWriteCloser SRTP read
// streams take (what Pion builds when no BufferFactory is set). A full
// buffer drops the packet (packetio.ErrFull, which SRTP ignores).
type streamBuffer struct {
	*packetio.Buffer
}

func (b *streamBuffer) Read(p []byte) (int, error) {
	n, _, err := b.Buffer.Read(p, nil)
	return n, err
}

func (b *streamBuffer) Write(p []byte) (int, error) { return b.Buffer.Write(p, nil) }

// ReadWithAttributes and WriteWithAttributes keep packet attributes
// flowing as with Pion's own buffer.
func (b *streamBuffer) ReadWithAttributes(p []byte, a packetio.Attributes) (int, packetio.Attributes, error) {
	return b.Buffer.Read(p, a)
}

func (b *streamBuffer) WriteWithAttributes(p []byte, a packetio.Attributes) (int, error) {
	return b.Buffer.Write(p, a)
}
