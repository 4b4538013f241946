//go:build !cgo || noopus

package opus

// Decoder is the stub of a build without libopus; NewDecoder returns
// ErrUnavailable and no Decoder exists.
type Decoder struct{ rate int }

// NewDecoder returns ErrUnavailable: this build has no libopus.
func NewDecoder(rate int) (*Decoder, error) {
	if err := validRate(rate); err != nil {
		return nil, err
	}
	return nil, ErrUnavailable
}

// Rate is the decoder's output rate.
func (d *Decoder) Rate() int { return d.rate }

// Decode returns ErrUnavailable.
func (d *Decoder) Decode(packet []byte, pcm []int16) (int, error) { return 0, ErrUnavailable }

// DecodeFEC returns ErrUnavailable.
func (d *Decoder) DecodeFEC(packet []byte, pcm []int16) (int, error) { return 0, ErrUnavailable }

// Conceal returns ErrUnavailable.
func (d *Decoder) Conceal(pcm []int16) (int, error) { return 0, ErrUnavailable }

// Close does nothing.
func (d *Decoder) Close() {}

// Encoder is the stub of a build without libopus; NewEncoder returns
// ErrUnavailable and no Encoder exists.
type Encoder struct{ rate int }

// NewEncoder returns ErrUnavailable: this build has no libopus.
func NewEncoder(rate int) (*Encoder, error) {
	if err := validRate(rate); err != nil {
		return nil, err
	}
	return nil, ErrUnavailable
}

// NewVoIPEncoder returns ErrUnavailable: this build has no libopus.
func NewVoIPEncoder(rate int) (*Encoder, error) { return NewEncoder(rate) }

// Rate is the encoder's input rate.
func (e *Encoder) Rate() int { return e.rate }

// FrameSamples is the number of samples of one 20 ms frame at Rate.
func (e *Encoder) FrameSamples() int { return e.rate / 50 }

// SetComplexity returns ErrUnavailable.
func (e *Encoder) SetComplexity(c int) error { return ErrUnavailable }

// Encode returns ErrUnavailable.
func (e *Encoder) Encode(pcm []int16, out []byte) (int, error) { return 0, ErrUnavailable }

// Close does nothing.
func (e *Encoder) Close() {}
