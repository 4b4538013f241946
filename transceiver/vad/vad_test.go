package vad

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rtcedge/rtcedge/internal/audiotest"
	"github.com/rtcedge/rtcedge/internal/opus"
)

// encode48 encodes PCM16 at 48 kHz into 20 ms Opus packets with the
// pod's encoder settings (VOIP, 32 kb/s, as a browser sends).
func encode48(tb testing.TB, pcm []int16) [][]byte {
	tb.Helper()
	enc, err := opus.NewVoIPEncoder(48000)
	if err != nil {
		tb.Fatal(err)
	}
	defer enc.Close()
	var out [][]byte
	buf := make([]byte, opus.MaxPacket)
	for i := 0; i+960 <= len(pcm); i += 960 {
		n, err := enc.Encode(pcm[i:i+960], buf)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, append([]byte(nil), buf[:n]...))
	}
	return out
}

func noise(n int, amp float64, seed uint64) []int16 {
	r := rand.New(rand.NewPCG(seed, 1))
	pcm := make([]int16, n)
	for i := range pcm {
		pcm[i] = int16(amp * 32767 * (2*r.Float64() - 1))
	}
	return pcm
}

// TestDetectorEvidence is the evidence for the edge detector's features:
// on espeak-ng speech with pauses, the share of voiced frames (by energy)
// that each feature marks voiced, and on steady noise the share of frames
// it marks voiced after the first second. The SILK VAD bit finds speech
// as well as packet size does and rejects noise that size takes for
// speech.
func TestDetectorEvidence(t *testing.T) {
	speech := audiotest.Speech(t, "Hello there. I would like to book a table for two, tomorrow at eight.", 48000)
	silence := make([]int16, 48000)
	talk := append(append(append([]int16{}, silence...), speech...), silence...)
	pk := encode48(t, talk)
	rms := audiotest.FrameRMS(talk, 960)
	size := func(p []byte) bool { return len(p) > celtVoicedBytes }
	var voiced, bit, bySize, quietBit, quiet int
	for i, p := range pk {
		if rms[i] > 0.02 {
			voiced++
			if PacketVoiced(p) {
				bit++
			}
			if size(p) {
				bySize++
			}
		} else if rms[i] < 0.001 {
			quiet++
			if PacketVoiced(p) {
				quietBit++
			}
		}
	}
	t.Logf("speech: %d voiced frames (RMS > 0.02): VAD bit %.0f %%, size > %d B %.0f %%; %d silent frames: VAD bit %.0f %%",
		voiced, 100*float64(bit)/float64(voiced), celtVoicedBytes, 100*float64(bySize)/float64(voiced), quiet, 100*float64(quietBit)/float64(max(quiet, 1)))
	if float64(bit) < 0.9*float64(voiced) {
		t.Errorf("the VAD bit marks %d of %d voiced frames", bit, voiced)
	}
	if quietBit > quiet/10 {
		t.Errorf("the VAD bit marks %d of %d silent frames", quietBit, quiet)
	}
	for _, amp := range []float64{0.01, 0.05, 0.2} {
		pn := encode48(t, noise(48000*4, amp, 7))
		var nb, ns, starts int
		var d Detector
		for _, p := range pn[50:] {
			if d.Frame(p, time.Time{}) == SpeechStarted {
				starts++
			}
		}
		for _, p := range pn[50:] { // after the encoder's first second
			if PacketVoiced(p) {
				nb++
			}
			if size(p) {
				ns++
			}
		}
		t.Logf("white noise at %.2f: VAD bit %.0f %%, size %.0f %% of frames; detector starts in 3 s: %d", amp, 100*float64(nb)/float64(len(pn)-50), 100*float64(ns)/float64(len(pn)-50), starts)
		if amp <= 0.01 && starts > 0 {
			t.Errorf("noise at %.2f started speech %d times", amp, starts)
		}
		if nb >= ns {
			t.Errorf("noise at %.2f: the VAD bit marks %d frames, size %d", amp, nb, ns)
		}
	}

	// The detector over the talk: one start, near the speech's start,
	// and one stop after it.
	var d Detector
	var starts, stops []int
	t0 := time.Unix(0, 0)
	for i, p := range pk {
		switch d.Frame(p, t0.Add(time.Duration(i)*opus.FrameDuration)) {
		case SpeechStarted:
			starts = append(starts, int(d.Onset().Sub(t0)/opus.FrameDuration))
		case SpeechStopped:
			stops = append(stops, i)
		}
	}
	t.Logf("detector: starts at frames %v, stops at %v (speech from frame 50 to %d)", starts, stops, 50+len(speech)/960)
	if len(starts) == 0 || starts[0] < 45 || starts[0] > 60 {
		t.Errorf("speech starts at frames %v, want one near 50", starts)
	}
}
