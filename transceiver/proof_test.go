package transceiver

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rtcedge/rtcedge/internal/testsdp"
)

// TestClientUfragBounded: the pod refuses a client ufrag longer than
// maxClientUfrag, in an offer (400 bad offer, no session) as in an ICE
// restart's fragment: it would go into the USERNAME of every probe the
// pod sends, making each larger than the spoofed packet that drew it.
func TestClientUfragBounded(t *testing.T) {
	for _, n := range []int{maxClientUfrag, maxClientUfrag + 1, 256} {
		_, err := iceFragment("a=ice-ufrag:" + strings.Repeat("u", n) + "\r\na=ice-pwd:" + clientPwd + "\r\n")
		if ok := n <= maxClientUfrag; ok != (err == nil) {
			t.Errorf("ufrag of %d characters: %v", n, err)
		}
	}
	p := newPod(t, Config{})
	offer := testsdp.Offer(t)
	u := ufragRE.FindStringSubmatch(offer)
	if u == nil {
		t.Fatal("no ufrag in the offer")
	}
	long := strings.ReplaceAll(offer, "a=ice-ufrag:"+u[1], "a=ice-ufrag:"+strings.Repeat("u", 256))
	res, err := p.t.CreateSession(context.Background(), CreateRequest{Offer: long, POPs: []POPAddr{popA}})
	if !errors.Is(err, ErrBadOffer) {
		if err == nil {
			p.t.EndSession(res.ID)
		}
		t.Fatalf("an offer with a 256-character ufrag: %v, want a bad offer", err)
	}
}
