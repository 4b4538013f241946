package transceiver

// G.711 passthrough for phone calls (docs/sip.md, "Passthrough"): when the
// backend takes G.711 as it is (backend.G711Taker: the Realtime connector
// to a server that speaks audio/pcmu and audio/pcma), a call's carrier
// payloads go to it untouched and the backend's G.711 reply goes onto the
// RTP stream as it came, paced like any reply. The pod then runs no codec
// for the call: no G.711 decode, no Opus encode or decode, no resampling.
// The caller's credit (intake.go), the sequence window and the pacer's
// bounds hold as for a transcoded call; the edge's VAD, which reads Opus,
// does not run (a backend that takes G.711 has its own turn detection).

import (
	"errors"
	"fmt"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/opus"
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// maxPassPayload bounds the caller audio one RTP packet gives a
// passthrough call's backend: 100 ms, as the transcoding path hears.
const maxPassPayload = g711.ClockRate / 10

// callComplexity is the Opus complexity a transcoded call's audio is
// coded at for its backend: narrowband speech from a telephone network
// loses nothing audible at 1, and the encoder at a browser's 9 was most of
// a transcoded call's CPU (BenchmarkCallPacket). The encoder stays SILK
// (VoIP), whose voice-activity flag the edge's VAD and the connector read.
const callComplexity = 1

// errReplyTooLong: a passthrough reply frame longer than one RTP packet
// of the call carries (120 ms).
var errReplyTooLong = errors.New("reply frame longer than 120 ms")

// g711Format is the backend.SessionInfo.G711 of a call whose carrier
// speaks law: its format if the pod's backend takes G.711, else "".
func (t *Transceiver) g711Format(law g711.Law) string {
	if gt, ok := t.cfg.Backend.(backend.G711Taker); !ok || !gt.TakesG711() {
		return ""
	}
	if law == g711.PCMA {
		return backend.AudioPCMA
	}
	return backend.AudioPCMU
}

// codecs readies the call's audio: passthrough when the backend takes the
// carrier's law (its format returned, no codec made), else the narrowband
// Opus encoder and decoder that transcode. Before the backend opens.
func (c *rtpCall) codecs() (format string, err error) {
	if format = c.t.g711Format(c.offer.law); format != "" {
		c.pass = true
		return format, nil
	}
	if c.enc, err = opus.NewVoIPEncoder(g711.ClockRate); err != nil {
		return "", fmt.Errorf("call encoder: %w", err)
	}
	if err = c.enc.SetComplexity(callComplexity); err != nil {
		return "", fmt.Errorf("call encoder: %w", err)
	}
	if c.dec, err = opus.NewDecoder(g711.ClockRate); err != nil {
		return "", fmt.Errorf("call decoder: %w", err)
	}
	return "", nil
}

// passIn hands the backend one packet's G.711 as the carrier sent it (up
// to maxPassPayload); inMu held.
func (c *rtpCall) passIn(payload []byte) {
	if len(payload) > maxPassPayload {
		payload = payload[:maxPassPayload] // longer than 100 ms: the rest is not heard
	}
	if len(payload) > 0 {
		c.handler.Audio(payload, g711Sample*time.Duration(len(payload)))
	}
}

// decodeReply decodes one reply frame into outPCM (samples returned); a
// passthrough call's frame is G.711 already and is only checked to fit
// one packet. outMu held.
func (c *rtpCall) decodeReply(payload []byte) (int, error) {
	if !c.pass {
		return c.dec.Decode(payload, c.outPCM)
	}
	if len(payload) > cap(c.outBuf)-c.outHdr.MarshalSize() {
		return 0, errReplyTooLong
	}
	return len(payload), nil
}
