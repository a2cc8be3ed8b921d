package kafkastore

import "github.com/twmb/franz-go/pkg/kerr"

// The transactional write path speaks the KIP-98 protocol as it was
// before KIP-890 part 2, whatever the client and the brokers could
// negotiate: partitions and groups are added to the transaction
// explicitly, and the producer epoch stays the same for every
// transaction of a claim. The versions are capped per request:
//
//	InitProducerId     <= 4  (v5+ belongs to KIP-890 / KIP-939)
//	AddPartitionsToTxn <= 3  (v4+ is the broker-to-broker batched form)
//	AddOffsetsToTxn    <= 3  (v4: KIP-890 error codes)
//	TxnOffsetCommit    <= 4  (v5: KIP-890 part 2 implicit group add)
//	EndTxn             <= 4  (v5: KIP-890 part 2, bumps the epoch per transaction)
//	Produce            <= 11 (v12: KIP-890 part 2 implicit partition add)
//
// They go to one broker capped (upstream.Capped), as kgo would send the
// highest version both sides know; transaction and group requests go to
// their coordinator through upstream.Cluster.Request, which follows it
// when it moves.

// Version caps of the transactional requests; see above.
const (
	maxInitProducerIDVersion     = 4
	maxAddPartitionsToTxnVersion = 3
	maxAddOffsetsToTxnVersion    = 3
	maxTxnOffsetCommitVersion    = 4
	maxEndTxnVersion             = 4
	maxTxnProduceVersion         = 11
)

// fencedCode reports whether code means the producer of a claim can no
// longer write: a newer InitProducerId for its transactional id fenced
// it, the broker aborted its transaction (timeout) and bumped the epoch,
// or it lost the right to use the id.
func fencedCode(code int16) bool {
	switch code {
	case kerr.ProducerFenced.Code, kerr.InvalidProducerEpoch.Code, kerr.InvalidTxnState.Code,
		kerr.TransactionalIDAuthorizationFailed.Code, kerr.InvalidProducerIDMapping.Code, kerr.UnknownProducerID.Code:
		return true
	}
	return false
}
