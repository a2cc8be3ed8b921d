package kafkastore

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestLoadReadsCommittedOnly writes a groups partition the way a
// transactional owner and plain writers would (plain records, committed
// and aborted transactions, a partition ending in control markers, and a
// transaction still open at the end) with kgo producers, and proves that
// a load returns exactly the committed values: aborted records are
// skipped, a range holding only control batches does not stop the scan,
// and the open transaction past the last stable offset is neither read
// nor waited for.
func TestLoadReadsCommittedOnly(t *testing.T) {
	newClient := newKfakeClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	store := NewWith(newClient(), Options{GroupsPartitions: 1})
	if n, err := store.Partitions(ctx); err != nil || n != 1 {
		t.Fatalf("partitions: %d %v", n, err)
	}

	plain := newClient()
	txn := func(id string) *kgo.Client {
		cl, err := kgo.NewClient(append(newClient().Opts(), kgo.TransactionalID(id))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	rec := func(k, v string) *kgo.Record {
		return &kgo.Record{Topic: DefaultGroupsTopic, Partition: 0, Key: []byte(k), Value: []byte(v)}
	}
	produce := func(cl *kgo.Client, recs ...*kgo.Record) {
		t.Helper()
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	inTxn := func(cl *kgo.Client, commit kgo.TransactionEndTry, recs ...*kgo.Record) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		produce(cl, recs...)
		if err := cl.EndTransaction(ctx, commit); err != nil {
			t.Fatalf("end transaction: %v", err)
		}
	}
	a, b := txn("writer-a"), txn("writer-b")
	produce(plain, rec("k1", "plain1"))
	inTxn(a, kgo.TryCommit, rec("k2", "c2"), rec("k1", "c1"))
	inTxn(b, kgo.TryAbort, rec("k3", "a3"), rec("k1", "a1"))
	produce(plain, rec("k4", "p4"))
	inTxn(a, kgo.TryCommit, rec("k5", "c5"))
	inTxn(b, kgo.TryAbort, rec("k6", "a6"), rec("k5", "a5"))
	inTxn(a, kgo.TryCommit, rec("k4", "c4"))
	// The partition now ends with a commit marker. A transaction left
	// open holds the last stable offset below it.
	open := txn("writer-open")
	if err := open.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produce(open, rec("k7", "open7"), rec("k1", "open1"))

	want := map[string]string{"k1": "c1", "k2": "c2", "k4": "c4", "k5": "c5"}
	again := New(newClient()) // a restarted kproxy, nothing cached
	for _, k := range []string{"k1", "k2", "k3", "k4", "k5", "k6", "k7"} {
		got, found, err := again.LoadGroupMetadata(ctx, k)
		if err != nil {
			t.Fatalf("load %s: %v", k, err)
		}
		w, ok := want[k]
		if found != ok || string(got) != w {
			t.Errorf("load %s: %q found=%v, want %q found=%v", k, got, found, w, ok)
		}
	}
}
