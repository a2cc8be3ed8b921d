// Command e2eserver runs an in-process kproxy (kfake cluster, proxy,
// engine, tap, admin server) with real franz-go consumers, for tap's
// browser test: groups orders and billing commit, group audit never does,
// share group reports is the cluster's (kproxy forwards it).
// It prints ADMIN_URL=<url> once the groups are Stable,
// then serves until stdin closes or it is signalled. POST /test/drive
// plays a scenario of real rebalances: a consumer joins, leaves, and a
// static consumer vanishes and expires.
//
// /api/fleet serves a fixed fleet of three kproxies (fakeFleet), so the
// web view's fleet section has something to show; the same admin server
// without a fleet (a kproxy with local groups, /api/fleet answers 404) is
// mounted under /local/.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kproxy/kproxy/fleet"
	"github.com/kproxy/kproxy/tap"
	"github.com/kproxy/kproxy/tap/internal/devstack"
)

func main() {
	listen := flag.String("admin-listen", "127.0.0.1:0", "admin server address")
	verbose := flag.Bool("v", false, "log to stderr")
	flag.Parse()
	if err := run(*listen, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "e2eserver:", err)
		os.Exit(1)
	}
}

// scenario owns the consumers of the demo groups; mu serialises drives.
type scenario struct {
	st      *devstack.Stack
	driving sync.Mutex // held while a scenario plays

	mu        sync.Mutex           // guards consumers
	consumers []*devstack.Consumer // closed at exit
}

// run starts the stack and the first consumers, prints the admin URL and
// serves until stdin closes or a signal arrives.
func run(listen string, verbose bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Exit when the parent closes our stdin, so no server outlives its
	// test.
	go func() {
		_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		stop()
	}()

	log := slog.New(slog.DiscardHandler)
	if verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	sc := &scenario{}
	mux := http.NewServeMux()
	st, err := devstack.Start(ctx, devstack.Options{
		Logger:      log,
		AdminListen: listen,
		AdminWrap: func(h http.Handler) http.Handler {
			mux.Handle("/", h)
			mux.HandleFunc("POST /test/drive", sc.drive)
			return mux
		},
		Fleet: fakeFleet,
	})
	if err != nil {
		return err
	}
	sc.st = st
	local := tap.NewHTTPHandler(tap.HTTPConfig{
		Tap: st.Tap, Groups: st.Engine, Offsets: tap.NewKadmOffsetSource(st.Admin), Logger: log,
	})
	mux.Handle("/local/", http.StripPrefix("/local", local))
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sc.mu.Lock()
		for _, c := range sc.consumers {
			c.Close()
		}
		sc.mu.Unlock()
		st.Close(c)
	}()

	setup, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := st.CreateTopic(setup, "payments", 6); err != nil {
		return err
	}
	if err := st.CreateTopic(setup, "invoices", 3); err != nil {
		return err
	}
	if err := st.Produce(setup, "payments", 300); err != nil {
		return err
	}
	if err := st.Produce(setup, "invoices", 50); err != nil {
		return err
	}
	if _, err := sc.join(setup, "orders", "orders-consumer-1", "payments", 1); err != nil {
		return err
	}
	if _, err := sc.join(setup, "billing", "billing-consumer-1", "invoices", 1); err != nil {
		return err
	}
	// A group with a member that never commits: the web view shows its
	// assigned partitions' end offsets and lag, not an error.
	if _, err := sc.join(setup, "audit", "audit-consumer-1", "invoices", 1, kgo.DisableAutoCommit()); err != nil {
		return err
	}
	// A share group (KIP-932): the cluster serves it, kproxy forwards its
	// requests; the web view lists it among the groups the cluster serves.
	share, err := kgo.NewClient(kgo.SeedBrokers(st.Bootstrap), kgo.ClientID("reports-share-1"),
		kgo.ShareGroup("reports"), kgo.ConsumeTopics("invoices"))
	if err != nil {
		return err
	}
	defer share.Close()
	go func() {
		for !share.PollFetches(ctx).IsClientClosed() && ctx.Err() == nil {
		}
	}()
	if err := waitForwarded(setup, st.AdminURL, "reports"); err != nil {
		return err
	}
	fmt.Printf("ADMIN_URL=%s\n", st.AdminURL)
	fmt.Printf("BOOTSTRAP=%s\n", st.Bootstrap)
	<-ctx.Done()
	return nil
}

