package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/tap"
)

// syncBuffer collects output from many goroutines (kproxy's logs, the
// tap's output) for the test to read.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *syncBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitLines polls buf until it holds n lines.
func waitLines(t *testing.T, buf *syncBuffer, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := strings.TrimRight(buf.String(), "\n")
		var lines []string
		if s != "" {
			lines = strings.Split(s, "\n")
		}
		if len(lines) >= n {
			return lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d lines, want %d:\n%s", len(lines), n, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startTapServer serves a real Tap's admin API and returns it with a
// function feeding it events.
func startTapServer(t *testing.T) (*httptest.Server, func(groupstate.Event)) {
	t.Helper()
	tp, err := tap.New(context.Background(), tap.Config{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(tap.NewHTTPHandler(tap.HTTPConfig{Tap: tp}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		_ = tp.Shutdown(context.Background())
	})
	return srv, tp.OnEvent
}

func TestTapCommandPrintsEvents(t *testing.T) {
	srv, send := startTapServer(t)
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	m := &groupstate.Member{MemberID: "m-1", ClientID: "billing-app", ClientHost: "10.1.2.3", InstanceID: "pod-7"}
	send(groupstate.Event{Time: at, Kind: groupstate.EventMemberJoined, Group: "orders", Member: m})
	send(groupstate.Event{Time: at, Kind: groupstate.EventRebalanceStarted, Group: "orders", Generation: 4, Cause: groupstate.CauseMemberJoined, Member: m})
	send(groupstate.Event{Time: at, Kind: groupstate.EventMemberJoined, Group: "other", Member: m})

	for _, tc := range []struct {
		name  string
		opts  tapOptions
		check func(t *testing.T, lines []string)
		n     int
	}{
		{"human", tapOptions{admin: srv.URL}, func(t *testing.T, lines []string) {
			l := lines[1]
			for _, want := range []string{at.Local().Format("15:04:05.000"), "orders", "rebalance_started", "gen=4", "member=m-1", "billing-app", "@10.1.2.3", "instance=pod-7", "cause=member_joined"} {
				if !strings.Contains(l, want) {
					t.Errorf("line %q lacks %q", l, want)
				}
			}
		}, 3},
		{"json and group filter", tapOptions{admin: strings.TrimPrefix(srv.URL, "http://"), group: "orders", json: true}, func(t *testing.T, lines []string) {
			for _, l := range lines {
				var ev tap.StreamEvent
				if err := json.Unmarshal([]byte(l), &ev); err != nil {
					t.Fatalf("line %q: %v", l, err)
				}
				if ev.Group != "orders" {
					t.Errorf("group filter let %q through", ev.Group)
				}
			}
			var ev tap.StreamEvent
			_ = json.Unmarshal([]byte(lines[1]), &ev)
			if ev.Kind != "rebalance_started" || ev.Cause != "member_joined" || ev.Member == nil || ev.Member.ClientID != "billing-app" {
				t.Errorf("second event %+v", ev)
			}
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var out, errOut syncBuffer
			done := make(chan error, 1)
			go func() { done <- runTap(ctx, tc.opts, &out, &errOut) }()
			lines := waitLines(t, &out, tc.n)
			tc.check(t, lines)
			// A live event arrives after the replay.
			send(groupstate.Event{Time: at, Kind: groupstate.EventSyncCompleted, Group: "orders", Generation: 5, State: "Stable"})
			lines = waitLines(t, &out, tc.n+1)
			if !strings.Contains(lines[tc.n], "sync_completed") {
				t.Errorf("live event line %q", lines[tc.n])
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("runTap: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("runTap did not stop with its context")
			}
		})
	}
}

func TestTapCommandFailsWhenAdminIsDown(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	var out, errOut syncBuffer
	err := runTap(context.Background(), tapOptions{admin: url}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "connecting") {
		t.Errorf("runTap against a closed server: %v", err)
	}
}

func TestTapCommandResumesAfterDrop(t *testing.T) {
	var mu sync.Mutex
	var lastIDs []string
	conns := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conns++
		n := conns
		lastIDs = append(lastIDs, r.Header.Get("Last-Event-ID"))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		ev := tap.StreamEvent{Seq: uint64(n), Kind: "member_left", Group: "g", Time: time.Now()}
		b, _ := json.Marshal(ev)
		fmt.Fprintf(w, "id: %d\ndata: %s\n\n", n, b)
		if n == 2 {
			fmt.Fprint(w, "event: dropped\ndata: {\"dropped\":7}\n\n")
		}
		// End the stream: the client must reconnect.
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan error, 1)
	go func() { done <- runTap(ctx, tapOptions{admin: srv.URL, retry: time.Millisecond}, &out, &errOut) }()
	waitLines(t, &out, 3)
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(lastIDs) < 3 || lastIDs[0] != "" || lastIDs[1] != "1" || lastIDs[2] != "2" {
		t.Errorf("Last-Event-ID per connection %q, want \"\", 1, 2", lastIDs)
	}
	if !strings.Contains(errOut.String(), "7 events lost") {
		t.Errorf("stderr lacks the loss notice: %q", errOut.String())
	}
}

func TestFormatMemberReconciling(t *testing.T) {
	ev := tap.StreamEvent{Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Kind: "member_reconciling", Group: "g848", Generation: 2,
		Member: &tap.MemberInfo{MemberID: "a", ClientID: "client-a", Epoch: 1, State: "UNREVOKED_PARTITIONS",
			Assignment: []tap.TopicPartitions{{Topic: "payments", Partitions: []int32{0, 1}}},
			Revoking:   []tap.TopicPartitions{{Topic: "payments", Partitions: []int32{2, 3}}}}}
	got := formatEvent(ev)
	if want := "epoch=1 state=UNREVOKED_PARTITIONS assigned=2 revoking=2"; !strings.Contains(got, want) {
		t.Errorf("formatEvent = %q, want it to contain %q", got, want)
	}
}
