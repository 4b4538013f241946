// Package audiotest holds signal helpers for tests of the audio path: a
// tone generator, spectrum measures (dominant frequency, Goertzel power),
// levels (RMS, voiced-frame count), alignment of a decoded signal with its
// source, and speech made by espeak-ng. Samples are PCM16 mono, as the
// codec (internal/opus) and the Realtime protocol carry them.
//
// Every function is pure and works on the caller's slices; nothing is
// shared between calls.
package audiotest

import (
	"math"
	"math/cmplx"
	"time"
)

// Samples is the number of samples d lasts at rate.
func Samples(rate int, d time.Duration) int {
	return int(int64(rate) * int64(d) / int64(time.Second))
}

// Tone is a sine of freq Hz lasting d at rate, with peak amplitude amp as a
// fraction of full scale (0 < amp ≤ 1).
func Tone(rate int, freq, amp float64, d time.Duration) []int16 {
	pcm := make([]int16, Samples(rate, d))
	for i := range pcm {
		pcm[i] = int16(math.Round(amp * 32767 * math.Sin(2*math.Pi*freq*float64(i)/float64(rate))))
	}
	return pcm
}

// RMS is the root mean square of pcm as a fraction of full scale (a
// full-scale sine is 0.707); 0 for no samples.
func RMS(pcm []int16) float64 {
	if len(pcm) == 0 {
		return 0
	}
	var sum float64
	for _, s := range pcm {
		v := float64(s) / 32768
		sum += v * v
	}
	return math.Sqrt(sum / float64(len(pcm)))
}

// FrameRMS splits pcm into frames of frame samples (the last partial frame
// dropped) and returns each frame's RMS.
func FrameRMS(pcm []int16, frame int) []float64 {
	out := make([]float64, 0, len(pcm)/frame)
	for i := 0; i+frame <= len(pcm); i += frame {
		out = append(out, RMS(pcm[i:i+frame]))
	}
	return out
}

// VoicedFrames counts the frames of frame samples (the last partial frame
// dropped) whose RMS reaches threshold (a fraction of full scale; 0.01,
// -40 dBFS, separates speech from espeak-ng's silences).
func VoicedFrames(pcm []int16, frame int, threshold float64) int {
	n := 0
	for _, r := range FrameRMS(pcm, frame) {
		if r >= threshold {
			n++
		}
	}
	return n
}

// Goertzel is the power of pcm at freq Hz (rate samples per second),
// normalised so that a full-scale sine at freq gives about 0.25 whatever
// the length: a cheap test for one known frequency.
func Goertzel(pcm []int16, rate int, freq float64) float64 {
	if len(pcm) == 0 {
		return 0
	}
	w := 2 * math.Pi * freq / float64(rate)
	c := 2 * math.Cos(w)
	var s1, s2 float64
	for _, x := range pcm {
		s0 := float64(x)/32768 + c*s1 - s2
		s2, s1 = s1, s0
	}
	p := s1*s1 + s2*s2 - c*s1*s2
	n := float64(len(pcm))
	return p / (n * n)
}

// Spectrum is the magnitude spectrum of pcm (Hann window, zero-padded to a
// power of two); bin i is at i*rate/(2*(len-1)) Hz, the last bin at rate/2.
func Spectrum(pcm []int16) []float64 {
	n := 1
	for n < len(pcm) {
		n <<= 1
	}
	x := make([]complex128, n)
	for i, s := range pcm {
		w := 0.5 - 0.5*math.Cos(2*math.Pi*float64(i)/float64(len(pcm)))
		x[i] = complex(w*float64(s)/32768, 0)
	}
	fft(x)
	mag := make([]float64, n/2+1)
	for i := range mag {
		mag[i] = cmplx.Abs(x[i])
	}
	return mag
}

// DominantFrequency is the frequency in Hz with the most energy in pcm
// (rate samples per second), between 50 Hz and rate/2, refined between
// bins by parabolic interpolation. For speech it is the strongest
// formant or harmonic, which the tests compare between what was sent and
// what arrived. 0 for silence.
func DominantFrequency(pcm []int16, rate int) float64 {
	mag := Spectrum(pcm)
	binHz := float64(rate) / float64(2*(len(mag)-1))
	lo := max(1, int(50/binHz))
	best := -1
	for i := lo; i < len(mag)-1; i++ {
		if best < 0 || mag[i] > mag[best] {
			best = i
		}
	}
	if best < 0 || mag[best] == 0 {
		return 0
	}
	a, b, c := mag[best-1], mag[best], mag[best+1]
	off := 0.0
	if d := a - 2*b + c; d != 0 {
		off = 0.5 * (a - c) / d
	}
	return (float64(best) + off) * binHz
}

// SameDominant compares got's dominant frequency with ref's (both at
// rate): ok when within 5 %. A voice whose two strongest harmonics are
// within 3 dB of each other in ref has no stable dominant frequency (a
// codec, or a concealed packet, may tip the tie), so for one the other
// harmonic passes too.
func SameDominant(ref, got []int16, rate int) (wantHz, gotHz float64, ok bool) {
	wantHz, gotHz = DominantFrequency(ref, rate), DominantFrequency(got, rate)
	if math.Abs(gotHz-wantHz) <= 0.05*wantHz {
		return wantHz, gotHz, true
	}
	a, b := Goertzel(ref, rate, wantHz), Goertzel(ref, rate, gotHz)
	return wantHz, gotHz, min(a, b) >= max(a, b)/2
}

