package realtime

// A call's audio format toward the server: PCM16 at the connector's rate,
// transcoded from and to the caller's Opus, or a phone call's G.711 as its
// carrier sent it (Config.G711, backend.SessionInfo.G711): appended as it
// came, and the server's G.711 deltas cut into 20 ms frames the pod sends
// as they are. No codec runs for a G.711 call.

import (
	"fmt"
	"time"

	"github.com/rtcedge/rtcedge/backend"
	"github.com/rtcedge/rtcedge/internal/opus"
	"github.com/rtcedge/rtcedge/transceiver/g711"
)

// audioFormat is a call's audio toward the server and back.
type audioFormat struct {
	rate int       // samples per second
	law  *g711.Law // nil: PCM16LE
	name string    // audio/pcmu or audio/pcma for G.711
}

// TakesG711 implements backend.G711Taker: Config.G711.
func (b *Backend) TakesG711() bool { return b.cfg.G711 }

// formatOf is the audio format of a session: its G.711, if it has one
// and the server takes it, else PCM16 at Config.Rate.
func (b *Backend) formatOf(info backend.SessionInfo) (audioFormat, error) {
	var law g711.Law
	switch info.G711 {
	case "":
		return audioFormat{rate: b.cfg.Rate}, nil
	case backend.AudioPCMU:
		law = g711.PCMU
	case backend.AudioPCMA:
		law = g711.PCMA
	default:
		return audioFormat{}, fmt.Errorf("realtime: audio format %q: want %s or %s", info.G711, backend.AudioPCMU, backend.AudioPCMA)
	}
	if !b.cfg.G711 {
		return audioFormat{}, fmt.Errorf("realtime: the server is not configured to take %s", info.G711)
	}
	return audioFormat{rate: g711.ClockRate, law: &law, name: info.G711}, nil
}

// codecs makes the Opus decoder and encoder of a PCM call; a G.711 call
// has none.
func (b *Backend) codecs(f audioFormat) (*opus.Decoder, *opus.Encoder, error) {
	if f.law != nil {
		return nil, nil, nil
	}
	dec, err := opus.NewDecoder(b.cfg.Rate)
	if err != nil {
		return nil, nil, fmt.Errorf("realtime: decoder: %w", err)
	}
	enc, err := opus.NewEncoder(b.cfg.Rate)
	if err != nil {
		dec.Close()
		return nil, nil, fmt.Errorf("realtime: encoder: %w", err)
	}
	return dec, enc, nil
}

// closeCodecs closes what codecs made.
func closeCodecs(dec *opus.Decoder, enc *opus.Encoder) {
	if dec != nil {
		dec.Close()
	}
	if enc != nil {
		enc.Close()
	}
}

// sampleBytes is the bytes of one sample in the server's audio.
func (f audioFormat) sampleBytes() int {
	if f.law != nil {
		return 1
	}
	return 2
}

// frameBytes is the bytes of one 20 ms frame of the server's audio.
func (f audioFormat) frameBytes() int {
	return f.sampleBytes() * f.rate * int(opus.FrameDuration/time.Millisecond) / 1000
}

// silence fills b with the format's silence (G.711 codes zero as 0xFF or
// 0xD5, not 0).
func (f audioFormat) silence(b []byte) {
	if f.law == nil {
		clear(b)
		return
	}
	var zero [1]int16
	code := f.law.Encode(nil, zero[:])[0]
	for i := range b {
		b[i] = code
	}
}

// gaObject is the format in a GA session (audio.input.format).
func (f audioFormat) gaObject() map[string]any {
	if f.law != nil {
		return map[string]any{"type": f.name}
	}
	return map[string]any{"type": "audio/pcm", "rate": f.rate}
}

// betaName is the format in a beta session (input_audio_format).
func (f audioFormat) betaName() string {
	switch {
	case f.law == nil:
		return "pcm16"
	case *f.law == g711.PCMA:
		return "g711_alaw"
	}
	return "g711_ulaw"
}

// audioG711 batches one packet of a G.711 call's audio as it came; its
// voice activity (for the batch size, as Audio's) is whether it decodes
// to more than quiet. mu.RLock held.
func (c *call) audioG711(payload []byte, d time.Duration) {
	payload = payload[:min(len(payload), len(c.pcm), cap(c.g711)-len(c.g711))]
	pcm := c.format.law.Decode(c.pcm[:0], payload)
	changed := c.activity(opus.Quiet(pcm), d)
	c.g711 = append(c.g711, payload...)
	c.flushFull(changed)
}
