package share

import (
	"math"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Share session epochs (ShareRequestMetadata).
const (
	// InitialEpoch opens a share session, replacing any the member had.
	InitialEpoch int32 = 0
	// FinalEpoch closes the member's share session.
	FinalEpoch int32 = -1
)

// DefaultMaxSessions is group.share.max.share.sessions.
const DefaultMaxSessions = 2000

// nextEpoch is ShareRequestMetadata.nextEpoch: after the largest epoch
// comes 1, never 0.
func nextEpoch(e int32) int32 {
	switch {
	case e < 0:
		return FinalEpoch
	case e == math.MaxInt32:
		return 1
	}
	return e + 1
}

// sessionKey identifies a share session.
type sessionKey struct{ group, member string }

// Session is one member's share session: the partitions its fetches
// cover and the epoch its next request must carry. It is owned by its
// Sessions.
type Session struct {
	Group, Member string
	// Epoch is the epoch the next request must carry.
	Epoch int32
	parts []TopicPartition
	index map[TopicPartition]int
}

// Partitions returns the session's partitions in the order they were
// added. The slice must not be modified.
func (s *Session) Partitions() []TopicPartition { return s.parts }

// Contains reports whether tp is in the session.
func (s *Session) Contains(tp TopicPartition) bool {
	_, ok := s.index[tp]
	return ok
}

func (s *Session) add(tps []TopicPartition) {
	for _, tp := range tps {
		if _, ok := s.index[tp]; !ok {
			s.index[tp] = len(s.parts)
			s.parts = append(s.parts, tp)
		}
	}
}

func (s *Session) forget(tps []TopicPartition) {
	drop := false
	for _, tp := range tps {
		if _, ok := s.index[tp]; ok {
			delete(s.index, tp)
			drop = true
		}
	}
	if !drop {
		return
	}
	out := s.parts[:0]
	for _, tp := range s.parts {
		if _, ok := s.index[tp]; ok {
			s.index[tp] = len(out)
			out = append(out, tp)
		}
	}
	clear(s.parts[len(out):])
	s.parts = out
}

// Sessions is a cache of share sessions keyed by (group, member), as
// Kafka's ShareSessionCache with SharePartitionManager.newContext's
// epoch rules. It is owned by its caller (one per listener), which must
// serialise every call on it.
type Sessions struct {
	max      int
	sessions map[sessionKey]*Session
}

// NewSessions returns an empty cache holding at most max sessions
// (DefaultMaxSessions if max <= 0).
func NewSessions(max int) *Sessions {
	if max <= 0 {
		max = DefaultMaxSessions
	}
	return &Sessions{max: max, sessions: map[sessionKey]*Session{}}
}

// Len returns the number of open sessions.
func (c *Sessions) Len() int { return len(c.sessions) }

// Get returns the member's session, or nil.
func (c *Sessions) Get(group, member string) *Session {
	return c.sessions[sessionKey{group, member}]
}

// Update applies one ShareFetch's session part and returns the session
// and a Kafka error code:
//   - epoch 0 replaces any session of the member with a new one holding
//     add (SHARE_SESSION_LIMIT_REACHED when the cache is full); the
//     caller must answer INVALID_REQUEST itself when such a request
//     carries acknowledgements;
//   - epoch -1 closes the session (SHARE_SESSION_NOT_FOUND if none) and
//     returns it, removed, so that the caller releases its records;
//   - another epoch must equal the session's (SHARE_SESSION_NOT_FOUND,
//     INVALID_SHARE_SESSION_EPOCH); then add is added, forget removed
//     and the epoch advances.
//
// On an error the cache is unchanged, except that epoch 0 has already
// dropped the member's previous session, as Kafka does.
func (c *Sessions) Update(group, member string, epoch int32, add, forget []TopicPartition) (*Session, int16) {
	k := sessionKey{group, member}
	switch epoch {
	case FinalEpoch:
		s := c.sessions[k]
		if s == nil {
			return nil, kerr.ShareSessionNotFound.Code
		}
		delete(c.sessions, k)
		s.Epoch = FinalEpoch
		return s, 0
	case InitialEpoch:
		delete(c.sessions, k)
		if len(c.sessions) >= c.max {
			return nil, kerr.ShareSessionLimitReached.Code
		}
		s := &Session{Group: group, Member: member, Epoch: nextEpoch(InitialEpoch), index: map[TopicPartition]int{}}
		s.add(add)
		c.sessions[k] = s
		return s, 0
	}
	s := c.sessions[k]
	if s == nil {
		return nil, kerr.ShareSessionNotFound.Code
	}
	if s.Epoch != epoch {
		return nil, kerr.InvalidShareSessionEpoch.Code
	}
	s.add(add)
	s.forget(forget)
	s.Epoch = nextEpoch(s.Epoch)
	return s, 0
}

// Remove drops the member's session (its connection closed, it left the
// group) and returns it, or nil.
func (c *Sessions) Remove(group, member string) *Session {
	k := sessionKey{group, member}
	s := c.sessions[k]
	delete(c.sessions, k)
	return s
}
