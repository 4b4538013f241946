package audiotest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
)

// Speech is text spoken by espeak-ng (English, default voice) as PCM16
// mono at rate, resampled from espeak-ng's 22,050 Hz by sox. A test that
// calls it fails, rather than skips, when either tool is missing: the
// repo's scripts/test-deps.sh installs both.
func Speech(tb testing.TB, text string, rate int) []int16 {
	tb.Helper()
	for _, tool := range []string{"espeak-ng", "sox"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Fatalf("%s is not installed: run scripts/test-deps.sh (apt-get install espeak-ng sox)", tool)
		}
	}
	espeak := exec.Command("espeak-ng", "--stdout", text)
	sox := exec.Command("sox", "-t", "wav", "-", "-t", "wav", "-b", "16", "-e", "signed-integer", "-c", "1", "-r", strconv.Itoa(rate), "-")
	var err error
	if sox.Stdin, err = espeak.StdoutPipe(); err != nil {
		tb.Fatal(err)
	}
	var out, soxErr, espeakErr bytes.Buffer // one each: both write at once
	sox.Stdout, sox.Stderr, espeak.Stderr = &out, &soxErr, &espeakErr
	if err := sox.Start(); err != nil {
		tb.Fatalf("start sox: %v", err)
	}
	if err := espeak.Run(); err != nil {
		tb.Fatalf("espeak-ng: %v: %s", err, espeakErr.Bytes())
	}
	if err := sox.Wait(); err != nil {
		tb.Fatalf("sox: %v: %s", err, soxErr.Bytes())
	}
	pcm, got, err := ParseWAV(out.Bytes())
	if err != nil {
		tb.Fatalf("espeak-ng | sox output: %v", err)
	}
	if got != rate {
		tb.Fatalf("sox wrote %d Hz, want %d", got, rate)
	}
	return pcm
}

// ParseWAV reads a RIFF WAVE file of 16-bit PCM mono and returns its
// samples and rate. A data chunk whose size is unknown (0 or 0xFFFFFFFF,
// as tools writing to a pipe leave it) runs to the end of the file.
func ParseWAV(b []byte) (pcm []int16, rate int, err error) {
	if len(b) < 12 || string(b[:4]) != "RIFF" || string(b[8:12]) != "WAVE" {
		return nil, 0, errors.New("not a RIFF WAVE file")
	}
	fmtSeen := false
	for p := 12; p+8 <= len(b); {
		id, size := string(b[p:p+4]), int(binary.LittleEndian.Uint32(b[p+4:]))
		body := b[p+8:]
		switch id {
		case "fmt ":
			if size < 16 || len(body) < 16 {
				return nil, 0, errors.New("short fmt chunk")
			}
			format, channels := binary.LittleEndian.Uint16(body), binary.LittleEndian.Uint16(body[2:])
			bits := binary.LittleEndian.Uint16(body[14:])
			if (format != 1 && format != 0xFFFE) || channels != 1 || bits != 16 {
				return nil, 0, fmt.Errorf("format %d, %d channels, %d bits: want 16-bit PCM mono", format, channels, bits)
			}
			rate, fmtSeen = int(binary.LittleEndian.Uint32(body[4:])), true
		case "data":
			if !fmtSeen {
				return nil, 0, errors.New("data chunk before fmt chunk")
			}
			if size == 0 || size > len(body) {
				size = len(body)
			}
			pcm = make([]int16, size/2)
			for i := range pcm {
				pcm[i] = int16(binary.LittleEndian.Uint16(body[2*i:]))
			}
			return pcm, rate, nil
		}
		p += 8 + size + size&1
	}
	return nil, 0, errors.New("no data chunk")
}
