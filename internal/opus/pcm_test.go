package opus

import (
	"errors"
	"slices"
	"testing"
)

func TestPCM16LE(t *testing.T) {
	pcm := []int16{0, 1, -1, 32767, -32768, 0x1234}
	b := AppendPCM16LE(nil, pcm)
	want := []byte{0, 0, 1, 0, 0xff, 0xff, 0xff, 0x7f, 0, 0x80, 0x34, 0x12}
	if !slices.Equal(b, want) {
		t.Fatalf("AppendPCM16LE = % x, want % x", b, want)
	}
	got := make([]int16, 8)
	if n := DecodePCM16LE(append(b, 0xaa), got); n != len(pcm) || !slices.Equal(got[:n], pcm) {
		t.Fatalf("DecodePCM16LE = %d %v, want %v", n, got[:n], pcm)
	}
	if n := DecodePCM16LE(b, got[:2]); n != 2 {
		t.Fatalf("DecodePCM16LE into 2 samples wrote %d", n)
	}
}

// TestRates: the five rates libopus handles are accepted (or the stub says
// it has no libopus), anything else is refused.
func TestRates(t *testing.T) {
	for _, r := range []int{8000, 12000, 16000, 24000, 48000} {
		d, err := NewDecoder(r)
		if errors.Is(err, ErrUnavailable) {
			continue
		}
		if err != nil {
			t.Fatalf("NewDecoder(%d): %v", r, err)
		}
		d.Close()
		d.Close()
		e, err := NewEncoder(r)
		if err != nil {
			t.Fatalf("NewEncoder(%d): %v", r, err)
		}
		if e.Rate() != r || e.FrameSamples() != r/50 {
			t.Fatalf("encoder at %d: Rate %d FrameSamples %d", r, e.Rate(), e.FrameSamples())
		}
		e.Close()
		if _, err := e.Encode(make([]int16, r/50), make([]byte, MaxPacket)); !errors.Is(err, ErrClosed) {
			t.Fatalf("Encode after Close: %v", err)
		}
	}
	for _, r := range []int{0, 22050, 44100, 96000} {
		if _, err := NewDecoder(r); err == nil || errors.Is(err, ErrUnavailable) {
			t.Errorf("NewDecoder(%d): %v, want a rate error", r, err)
		}
		if _, err := NewEncoder(r); err == nil || errors.Is(err, ErrUnavailable) {
			t.Errorf("NewEncoder(%d): %v, want a rate error", r, err)
		}
	}
}
