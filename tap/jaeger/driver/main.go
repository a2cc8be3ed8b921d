// Command driver plays the rebalances that tap/jaeger/screenshot.sh shows
// in Jaeger's UI. It talks to a running kproxy (normally `kproxy dev`)
// with franz-go clients, like any application would:
//
//   - classic group "billing" (eager range assignor): billing-1 and
//     billing-2 form the group, billing-3 joins late, then billing-3's
//     process is killed with SIGKILL so its session (6 s) expires;
//   - KIP-848 group "shipping" (server-side assignor): shipping-1 and
//     shipping-2 form the group and shipping-3 joins, so partitions are
//     revoked from the first two before they are assigned to it.
//
// billing-3 runs as a child process (this binary with -member) so that
// killing it drops its connections without a LeaveGroup. Every wait is
// bounded; the driver exits non-zero when a group does not settle.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	topic      = "orders"
	partitions = 6
	classic    = "billing"
	kip848     = "shipping"
	session    = 6 * time.Second
)

func main() {
	bootstrap := flag.String("bootstrap", "127.0.0.1:9092", "kproxy's bootstrap address")
	member := flag.String("member", "", "run as one classic member of the billing group with this client id until killed (used by the driver itself)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if *member != "" {
		err = runMember(ctx, *bootstrap, *member)
	} else {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		err = drive(ctx, log, *bootstrap)
	}
	if err != nil {
		log.Error("driver failed", "err", err)
		os.Exit(1)
	}
}

// consumer is one polling group member. Its client is owned by the
// goroutine that created it; done closes when the poll loop ends.
type consumer struct {
	cl   *kgo.Client
	done chan struct{}
}

func newConsumer(bootstrap, group, clientID string, kip848 bool) (*consumer, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(bootstrap),
		kgo.ClientID(clientID),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.SessionTimeout(session),
		kgo.HeartbeatInterval(500 * time.Millisecond),
		kgo.AutoCommitInterval(time.Second),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}
	if kip848 {
		opts = append(opts, kgo.Balancers(kgo.StickyBalancer()), kgo.ServerSideBalancer())
	} else {
		opts = append(opts, kgo.Balancers(kgo.RangeBalancer()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("client %s: %w", clientID, err)
	}
	c := &consumer{cl: cl, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			if fs := cl.PollFetches(context.Background()); fs.IsClientClosed() {
				return
			}
		}
	}()
	return c, nil
}

// close leaves the group and stops polling.
func (c *consumer) close() {
	c.cl.Close()
	<-c.done
}

func runMember(ctx context.Context, bootstrap, clientID string) error {
	c, err := newConsumer(bootstrap, classic, clientID, false)
	if err != nil {
		return err
	}
	<-ctx.Done()
	c.close()
	return nil
}

func drive(ctx context.Context, log *slog.Logger, bootstrap string) error {
	admCl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.ClientID("driver-admin"))
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	if _, err := adm.CreateTopic(ctx, partitions, 1, nil, topic); err != nil {
		return fmt.Errorf("creating %s: %w", topic, err)
	}
	for i := range 60 {
		rec := &kgo.Record{Topic: topic, Value: fmt.Appendf(nil, "order-%d", i)}
		if err := admCl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			return fmt.Errorf("producing: %w", err)
		}
	}

	var members []*consumer
	defer func() {
		for _, c := range members {
			c.close()
		}
	}()
	start := func(group, id string, kip848 bool) error {
		c, err := newConsumer(bootstrap, group, id, kip848)
		if err != nil {
			return err
		}
		members = append(members, c)
		return nil
	}

	log.Info("classic group: two members form it", "group", classic)
	for _, id := range []string{"billing-1", "billing-2"} {
		if err := start(classic, id, false); err != nil {
			return err
		}
	}
	if err := waitClassic(ctx, adm, 2); err != nil {
		return err
	}

	log.Info("classic group: billing-3 joins late, in a process of its own")
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding own binary: %w", err)
	}
	child := exec.CommandContext(ctx, self, "-bootstrap", bootstrap, "-member", "billing-3")
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		return fmt.Errorf("starting billing-3: %w", err)
	}
	defer func() {
		_ = child.Process.Kill()
		_ = child.Wait()
	}()
	if err := waitClassic(ctx, adm, 3); err != nil {
		return err
	}
	time.Sleep(time.Second)

	log.Info("classic group: billing-3 is killed (SIGKILL); its session expires", "session", session)
	if err := child.Process.Kill(); err != nil {
		return fmt.Errorf("killing billing-3: %w", err)
	}
	if err := waitClassic(ctx, adm, 2); err != nil {
		return err
	}

	log.Info("KIP-848 group: two members, then a third", "group", kip848)
	for _, id := range []string{"shipping-1", "shipping-2"} {
		if err := start(kip848, id, true); err != nil {
			return err
		}
	}
	if err := waitConsumer(ctx, adm, 2); err != nil {
		return err
	}
	if err := start(kip848, "shipping-3", true); err != nil {
		return err
	}
	if err := waitConsumer(ctx, adm, 3); err != nil {
		return err
	}
	log.Info("done; members leave")
	return nil
}

// waitClassic waits until the billing group is Stable with n members.
func waitClassic(ctx context.Context, adm *kadm.Client, n int) error {
	return poll(ctx, func() (bool, string) {
		gs, err := adm.DescribeGroups(ctx, classic)
		if err != nil {
			return false, err.Error()
		}
		g := gs[classic]
		if g.Err != nil {
			return false, g.Err.Error()
		}
		return g.State == "Stable" && len(g.Members) == n, fmt.Sprintf("%s with %d members", g.State, len(g.Members))
	})
}

// waitConsumer waits until every one of n members of the KIP-848 group
// holds its target assignment (member epoch == group epoch) and every
// partition is assigned.
func waitConsumer(ctx context.Context, adm *kadm.Client, n int) error {
	return poll(ctx, func() (bool, string) {
		gs, err := adm.DescribeConsumerGroups(ctx, kip848)
		if err != nil {
			return false, err.Error()
		}
		g := gs[kip848]
		if g.Err != nil {
			return false, g.Err.Error()
		}
		assigned := 0
		for _, m := range g.Members {
			if m.MemberEpoch != g.Epoch {
				return false, "reconciling"
			}
			for _, ps := range m.Assignment {
				assigned += len(ps)
			}
		}
		return len(g.Members) == n && assigned == partitions, fmt.Sprintf("%s, %d members, %d partitions assigned", g.State, len(g.Members), assigned)
	})
}

func poll(ctx context.Context, done func() (bool, string)) error {
	last := ""
	for {
		ok, state := done()
		if ok {
			return nil
		}
		last = state
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), fmt.Errorf("last seen: %s", last))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
