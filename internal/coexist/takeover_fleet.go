package coexist

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/proxy"
)

// Takeover reports between the kproxies of a fleet. A kproxy that
// forwards members of a group another kproxy owns tells that owner, every
// takeoverInterval, what it knows of them (memberReport), and the owner
// answers whether to stop forwarding the group (it is taking the group
// over). A report is a kproxy message of its own on the peer wire
// (proxy/peer_message.go): type reportType, version reportVersion, the
// report in JSON; the answer is a reportAnswer in JSON. An owner that
// does not know the type (a kproxy of an earlier version) answers with
// an error: the report is not delivered, so that owner takes over no
// group whose members are behind this kproxy, and the group stays
// forwarded until the upgrade reaches it.

const (
	reportType    = "takeover.report"
	reportVersion = 0
	// reportFresh is how long a report counts.
	reportFresh = 3 * time.Second
)

// reportAnswer is the owner's answer to a report.
type reportAnswer struct {
	// Release: stop forwarding the group, the owner takes it over.
	Release bool `json:"release"`
	// Members are the member ids the anchor replaces: the reporter
	// keeps serving the group here while the cluster's group still
	// lists one of them (forwardSet.decide).
	Members []string `json:"members,omitempty"`
}

// memberReport is one kproxy's report on the members of one group it
// forwards.
type memberReport struct {
	Group    string           `json:"group"`
	From     string           `json:"from"`
	Members  []reportedMember `json:"members"`
	InFlight int              `json:"in_flight"`
	// Joining is how many of those are JoinGroup, SyncGroup or
	// LeaveGroup requests.
	Joining int `json:"joining"`
	// Released says the kproxy stopped forwarding the group (the owner
	// asked it to) and InFlight of its requests are still out.
	Released bool `json:"released,omitempty"`
	// Fenced are the KIP-848 members whose heartbeat, forwarded here,
	// the cluster answered UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH in
	// the last fencedKeep, with how long before the report (ms): a
	// hand-back of the group waits for kproxy's members to be told so
	// (anchor_takeover_kip848.go). An owner of an earlier version
	// ignores the field.
	Fenced map[string]int64 `json:"fenced_ago_ms,omitempty"`
}

type reportedMember struct {
	ID           string          `json:"id"`
	InstanceID   *string         `json:"instance_id,omitempty"`
	ClientID     string          `json:"client_id"`
	ClientHost   string          `json:"client_host"`
	ProtocolType string          `json:"protocol_type"`
	Protocol     string          `json:"protocol"`
	Protocols    []namedMetadata `json:"protocols"`
	Leader       string          `json:"leader"`
	Generation   int32           `json:"generation"`
	SessionMS    int32           `json:"session_ms"`
	RebalanceMS  int32           `json:"rebalance_ms"`
	Synced       bool            `json:"synced"`
	// SinceOK is how long ago an answer at its generation came without
	// error, in milliseconds.
	SinceOK int64 `json:"since_ok_ms"`
	// KIP848 is set for a KIP-848 member (takeover_kip848.go).
	KIP848 *kip848Member `json:"kip848,omitempty"`
}

type namedMetadata struct {
	Name     string `json:"name"`
	Metadata []byte `json:"metadata"`
}

// remoteReport is a report received, with when.
type remoteReport struct {
	memberReport
	at time.Time
}

// member turns a reported member back into a watched one, as of at.
func (r reportedMember) member(at time.Time) *watchedMember {
	m := &watchedMember{
		instanceID: r.InstanceID, clientID: r.ClientID, clientHost: r.ClientHost,
		protocolType: r.ProtocolType, protocol: r.Protocol, leader: r.Leader,
		generation: r.Generation, sessionMS: r.SessionMS, rebalanceMS: r.RebalanceMS,
		synced: r.Synced, lastOK: at.Add(-time.Duration(r.SinceOK) * time.Millisecond),
		kip848: r.KIP848.clone(at),
	}
	for _, p := range r.Protocols {
		m.protocols = append(m.protocols, kmsg.JoinGroupRequestProtocol{Name: p.Name, Metadata: p.Metadata})
	}
	return m
}

// reportLocked builds the report of group g; w.mu is held.
func (w *forwardWatcher) reportLocked(group string, g *watchedGroup, now time.Time) memberReport {
	r := memberReport{Group: group, From: w.id, InFlight: len(g.inFlight), Joining: g.joining(), Fenced: g.fencedAgo(now)}
	for id, m := range g.members {
		rm := reportedMember{
			ID: id, InstanceID: cloneString(m.instanceID), ClientID: m.clientID, ClientHost: m.clientHost,
			ProtocolType: m.protocolType, Protocol: m.protocol, Leader: m.leader, Generation: m.generation,
			SessionMS: m.sessionMS, RebalanceMS: m.rebalanceMS, Synced: m.synced, SinceOK: now.Sub(m.lastOK).Milliseconds(),
			KIP848: m.kip848.report(now),
		}
		for _, p := range m.protocols {
			rm.Protocols = append(rm.Protocols, namedMetadata{Name: p.Name, Metadata: p.Metadata})
		}
		r.Members = append(r.Members, rm)
	}
	return r
}

// reportTimeout bounds a report's round trip to the group's owner.
const reportTimeout = 5 * time.Second

