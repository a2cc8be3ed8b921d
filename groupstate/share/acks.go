package share

import (
	"errors"
	"fmt"
)

// ErrInvalidAckBatch is wrapped by every error of ValidateAckBatches; the
// partition's answer is INVALID_REQUEST.
var ErrInvalidAckBatch = errors.New("invalid acknowledgement batch")

// ValidateAckBatches checks one partition's acknowledgement batches as
// Kafka 4.4's KafkaApis.validateAcknowledgementBatches does: each batch
// has First <= Last, starts at or after the previous batch's last offset
// (Kafka lets a batch start on the offset the previous one ended on), has
// either one type or one type per offset, and only types 0-3, or 0-4 when
// renewAllowed. Pass renewAllowed only for a request whose version
// carries Renew (ShareFetch/ShareAcknowledge v2) and that is a renew
// request (IsRenewAck): Kafka rejects type 4 otherwise. A non-nil error
// wraps ErrInvalidAckBatch and means INVALID_REQUEST for the partition.
func ValidateAckBatches(acks []AckBatch, renewAllowed bool) error {
	maxType := AckReject
	if renewAllowed {
		maxType = AckRenew
	}
	prevLast := int64(-1)
	for i, b := range acks {
		switch {
		case b.First > b.Last:
			return fmt.Errorf("%w %d: first offset %d after last offset %d", ErrInvalidAckBatch, i, b.First, b.Last)
		case b.First < prevLast:
			return fmt.Errorf("%w %d: first offset %d before the previous batch's last offset %d", ErrInvalidAckBatch, i, b.First, prevLast)
		case len(b.Types) == 0:
			return fmt.Errorf("%w %d: no acknowledge types", ErrInvalidAckBatch, i)
		case len(b.Types) > 1 && b.Last-b.First != int64(len(b.Types))-1:
			return fmt.Errorf("%w %d: %d acknowledge types for offsets %d-%d", ErrInvalidAckBatch, i, len(b.Types), b.First, b.Last)
		}
		for _, t := range b.Types {
			if t < AckGap || t > maxType {
				return fmt.Errorf("%w %d: acknowledge type %d not allowed", ErrInvalidAckBatch, i, t)
			}
		}
		prevLast = b.Last
	}
	return nil
}
