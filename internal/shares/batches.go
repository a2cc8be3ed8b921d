package shares

import (
	"encoding/binary"
	"sort"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/groupstate/share"
)

// Record batch v2 header offsets (Kafka's DefaultRecordBatch).
const (
	batchLengthOffset     = 8  // int32: bytes after this field
	batchMagicOffset      = 16 // int8
	batchAttributesOffset = 21 // int16
	batchLastDeltaOffset  = 23 // int32: last offset delta
	batchProducerIDOffset = 43 // int64
	batchHeaderSize       = 61

	attrTransactional = 0x10
	attrControl       = 0x20
)

// fetchedBatch is one complete record batch of a fetch response: its
// summary for the engine and where its bytes lie.
type fetchedBatch struct {
	share.Batch
	start, end int // byte range in the partition's RecordBatches
}

// readBatches walks the record batches of one fetched partition, reading
// headers only. An incomplete batch at the end (a fetch cut at its byte
// limit) is left out, as are message sets older than v2 (magic 0 and 1,
// which share groups cannot acknowledge record by record: Kafka's share
// fetch reads them through the same v2 view; they are rare since Kafka
// 0.11). With readCommitted, batches of transactions the broker lists as
// aborted are marked Aborted (Kafka's consumer does the same with
// FetchResponse's AbortedTransactions).
func readBatches(p *kmsg.FetchResponseTopicPartition, readCommitted bool) []fetchedBatch {
	b := p.RecordBatches
	var out []fetchedBatch
	var aborted []kmsg.FetchResponseTopicPartitionAbortedTransaction
	if readCommitted && len(p.AbortedTransactions) > 0 {
		aborted = append(aborted, p.AbortedTransactions...)
		sort.Slice(aborted, func(i, j int) bool { return aborted[i].FirstOffset < aborted[j].FirstOffset })
	}
	open := map[int64]bool{} // producers inside an aborted transaction
	for pos := 0; pos+batchHeaderSize <= len(b); {
		length := int(int32(binary.BigEndian.Uint32(b[pos+batchLengthOffset:])))
		end := pos + 12 + length
		if length < batchHeaderSize-12 || end > len(b) {
			break
		}
		base := int64(binary.BigEndian.Uint64(b[pos:]))
		if b[pos+batchMagicOffset] != 2 {
			pos = end
			continue
		}
		attrs := binary.BigEndian.Uint16(b[pos+batchAttributesOffset:])
		last := base + int64(int32(binary.BigEndian.Uint32(b[pos+batchLastDeltaOffset:])))
		producer := int64(binary.BigEndian.Uint64(b[pos+batchProducerIDOffset:]))
		if last < base {
			break // not a batch a broker writes: stop reading here
		}
		for len(aborted) > 0 && aborted[0].FirstOffset <= last {
			open[aborted[0].ProducerID] = true
			aborted = aborted[1:]
		}
		fb := fetchedBatch{Batch: share.Batch{Base: base, Last: last, Control: attrs&attrControl != 0}, start: pos, end: end}
		switch {
		case fb.Control:
			// The marker that ends a producer's transaction: an aborted
			// one closes here.
			delete(open, producer)
		case attrs&attrTransactional != 0 && open[producer]:
			fb.Aborted = true
		}
		out = append(out, fb)
		pos = end
	}
	return out
}

// acquiredBytes returns the bytes of the batches that hold an acquired
// offset: the records a ShareFetch response carries. Batches are whole
// (a client skips records outside its acquired ranges, KIP-932), and
// contiguous runs of them are returned as one slice of the fetched
// bytes, so nothing is copied when they are. None is an empty slice, never
// nil: kmsg writes a nil Records as null, which Kafka never sends in a
// ShareFetch response (its partitions carry MemoryRecords.EMPTY) and
// librdkafka's share consumer rejects, dropping the whole response
// ("invalid MessageSetSize -1") with the records it acquired.
func acquiredBytes(src []byte, batches []fetchedBatch, acquired []share.Acquired) []byte {
	out := []byte{}
	first, last := -1, -1
	for i, fb := range batches {
		if !overlaps(fb.Batch, acquired) {
			continue
		}
		if first < 0 {
			first = i
		}
		if last >= 0 && last != i-1 {
			// A gap: copy what we have so far and start again.
			out = append(out, src[batches[first].start:batches[last].end]...)
			first = i
		}
		last = i
	}
	if first < 0 {
		return out
	}
	if len(out) == 0 {
		return src[batches[first].start:batches[last].end]
	}
	return append(out, src[batches[first].start:batches[last].end]...)
}

// overlaps reports whether b holds an offset of one of the ranges.
func overlaps(b share.Batch, ranges []share.Acquired) bool {
	for _, r := range ranges {
		if r.First <= b.Last && r.Last >= b.Base {
			return true
		}
	}
	return false
}
