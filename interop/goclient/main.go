// Command goclient is the Go member of the kproxy interop harness. One binary
// drives three client libraries, chosen with -client: franz (franz-go), sarama
// (IBM/sarama) and confluent (confluent-kafka-go, librdkafka). Every library
// speaks the same JSON-lines protocol on stdout that the other languages'
// clients speak (see interop/README.md): assignment events with the member's
// full owned partition set, consumed records, commits, errors, and "closed".
//
// Modes: -mode produce writes -count records with ids id-<start>.. (franz
// with -interval-ms: one at a time, spread over time); -mode
// consume joins -group and commits after every batch until SIGTERM or
// SIGINT, then closes cleanly; -mode share (franz) is a share-group member
// printing the plain lines of the kinds rows (harness/kinds.go).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"
)

// options holds the flags shared by every client library.
type options struct {
	client      string
	mode        string
	bootstrap   string
	topic       string
	group       string
	member      string
	count       int
	start       int
	assignor    string
	instanceID  string
	sessionMS   int
	heartbeatMS int
	intervalMS  int    // produce: pause between records (0: one batch)
	holdMS      int    // share: pause after each batch before the next poll
	ack         string // share: implicit (franz-go's default) or explicit
}

// emitter writes JSON lines to stdout; mu serialises writers because some
// libraries call back from several goroutines.
type emitter struct {
	mu     sync.Mutex
	member string
}

// emit writes one event with the current wall-clock time in milliseconds.
func (e *emitter) emit(ev string, fields map[string]any) {
	if fields == nil {
		fields = map[string]any{}
	}
	fields["ts"] = time.Now().UnixMilli()
	fields["ev"] = ev
	fields["member"] = e.member
	b, err := json.Marshal(fields)
	if err != nil {
		b = []byte(fmt.Sprintf(`{"ev":"error","error":%q}`, err.Error()))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	os.Stdout.Write(append(b, '\n'))
}

// errorf reports an error event.
func (e *emitter) errorf(format string, args ...any) {
	e.emit("error", map[string]any{"error": fmt.Sprintf(format, args...)})
}

// ownedSet tracks the partitions this member holds; guarded by mu because
// rebalance callbacks and the poll loop may run on different goroutines.
type ownedSet struct {
	mu    sync.Mutex
	parts map[int32]bool
}

// apply adds and removes partitions and returns the sorted result.
func (o *ownedSet) apply(add, remove []int32, clear bool) []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.parts == nil || clear {
		o.parts = map[int32]bool{}
	}
	for _, p := range remove {
		delete(o.parts, p)
	}
	for _, p := range add {
		o.parts[p] = true
	}
	out := make([]int32, 0, len(o.parts))
	for p := range o.parts {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func main() {
	var o options
	flag.StringVar(&o.client, "client", "franz", "client library: franz, sarama or confluent")
	flag.StringVar(&o.mode, "mode", "consume", "produce or consume")
	flag.StringVar(&o.bootstrap, "bootstrap", "127.0.0.1:9092", "bootstrap host:port")
	flag.StringVar(&o.topic, "topic", "", "topic")
	flag.StringVar(&o.group, "group", "", "consumer group")
	flag.StringVar(&o.member, "member", "go", "member name (client id)")
	flag.IntVar(&o.count, "count", 0, "records to produce")
	flag.IntVar(&o.start, "start", 0, "first record id to produce")
	flag.StringVar(&o.assignor, "assignor", "range", "range, cooperative-sticky or (franz only) server-uniform: KIP-848 with the broker's uniform assignor")
	flag.StringVar(&o.instanceID, "instance-id", "", "group.instance.id for static membership")
	flag.IntVar(&o.sessionMS, "session-ms", 10000, "session timeout in ms")
	flag.IntVar(&o.heartbeatMS, "heartbeat-ms", 1000, "heartbeat interval in ms")
	flag.IntVar(&o.intervalMS, "interval-ms", 0, "produce (franz only): send records one at a time, this many ms apart, so records keep flowing while the harness injects a fault")
	flag.IntVar(&o.holdMS, "hold-ms", 0, "share (franz only): hold each batch this many ms before polling again")
	flag.StringVar(&o.ack, "ack", "implicit", "share (franz only): implicit, or explicit: reject values ending in 7, release those ending in 3 on their first delivery, accept the rest, flush each batch's acks and print ACK lines")
	flag.Parse()

	em := &emitter{member: o.member}
	if o.topic == "" {
		em.errorf("missing -topic")
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()

	var err error
	switch o.client + "/" + o.mode {
	case "franz/produce":
		err = franzProduce(ctx, o)
	case "franz/consume":
		err = franzConsume(ctx, o, em)
	case "franz/share":
		err = franzShare(ctx, o, o.holdMS, o.ack == "explicit")
	case "sarama/produce":
		err = saramaProduce(o)
	case "sarama/consume":
		err = saramaConsume(ctx, o, em)
	case "confluent/produce":
		err = confluentProduce(o)
	case "confluent/consume":
		err = confluentConsume(ctx, o, em)
	default:
		err = fmt.Errorf("unknown client/mode %s/%s", o.client, o.mode)
	}
	if err != nil {
		em.errorf("%v", err)
		os.Exit(1)
	}
	if o.mode == "produce" {
		em.emit("produced", map[string]any{"count": o.count})
	}
}

// recordID returns the id carried by the i-th record.
func recordID(i int) string { return fmt.Sprintf("id-%d", i) }