// fft is an in-place radix-2 FFT; len(x) must be a power of two.
func fft(x []complex128) {
	n := len(x)
	for i, j := 1, 0; i < n; i++ {
		bit := n >> 1
		for ; j&bit != 0; bit >>= 1 {
			j ^= bit
		}
		j |= bit
		if i < j {
			x[i], x[j] = x[j], x[i]
		}
	}
	for size := 2; size <= n; size <<= 1 {
		step := cmplx.Exp(complex(0, -2*math.Pi/float64(size)))
		for start := 0; start < n; start += size {
			w := complex(1, 0)
			for k := range size / 2 {
				a, b := x[start+k], w*x[start+k+size/2]
				x[start+k], x[start+k+size/2] = a+b, a-b
				w *= step
			}
		}
	}
}

// Align finds the delay of got behind ref, between 0 and maxLag samples,
// at which their cross-correlation peaks (computed by FFT, so whole
// seconds of audio align in milliseconds), and returns it with the
// normalised correlation at that delay (1 for an identical waveform, 0 for
// none). Codecs delay their output (Opus by 6.5 ms, its resampler
// included), so waveforms are compared after Align.
func Align(ref, got []int16, maxLag int) (lag int, corr float64) {
	n := 1
	for n < len(ref)+len(got) {
		n <<= 1
	}
	x, y := make([]complex128, n), make([]complex128, n)
	for i, s := range ref {
		x[i] = complex(float64(s), 0)
	}
	for i, s := range got {
		y[i] = complex(float64(s), 0)
	}
	fft(x)
	fft(y)
	// r[l] = sum ref[i]*got[i+l]: the inverse transform of conj(X)·Y,
	// done as a forward transform of its conjugate.
	for i := range x {
		x[i] = cmplx.Conj(cmplx.Conj(x[i]) * y[i])
	}
	fft(x)
	best := math.Inf(-1)
	for l := 0; l <= maxLag && l < len(got); l++ {
		if r := real(x[l]); r > best {
			lag, best = l, r
		}
	}
	return lag, Correlation(ref, got[lag:])
}

// HeardFrames is the fraction of ref's voiced frames (frame samples, RMS ≥
// threshold) whose frame in got, aligned with ref, still has at least half
// that threshold: how much of what was said arrived, allowing the codec to
// soften the edges of words by up to 6 dB. 1 when ref has no voiced frame.
func HeardFrames(ref, got []int16, frame int, threshold float64) float64 {
	voiced, heard := 0, 0
	for i := 0; i+frame <= len(ref); i += frame {
		if RMS(ref[i:i+frame]) < threshold {
			continue
		}
		voiced++
		if i+frame <= len(got) && RMS(got[i:i+frame]) >= threshold/2 {
			heard++
		}
	}
	if voiced == 0 {
		return 1
	}
	return float64(heard) / float64(voiced)
}

// Correlation is the normalised cross-correlation of a and b over their
// common length: 1 for the same waveform at any gain, 0 when unrelated.
func Correlation(a, b []int16) float64 {
	n := min(len(a), len(b))
	var ab, aa, bb float64
	for i := range n {
		x, y := float64(a[i]), float64(b[i])
		ab += x * y
		aa += x * x
		bb += y * y
	}
	if aa == 0 || bb == 0 {
		return 0
	}
	return ab / math.Sqrt(aa*bb)
}

// SNR is the signal-to-noise ratio in dB of got against ref over their
// common length, after scaling got by the least-squares gain (so a level
// change is not counted as noise).
func SNR(ref, got []int16) float64 {
	n := min(len(ref), len(got))
	var rg, gg, rr float64
	for i := range n {
		x, y := float64(ref[i]), float64(got[i])
		rg += x * y
		gg += y * y
		rr += x * x
	}
	if gg == 0 {
		return math.Inf(-1)
	}
	g := rg / gg
	var noise float64
	for i := range n {
		d := float64(ref[i]) - g*float64(got[i])
		noise += d * d
	}
	if noise == 0 {
		return math.Inf(1)
	}
	return 10 * math.Log10(rr/noise)
}

// SpectralDistance is the mean log-spectral distance in dB between ref and
// got (aligned, both at rate) over the frames of frame samples where ref
// is voiced (RMS ≥ 0.01): for each, the RMS difference of the two log
// power spectra between 100 and 4,000 Hz (where speech's formants are),
// each floored 50 dB below ref's peak in that frame. It measures what a
// perceptual codec keeps, the spectral envelope, where SNR, a waveform
// measure, punishes a codec that keeps the sound but not the phase. 0 for
// identical signals; a few dB for a good speech codec.
func SpectralDistance(ref, got []int16, rate, frame int) float64 {
	var sum float64
	n := 0
	for i := 0; i+frame <= min(len(ref), len(got)); i += frame {
		r := ref[i : i+frame]
		if RMS(r) < 0.01 {
			continue
		}
		a, b := Spectrum(r), Spectrum(got[i:i+frame])
		binHz := float64(rate) / float64(2*(len(a)-1))
		lo, hi := int(100/binHz), min(len(a)-1, int(4000/binHz))
		peak := 0.0
		for k := lo; k <= hi; k++ {
			peak = max(peak, a[k])
		}
		floor := peak * peak * 1e-5
		var d float64
		for k := lo; k <= hi; k++ {
			la := 10 * math.Log10(max(a[k]*a[k], floor))
			lb := 10 * math.Log10(max(b[k]*b[k], floor))
			d += (la - lb) * (la - lb)
		}
		sum += math.Sqrt(d / float64(hi-lo+1))
		n++
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}
