package groupstate

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// Error codes the engine answers with, as Kafka numbers them (a test
// checks them against kerr).
const (
	errNone                      int16 = 0
	errUnknownServer             int16 = -1
	errUnknownTopicOrPartition   int16 = 3
	errOffsetMetadataTooLarge    int16 = 12
	errCoordinatorLoadInProgress int16 = 14
	errCoordinatorNotAvailable   int16 = 15
	errNotCoordinator            int16 = 16
	errIllegalGeneration         int16 = 22
	errInconsistentGroupProtocol int16 = 23
	errInvalidGroupID            int16 = 24
	errUnknownMemberID           int16 = 25
	errInvalidSessionTimeout     int16 = 26
	errRebalanceInProgress       int16 = 27
	errUnsupportedVersion        int16 = 35
	errNonEmptyGroup             int16 = 68
	errGroupIDNotFound           int16 = 69
	errMemberIDRequired          int16 = 79
	errGroupMaxSizeReached       int16 = 81
	errFencedInstanceID          int16 = 82
	errGroupSubscribedToTopic    int16 = 86
	errUnknownTopicID            int16 = 100
	errInvalidRequest            int16 = 42
	errFencedMemberEpoch         int16 = 110
	errUnreleasedInstanceID      int16 = 111
	errUnsupportedAssignor       int16 = 112
	errStaleMemberEpoch          int16 = 113
	errInvalidRegularExpression  int16 = 128
	errInvalidRecordState        int16 = 121
)

// storeErrorCode maps an error returned by the store to the code a client
// is told, following Kafka's remapping of storage errors: clients retry
// COORDINATOR_NOT_AVAILABLE and NOT_COORDINATOR by looking the coordinator
// up again, which brings them back to kproxy.
//
// A fenced writer (docs/fleet.md: the partition's transactional id was
// claimed by another kproxy, KIP-98) answers NOT_COORDINATOR: PRODUCER_FENCED,
// INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE and NOT_COORDINATOR from the
// transaction coordinator all say that this kproxy no longer owns the
// group. CONCURRENT_TRANSACTIONS and COORDINATOR_LOAD_IN_PROGRESS from the
// transaction coordinator are transient (the previous transaction is
// still completing, the coordinator is moving): they answer
// COORDINATOR_NOT_AVAILABLE rather than COORDINATOR_LOAD_IN_PROGRESS
// because it is the one transient code every client retries on every
// group API; the Java consumer, for one, fails the poll with "Unexpected
// error from SyncGroup" on COORDINATOR_LOAD_IN_PROGRESS. The lookup it
// causes costs one FindCoordinator answered by the local kproxy.
func storeErrorCode(err error) int16 {
	if err == nil {
		return errNone
	}
	switch {
	case errors.Is(err, errUnloaded):
		return errNotCoordinator
	case errors.Is(err, errEngineClosed):
		return errCoordinatorNotAvailable
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		switch ke {
		case kerr.UnknownTopicOrPartition, kerr.NotEnoughReplicas, kerr.NotEnoughReplicasAfterAppend, kerr.RequestTimedOut:
			return errCoordinatorNotAvailable
		case kerr.NotLeaderForPartition, kerr.KafkaStorageError:
			return errNotCoordinator
		case kerr.ProducerFenced, kerr.InvalidProducerEpoch, kerr.InvalidTxnState, kerr.NotCoordinator:
			return errNotCoordinator
		case kerr.ConcurrentTransactions, kerr.CoordinatorLoadInProgress:
			return errCoordinatorNotAvailable
		case kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidFetchSize:
			return errUnknownServer
		case kerr.NetworkException:
			return errCoordinatorLoadInProgress
		}
		return ke.Code
	}
	// Timeouts, cancellation and transport errors: the client retries
	// after looking the coordinator up again.
	return errCoordinatorNotAvailable
}

// errorResponse builds the response to req carrying code everywhere a
// Kafka broker would put a request-level error: at the top level, per
// group, or per partition.
func errorResponse(req kmsg.Request, code int16) kmsg.Response {
	return codec.GroupErrorResponse(req, code)
}

// commitError answers every partition of an OffsetCommit with code.
func commitError(r *kmsg.OffsetCommitRequest, code int16) *kmsg.OffsetCommitResponse {
	return codec.GroupErrorResponse(r, code).(*kmsg.OffsetCommitResponse)
}

// joinError is a JoinGroup response carrying only an error and member id.
func joinError(code int16, memberID string) *kmsg.JoinGroupResponse {
	resp := kmsg.NewPtrJoinGroupResponse()
	resp.ErrorCode = code
	resp.MemberID = memberID
	return resp
}

// syncError is a SyncGroup response carrying only an error.
func syncError(code int16) *kmsg.SyncGroupResponse {
	resp := kmsg.NewPtrSyncGroupResponse()
	resp.ErrorCode = code
	return resp
}