// reportAsync sends r (report) off the takeover loop, one report per
// group at a time: a report held up on its way to the owner must not
// delay the checks and reports of the next ticks.
func (w *forwardWatcher) reportAsync(ctx context.Context, r memberReport) {
	w.mu.Lock()
	if w.reporting[r.Group] {
		w.mu.Unlock()
		return
	}
	w.reporting[r.Group] = true
	w.mu.Unlock()
	go func() {
		defer func() {
			w.mu.Lock()
			delete(w.reporting, r.Group)
			w.mu.Unlock()
		}()
		w.report(ctx, r)
	}()
}

// report sends r to its group's owner; if the owner takes the group over,
// this kproxy stops forwarding it, waits for its requests on their way to
// the cluster and says so.
func (w *forwardWatcher) report(ctx context.Context, r memberReport) {
	if w.send == nil {
		return
	}
	release, members := w.sendReport(ctx, r)
	w.log.Debug("takeover: reported the group's members to its owner", "group", r.Group, "members", len(r.Members),
		"in_flight", r.InFlight, "joining", r.Joining, "release", release)
	if !release {
		return
	}
	w.mu.Lock()
	w.draining[r.Group] = true
	w.mu.Unlock()
	w.fw.takeOver(r.Group, members)
	w.log.Info("takeover: the group's owner takes it over; its requests go to the owner from now on", "group", r.Group)
	go func() {
		deadline := time.Now().Add(takeoverDrain)
		for {
			w.mu.Lock()
			n := 0
			if g := w.groups[r.Group]; g != nil {
				n = len(g.inFlight)
			}
			w.mu.Unlock()
			if n == 0 || time.Now().After(deadline) || ctx.Err() != nil {
				final := memberReport{Group: r.Group, From: w.id, InFlight: n, Released: true}
				_, _ = w.sendReport(ctx, final)
				w.mu.Lock()
				delete(w.groups, r.Group)
				delete(w.draining, r.Group)
				w.mu.Unlock()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
}

// sendReport sends r to its group's owner and reports whether the owner
// answered that it takes the group over, and the member ids the anchor
// replaces then.
func (w *forwardWatcher) sendReport(ctx context.Context, r memberReport) (release bool, members []string) {
	body, err := json.Marshal(r)
	if err != nil {
		w.log.Error("takeover: encoding a report", "group", r.Group, "err", err)
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, reportTimeout)
	defer cancel()
	out, err := w.send(ctx, r.Group, reportType, reportVersion, body)
	if err != nil {
		w.log.Debug("takeover: the group's owner did not take the report", "group", r.Group, "reason", err.Error())
		return false, nil
	}
	var a reportAnswer
	if err := json.Unmarshal(out, &a); err != nil {
		w.log.Warn("takeover: the group's owner answered a report with something unreadable", "group", r.Group, "err", err)
		return false, nil
	}
	return a.Release, a.Members
}

// handleReport is the handler of reportType messages: the report of
// another kproxy, answered with a reportAnswer.
func (w *forwardWatcher) handleReport(_ context.Context, _ int16, payload []byte) ([]byte, error) {
	var r memberReport
	if err := json.Unmarshal(payload, &r); err != nil {
		return nil, fmt.Errorf("takeover report: %w: %w", proxy.ErrPeerMalformed, err)
	}
	if r.Group == "" || r.From == "" {
		return nil, fmt.Errorf("takeover report without a group or a sender: %w", proxy.ErrPeerMalformed)
	}
	var a reportAnswer
	a.Release, a.Members = w.onReport(r)
	return json.Marshal(a)
}

// onReport records a report from another kproxy and answers whether it
// must stop forwarding the group, with the member ids the anchor replaces.
func (w *forwardWatcher) onReport(r memberReport) (release bool, members []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rel := w.releasing[r.Group]; rel != nil {
		if r.Released && r.InFlight == 0 {
			delete(rel.waiting, r.From)
			if len(rel.waiting) == 0 {
				select {
				case w.released <- struct{}{}:
				default:
				}
			}
		} else if !r.Released {
			rel.waiting[r.From] = true
		}
		return true, rel.members
	}
	if r.Released {
		return false, nil
	}
	byFrom := w.remote[r.Group]
	if byFrom == nil {
		if len(w.remote) >= maxWatchedGroups {
			return false, nil
		}
		byFrom = make(map[string]remoteReport)
		w.remote[r.Group] = byFrom
	}
	byFrom[r.From] = remoteReport{memberReport: r, at: time.Now()}
	w.log.Debug("takeover: report received", "group", r.Group, "from", r.From, "members", len(r.Members), "joining", r.Joining)
	return false, nil
}

// legacyReportGuard is the engine's Coordinator in a fleet with anchors:
// it refuses the takeover reports of kproxies from before reports were
// kproxy messages, which arrive as JoinGroups of protocol type
// legacyReportProtocolType from client legacyReportClientID with no
// client address (real clients' requests always carry one), so that the
// engine never admits one as a member. Refused, such a report is not
// delivered, as a report to an owner of that version is not.
type legacyReportGuard struct {
	proxy.Coordinator
}

const (
	legacyReportClientID     = "kproxy-takeover"
	legacyReportProtocolType = "kproxy-takeover-report"
)

func (c legacyReportGuard) Handle(cl proxy.Client, req kmsg.Request, reply func(kmsg.Response)) {
	jr, ok := req.(*kmsg.JoinGroupRequest)
	if !ok || cl.Host != "" || cl.ID != legacyReportClientID || jr.ProtocolType != legacyReportProtocolType {
		c.Coordinator.Handle(cl, req, reply)
		return
	}
	resp := kmsg.NewPtrJoinGroupResponse()
	resp.SetVersion(jr.GetVersion())
	resp.ErrorCode = 42 // INVALID_REQUEST
	reply(resp)
}
