package proxy

import (
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// followRetry is how long a followed request (relay) waits for the table
// to name another owner before it is sent to the same one again: the new
// owner the table named may still be claiming the group's partition
// (docs/fleet.md, "Takeover and handover"), which no table change
// announces.
const followRetry = 100 * time.Millisecond

// followCap bounds how long after it was first sent a followed request
// is answered: below franz-go's default request read timeout (10s,
// RequestTimeoutOverhead), past which the client closes the connection,
// and Kafka's consumer's request.timeout.ms (30s).
const followCap = 8 * time.Second

// relay sends a single-group request to d, following its group to the
// group's next owner when d answers that it does not serve the group
// (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
// COORDINATOR_LOAD_IN_PROGRESS): the request is held and sent again the
// moment the table names another owner (or, every followRetry, to the
// same one, which may have been claiming), until RelayTimeout after the
// first such answer (a new owner comes within the lease margin and a
// fleet heartbeat of an owner's lease running out) and at most
// followCap after it was first sent; past that the last answer is
// passed on. A member about to be told to give up (relay_members.go) is
// held only until that moment, and then told (UNKNOWN_MEMBER_ID). Without it,
// the client retried after its own backoff (franz-go's grows from 250ms
// to 5s, Kafka's to 1s), which cost a member behind a healthy kproxy
// 1.4-2.2s of the failover after the new owner served its group
// (docs/fleet.md, "Failover, part by part"). Sending it again is what
// the client's retry does: an owner that answers one of these errors
// did not apply the request, or (a write its lease ran out under, the
// answer COORDINATOR_NOT_AVAILABLE) applied it before the next owner's
// claim fenced it, or not at all.
//
// Only the requests that carry a member's progress are followed
// (JoinGroup, SyncGroup, Heartbeat, OffsetCommit,
// ConsumerGroupHeartbeat); an answer the relay makes itself (the owner
// unreachable, silent or too slow: COORDINATOR_NOT_AVAILABLE,
// relay_members.go's UNKNOWN_MEMBER_ID) is never held, since no new owner
// is coming for an owner that keeps its lease.
func (r *Router) relay(d dest, c Client, req kmsg.Request, group string, done func(kmsg.Response)) {
	if d.local || !followed(req) {
		r.send(d, c, req, done)
		return
	}
	f := &follower{
		r: r, c: c, group: group, done: done,
		key: req.Key(), version: req.GetVersion(),
		raw:  req.AppendTo(nil), // req's buffers are the caller's
		sent: time.Now(),
	}
	f.mr, f.tracked = memberOf(req)
	f.sendTo(d, req)
}

// followed says whether relay follows req's group to its next owner.
func followed(req kmsg.Request) bool {
	switch req.(type) {
	case *kmsg.JoinGroupRequest, *kmsg.SyncGroupRequest, *kmsg.HeartbeatRequest,
		*kmsg.OffsetCommitRequest, *kmsg.ConsumerGroupHeartbeatRequest:
		return true
	}
	return false
}

// follower is one request relay follows. Its fields but deadline are
// set before the first send and only read afterwards. deadline is owned
// by whichever goroutine carries the one attempt in flight (an answer
// callback, then wait): attempts follow each other, never overlap.
type follower struct {
	r            *Router
	c            Client
	group        string
	key, version int16
	raw          []byte    // the request's body, to send it again
	sent         time.Time // when it was first sent
	mr           memberReq // the member the request is from, if tracked
	tracked      bool
	deadline     time.Time // set at the first refusal
	done         func(kmsg.Response)
}

// sendTo sends req to d; an answer that d does not serve the group is
// held by wait.
func (f *follower) sendTo(d dest, req kmsg.Request) {
	f.r.sendTo(d, f.c, req, f.done, func(resp kmsg.Response, handedBack bool) bool {
		// An owner that handed the group back to the cluster's
		// coordinator refuses too, and no next owner comes: the
		// member must learn it now and find the cluster's coordinator,
		// as directly, or the cluster gives its partitions to others
		// while it still consumes them.
		if !notServed(answerCode(resp)) || handedBack {
			return false
		}
		now := time.Now()
		if f.deadline.IsZero() {
			f.deadline = now.Add(min(f.r.cfg.RelayTimeout, followCap-now.Sub(f.sent)))
		}
		if f.tracked {
			// A member about to be told to give up
			// (relay_members.go) is told on time: the hold ends at
			// that moment.
			mr := f.mr
			mr.dest = d.memberDest()
			if wait, ok := f.r.members.untilVerdict(mr, now); ok && now.Add(wait).Before(f.deadline) {
				f.deadline = now.Add(wait)
			}
		}
		if !now.Before(f.deadline) {
			return false
		}
		f.r.goWait(func() { f.wait(d, resp) })
		return true
	})
}

// wait holds the answer last that from gave until the table names
// another owner (sent there), followRetry passes (sent to the owner the
// table names, from again if it still does), or the deadline passes
// (last is answered).
func (f *follower) wait(from dest, last kmsg.Response) {
	deadline := time.NewTimer(time.Until(f.deadline))
	defer deadline.Stop()
	retry := time.NewTimer(followRetry)
	defer retry.Stop()
	for {
		changed := f.r.loc.Changed() // before locating: no change is missed
		d, ok := f.r.locate(f.group)
		if ok && d != from {
			f.again(d, last)
			return
		}
		select {
		case <-changed:
		case <-retry.C:
			if ok {
				f.again(d, last)
				return
			}
			retry.Reset(followRetry)
		case <-deadline.C:
			f.expire(from, last)
			return
		case <-f.r.closing:
			f.done(last)
			return
		}
	}
}

// expire answers a request held to its deadline: UNKNOWN_MEMBER_ID when
// its member is to be told to give up by now (judged where its group
// is now, as failMember does), else last, the owner's refusal.
func (f *follower) expire(from dest, last kmsg.Response) {
	if f.tracked {
		mr := f.mr
		mr.dest = from.memberDest()
		if d, ok := f.r.locate(f.mr.key.group); ok {
			mr.dest = d.memberDest()
		}
		if f.r.members.check(mr, time.Now()) {
			if req := f.rebuild(); req != nil {
				f.r.metrics.record(f.key, outcomeMemberExpired, 0)
				f.done(codec.GroupErrorResponse(req, errUnknownMemberID))
				return
			}
		}
	}
	f.done(last)
}

// rebuild decodes the request again from raw; nil if it cannot (it can:
// kmsg decodes what it encoded).
func (f *follower) rebuild() kmsg.Request {
	req := kmsg.RequestForKey(f.key)
	if req == nil {
		return nil
	}
	req.SetVersion(f.version)
	if err := req.ReadFrom(f.raw); err != nil {
		return nil
	}
	return req
}

// again sends the request to d once more; last is answered if it cannot
// be rebuilt (it can: kmsg decodes what it encoded).
func (f *follower) again(d dest, last kmsg.Response) {
	req := f.rebuild()
	if req == nil {
		f.done(last)
		return
	}
	if d.local {
		f.r.send(d, f.c, req, f.done)
		return
	}
	f.sendTo(d, req)
}
