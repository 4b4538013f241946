package membership

import (
	"bytes"
	"testing"
	"time"
)

// TestSendReachesTheNamedMember: a user message goes to the member named,
// and only a message of MaxMessage bytes or less goes at all.
func TestSendReachesTheNamedMember(t *testing.T) {
	a := newTestPool(t, "a", Meta{Role: RoleSignaling})
	b := newTestPool(t, "b", Meta{Role: RoleSignaling})
	got := make(chan []byte, 1)
	b.SetHandler(func(msg []byte) { got <- bytes.Clone(msg) })
	if _, err := b.Join([]string{a.LocalAddr().String()}); err != nil {
		t.Fatal(err)
	}
	await(t, a, "b joins", func(ms []Member) bool { _, ok := find(ms, "b"); return ok })
	if err := a.Send("b", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-got:
		if string(msg) != "hello" {
			t.Fatalf("got %q", msg)
		}
	case <-time.After(awaitTimeout):
		t.Fatal("the message did not arrive")
	}
	if err := a.Send("c", []byte("x")); err == nil {
		t.Error("sent to a member that does not exist")
	}
	if err := a.Send("b", make([]byte, MaxMessage+1)); err == nil {
		t.Error("sent an oversized message")
	}
}
