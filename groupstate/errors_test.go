package groupstate

import (
	"context"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

func TestErrorCodesMatchKerr(t *testing.T) {
	for _, tc := range []struct {
		code int16
		want *kerr.Error
	}{
		{errUnknownServer, kerr.UnknownServerError},
		{errUnknownTopicOrPartition, kerr.UnknownTopicOrPartition},
		{errOffsetMetadataTooLarge, kerr.OffsetMetadataTooLarge},
		{errCoordinatorLoadInProgress, kerr.CoordinatorLoadInProgress},
		{errCoordinatorNotAvailable, kerr.CoordinatorNotAvailable},
		{errNotCoordinator, kerr.NotCoordinator},
		{errIllegalGeneration, kerr.IllegalGeneration},
		{errInconsistentGroupProtocol, kerr.InconsistentGroupProtocol},
		{errInvalidGroupID, kerr.InvalidGroupID},
		{errUnknownMemberID, kerr.UnknownMemberID},
		{errInvalidSessionTimeout, kerr.InvalidSessionTimeout},
		{errRebalanceInProgress, kerr.RebalanceInProgress},
		{errUnsupportedVersion, kerr.UnsupportedVersion},
		{errNonEmptyGroup, kerr.NonEmptyGroup},
		{errGroupIDNotFound, kerr.GroupIDNotFound},
		{errMemberIDRequired, kerr.MemberIDRequired},
		{errGroupMaxSizeReached, kerr.GroupMaxSizeReached},
		{errFencedInstanceID, kerr.FencedInstanceID},
		{errGroupSubscribedToTopic, kerr.GroupSubscribedToTopic},
		{errUnknownTopicID, kerr.UnknownTopicID},
		{errInvalidRequest, kerr.InvalidRequest},
		{errFencedMemberEpoch, kerr.FencedMemberEpoch},
		{errUnreleasedInstanceID, kerr.UnreleasedInstanceID},
		{errUnsupportedAssignor, kerr.UnsupportedAssignor},
		{errStaleMemberEpoch, kerr.StaleMemberEpoch},
		{errInvalidRegularExpression, kerr.InvalidRegularExpression},
		{errInvalidRecordState, kerr.InvalidRecordState},
	} {
		if tc.code != tc.want.Code {
			t.Errorf("%s: engine uses %d, kerr says %d", tc.want.Message, tc.code, tc.want.Code)
		}
	}
	for _, tc := range []struct {
		err  error
		want int16
	}{
		{kerr.NotEnoughReplicas, errCoordinatorNotAvailable},
		{kerr.NotLeaderForPartition, errNotCoordinator},
		{kerr.MessageTooLarge, errUnknownServer},
		{kerr.NetworkException, errCoordinatorLoadInProgress},
		{kerr.GroupIDNotFound, errGroupIDNotFound},
		// A fenced writer is no longer the coordinator (docs/fleet.md).
		{kerr.ProducerFenced, errNotCoordinator},
		{kerr.InvalidProducerEpoch, errNotCoordinator},
		{kerr.InvalidTxnState, errNotCoordinator},
		{kerr.NotCoordinator, errNotCoordinator},
		{fmt.Errorf("committing the transaction of partition 3: %w", kerr.ProducerFenced), errNotCoordinator},
		// Transient trouble of the transaction coordinator.
		{kerr.ConcurrentTransactions, errCoordinatorNotAvailable},
		{kerr.CoordinatorLoadInProgress, errCoordinatorNotAvailable},
		{fmt.Errorf("adding offsets: %w", kerr.ConcurrentTransactions), errCoordinatorNotAvailable},
		// The engine's own causes.
		{errUnloaded, errNotCoordinator},
		{errEngineClosed, errCoordinatorNotAvailable},
		{context.DeadlineExceeded, errCoordinatorNotAvailable},
	} {
		if got := storeErrorCode(tc.err); got != tc.want {
			t.Errorf("storeErrorCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

// TestFencedErrors checks which store errors drop a group instead of
// rebalancing it.
func TestFencedErrors(t *testing.T) {
	for _, err := range []error{kerr.ProducerFenced, kerr.InvalidProducerEpoch, kerr.InvalidTxnState, kerr.NotCoordinator,
		errUnloaded, fmt.Errorf("wrapped: %w", kerr.ProducerFenced)} {
		if !fenced(err) {
			t.Errorf("fenced(%v) = false", err)
		}
	}
	for _, err := range []error{kerr.NotLeaderForPartition, kerr.ConcurrentTransactions, context.DeadlineExceeded, errEngineClosed} {
		if fenced(err) {
			t.Errorf("fenced(%v) = true", err)
		}
	}
}
