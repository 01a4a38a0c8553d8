package runnertest

import (
	"context"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func recv(t *testing.T, c <-chan time.Time) (time.Time, bool) {
	t.Helper()
	select {
	case v := <-c:
		return v, true
	default:
		return time.Time{}, false
	}
}

func TestTimersFireWhenStepped(t *testing.T) {
	c := NewClock(t0)
	a := c.NewTimer(2 * time.Second)
	b := c.NewTimer(time.Second)
	if got := c.Armed(); len(got) != 2 || !got[0].Equal(t0.Add(time.Second)) {
		t.Fatalf("Armed = %v", got)
	}
	c.Step(time.Second)
	if v, ok := recv(t, b.C()); !ok || !v.Equal(t0.Add(time.Second)) {
		t.Fatalf("b fired %v %v, want at +1s", v, ok)
	}
	if _, ok := recv(t, a.C()); ok {
		t.Fatal("a fired early")
	}
	c.Step(time.Hour)
	if v, ok := recv(t, a.C()); !ok || !v.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("a fired %v %v, want its deadline +2s", v, ok)
	}
	if len(c.Armed()) != 0 || !c.Now().Equal(t0.Add(time.Hour+time.Second)) {
		t.Fatalf("after firing: armed %v, now %v", c.Armed(), c.Now())
	}
}

func TestStopAndResetDropUnreadValues(t *testing.T) {
	c := NewClock(t0)
	tm := c.NewTimer(time.Second)
	c.Step(time.Second) // fired, value unread
	if tm.Stop() {
		t.Error("Stop of a fired timer reported it running")
	}
	if _, ok := recv(t, tm.C()); ok {
		t.Error("value from before Stop was received")
	}
	if tm.Reset(time.Second) {
		t.Error("Reset of a stopped timer reported it running")
	}
	if !tm.Reset(3 * time.Second) {
		t.Error("Reset of a running timer reported it stopped")
	}
	c.Step(2 * time.Second)
	if _, ok := recv(t, tm.C()); ok {
		t.Error("fired at the deadline before Reset")
	}
	c.Step(time.Second)
	if _, ok := recv(t, tm.C()); !ok {
		t.Error("did not fire at the deadline after Reset")
	}
}

func TestWaitArmed(t *testing.T) {
	c := NewClock(t0)
	want := t0.Add(5 * time.Second)
	go func() { c.NewTimer(5 * time.Second) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitArmed(ctx, want); err != nil {
		t.Fatal(err)
	}
	expired, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := c.WaitArmed(expired, t0.Add(time.Minute)); err == nil {
		t.Fatal("WaitArmed for a deadline nobody armed returned nil")
	}
}
