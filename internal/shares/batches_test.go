package shares

import (
	"encoding/binary"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate"
	"github.com/kproxy/kproxy/groupstate/share"
)

// batch encodes the header of a v2 record batch of records base..last
// (no records follow: readBatches reads headers only).
func batch(base, last, producer int64, attrs uint16) []byte {
	b := make([]byte, batchHeaderSize)
	binary.BigEndian.PutUint64(b, uint64(base))
	binary.BigEndian.PutUint32(b[batchLengthOffset:], uint32(batchHeaderSize-12))
	b[batchMagicOffset] = 2
	binary.BigEndian.PutUint16(b[batchAttributesOffset:], attrs)
	binary.BigEndian.PutUint32(b[batchLastDeltaOffset:], uint32(last-base))
	binary.BigEndian.PutUint64(b[batchProducerIDOffset:], uint64(producer))
	return b
}

func TestReadBatches(t *testing.T) {
	var raw []byte
	raw = append(raw, batch(0, 4, -1, 0)...)                            // plain
	raw = append(raw, batch(5, 7, 9, attrTransactional)...)             // aborted below
	raw = append(raw, batch(8, 8, 9, attrControl|attrTransactional)...) // its abort marker
	raw = append(raw, batch(9, 10, 9, attrTransactional)...)            // a later transaction of 9, not aborted
	raw = append(raw, batch(11, 11, 9, attrControl|attrTransactional)...)
	full := len(raw)
	raw = append(raw, batch(12, 20, -1, 0)[:30]...) // cut by the fetch's byte limit

	p := &kmsg.FetchResponseTopicPartition{RecordBatches: raw,
		AbortedTransactions: []kmsg.FetchResponseTopicPartitionAbortedTransaction{{ProducerID: 9, FirstOffset: 5}}}

	got := readBatches(p, true)
	want := []share.Batch{
		{Base: 0, Last: 4},
		{Base: 5, Last: 7, Aborted: true},
		{Base: 8, Last: 8, Control: true},
		{Base: 9, Last: 10},
		{Base: 11, Last: 11, Control: true},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d batches, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].Batch != want[i] {
			t.Errorf("batch %d: got %+v, want %+v", i, got[i].Batch, want[i])
		}
	}
	if got[len(got)-1].end != full {
		t.Errorf("last complete batch ends at %d, want %d", got[len(got)-1].end, full)
	}

	// read_uncommitted: nothing is aborted.
	for _, b := range readBatches(p, false) {
		if b.Aborted {
			t.Errorf("read_uncommitted marked %+v aborted", b.Batch)
		}
	}

	// The records of acquired offsets 0-2 and 9-10: the first batch and
	// the fourth, copied together.
	out := acquiredBytes(raw, got, []share.Acquired{{First: 0, Last: 2}, {First: 9, Last: 10}})
	wantLen := (got[0].end - got[0].start) + (got[3].end - got[3].start)
	if len(out) != wantLen {
		t.Fatalf("acquired bytes: %d, want %d", len(out), wantLen)
	}
	// One contiguous run is returned without a copy.
	run := acquiredBytes(raw, got, []share.Acquired{{First: 0, Last: 7}})
	if len(run) != got[1].end || &run[0] != &raw[0] {
		t.Errorf("contiguous batches were copied or cut: %d bytes", len(run))
	}
}

// FuzzReadBatches: any bytes a broker could send are read without a
// panic, and every batch read lies inside them.
func FuzzReadBatches(f *testing.F) {
	f.Add(batch(0, 4, -1, 0))
	f.Add(append(batch(0, 4, 3, attrTransactional), batch(5, 5, 3, attrControl)...))
	f.Fuzz(func(t *testing.T, raw []byte) {
		p := &kmsg.FetchResponseTopicPartition{RecordBatches: raw,
			AbortedTransactions: []kmsg.FetchResponseTopicPartitionAbortedTransaction{{ProducerID: 3, FirstOffset: 0}}}
		for _, b := range readBatches(p, true) {
			if b.start < 0 || b.end > len(raw) || b.start >= b.end {
				t.Fatalf("batch %+v outside %d bytes", b, len(raw))
			}
		}
	})
}

// TestShareFetchRecordsNeverNull: every partition of a ShareFetch
// response carries records, empty when nothing was acquired, never null
// (librdkafka's share consumer drops a response with a null one, and the
// records it acquired with it, until their locks time out).
func TestShareFetchRecordsNeverNull(t *testing.T) {
	raw := batch(0, 4, -1, 0)
	got := readBatches(&kmsg.FetchResponseTopicPartition{RecordBatches: raw}, false)
	if b := acquiredBytes(raw, got, []share.Acquired{{First: 7, Last: 9}}); b == nil || len(b) != 0 {
		t.Fatalf("acquiredBytes with nothing acquired = %v (nil %v), want empty and not nil", b, b == nil)
	}
	if b := acquiredBytes(raw, nil, nil); b == nil {
		t.Fatal("acquiredBytes of no batches = nil, want empty")
	}

	resp := kmsg.NewPtrShareFetchResponse()
	out := newShareFetchOut(resp)
	tp0 := groupstate.ShareTP{TopicID: [16]byte{1}, Partition: 0}
	tp1 := groupstate.ShareTP{TopicID: [16]byte{1}, Partition: 1}
	out.partition(tp0).Records = acquiredBytes(raw, got, []share.Acquired{{First: 0, Last: 4}})
	out.partition(tp1) // only an acknowledgement's result, say
	for _, v := range []int16{1, 2} {
		resp.Version = v
		back := kmsg.NewPtrShareFetchResponse()
		back.Version = v
		if err := back.ReadFrom(resp.AppendTo(nil)); err != nil {
			t.Fatalf("v%d: decoding: %v", v, err)
		}
		ps := back.Topics[0].Partitions
		if len(ps) != 2 {
			t.Fatalf("v%d: %d partitions, want 2", v, len(ps))
		}
		if len(ps[0].Records) != len(raw) {
			t.Errorf("v%d: partition 0 has %d bytes of records, want %d", v, len(ps[0].Records), len(raw))
		}
		if ps[1].Records == nil {
			t.Errorf("v%d: partition 1's records are null on the wire, want empty", v)
		}
	}
}