// waitForwarded waits until kproxy's /api/forwarded lists group.
func waitForwarded(ctx context.Context, adminURL, group string) error {
	for {
		if resp, err := http.Get(adminURL + "/api/forwarded"); err == nil {
			var fw struct{ Groups []tap.ForwardedGroup }
			err := json.NewDecoder(resp.Body).Decode(&fw)
			resp.Body.Close()
			for _, g := range fw.Groups {
				if err == nil && g.Group == group {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("share group %s never listed as forwarded: %w", group, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// join starts a consumer and waits for its group to hold members members.
func (sc *scenario) join(ctx context.Context, group, client, topic string, members int, opts ...kgo.Opt) (*devstack.Consumer, error) {
	c, err := sc.st.NewConsumer(group, client, []string{topic}, opts...)
	if err != nil {
		return nil, err
	}
	sc.mu.Lock()
	sc.consumers = append(sc.consumers, c)
	sc.mu.Unlock()
	if _, err := sc.st.WaitGroup(ctx, group, members); err != nil {
		return nil, err
	}
	return c, nil
}

// forget removes c from the consumers closed at exit.
func (sc *scenario) forget(c *devstack.Consumer) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for i, x := range sc.consumers {
		if x == c {
			sc.consumers = append(sc.consumers[:i], sc.consumers[i+1:]...)
			return
		}
	}
}

// drive plays the scenario on group "orders" and answers with its final
// generation.
func (sc *scenario) drive(w http.ResponseWriter, r *http.Request) {
	if !sc.driving.TryLock() {
		http.Error(w, "already driving", http.StatusConflict)
		return
	}
	defer sc.driving.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), 60*time.Second)
	defer cancel()
	gen, err := sc.play(ctx)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "generation": gen})
}

// play: a second consumer joins, then leaves; a static consumer joins and
// vanishes without leaving, so its session expires.
func (sc *scenario) play(ctx context.Context) (int32, error) {
	const group, topic = "orders", "payments"
	c2, err := sc.join(ctx, group, "orders-consumer-2", topic, 2)
	if err != nil {
		return 0, err
	}
	if err := sc.st.Produce(ctx, topic, 60); err != nil {
		return 0, err
	}
	time.Sleep(700 * time.Millisecond) // let the timeline show a gap
	sc.forget(c2)
	c2.Close()
	if _, err := sc.st.WaitGroup(ctx, group, 1); err != nil {
		return 0, err
	}
	time.Sleep(700 * time.Millisecond)
	c3, err := sc.join(ctx, group, "orders-consumer-3", topic, 2,
		kgo.InstanceID("orders-static-3"), kgo.SessionTimeout(1500*time.Millisecond))
	if err != nil {
		return 0, err
	}
	sc.forget(c3)
	c3.Close() // static: no LeaveGroup, the session expires
	g, err := sc.st.WaitGroup(ctx, group, 1)
	if err != nil {
		return 0, err
	}
	if g.State != "Stable" {
		return 0, errors.New("orders not Stable after the scenario")
	}
	return g.Generation, nil
}

// Fake fleet: 16 partitions owned by three kproxies. This one (web-1)
// leads the fleet, owns six partitions and serves five of them (15 is
// still being claimed); partition 14 is in transition and has no owner.
const (
	selfID     = "web-1-40213-q8x1"
	selfMember = "kproxy-web-1-40213-q8x1-7c9e4a12-5d3b-4f0e-9a61-2b1f0c7e8d44"
)

// fakeFleet is the fixed /api/fleet of the browser test.
func fakeFleet() tap.FleetView {
	owners := []fleet.Owner{
		{ID: selfID, MemberID: selfMember, Peer: "10.0.0.11:9093"},
		{ID: "web-2-40877-r2m0", MemberID: "kproxy-web-2-40877-r2m0-1e0b7c33-9f7d-4b52-8f1a-6c4d2e9b0a17", Peer: "10.0.0.12:9093"},
		{ID: "web-3-41002-t5k7", MemberID: "kproxy-web-3-41002-t5k7-a4f8d210-3c6e-47b9-b0d5-91e2f7c8a3b6", Peer: "10.0.0.13:9093"},
	}
	table := make([]fleet.Owner, 16)
	for p := range table {
		if p == 14 {
			continue // in transition: no owner this generation
		}
		o := owners[p%3]
		o.Generation = int32(9 + p%4)
		table[p] = o
	}
	return tap.FleetView{
		ID: selfID, Peer: "10.0.0.11:9093", PeerListen: "0.0.0.0:9093", Partitions: 16,
		Serving: []int32{0, 3, 6, 9, 12},
		Moves:   9, Fenced: 1, LeaseValid: true,
		Member: fleet.Status{
			ID: selfID, MemberID: selfMember, Peer: "10.0.0.11:9093", Owner: true,
			Group: "__kproxy_fleet", Generation: 12, LeaderID: selfMember, Leader: true,
			Table: table, Owned: []int32{0, 3, 6, 9, 12, 15},
			LeaseValid: true, LeaseRemaining: 7250 * time.Millisecond,
			Generations: 12, Gained: 7, Revoked: 1, Lost: 1, Fenced: 1,
		},
	}
}
