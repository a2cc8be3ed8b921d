package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
)

// The fleet group's protocol metadata (JoinGroup) and member assignment
// (SyncGroup) are small JSON documents, chosen over a binary layout
// because they are tiny (P entries), read by humans in DescribeGroups
// output and in traces, and extend without a schema registry.
//
// Versioning: every document carries "v". Version 1 is described below.
// A later version may add fields but keeps the meaning of every v1 field,
// and a reader ignores fields it does not know, so kproxies of different
// versions can share a fleet during a rolling upgrade. A reader refuses a
// document whose "v" is below 1 (not ours).
//
// Metadata v1 (one per member, in JoinGroup):
//
//	{"v":1,"id":"kp-a","peer":"10.0.0.1:9093","owner":true,"partitions":16,
//	 "owned":[{"p":3,"gen":7}]}
//
// id is the kproxy's stable id, peer its advertised peer address, owner
// false for a relay (it may own nothing), partitions the P it was
// configured with, owned the partitions it holds right now with the fleet
// generation in which it was given each.
//
// Assignment v1 (one per member, in SyncGroup; the table part is the same
// for every member of a generation):
//
//	{"v":1,"gen":8,"leader":"kp-a","partitions":16,
//	 "table":[{"p":3,"id":"kp-a","member":"kp-a-1f2e…","peer":"10.0.0.1:9093","gen":7}],
//	 "yours":[3]}
//
// gen is the fleet generation the assignment belongs to, leader the
// kproxy id of the member that computed it, table one entry per
// partition that has an owner in this generation (a partition missing
// from it has none: it is in transition), gen in an entry the generation
// since which that owner holds it, yours the partitions assigned to the
// recipient.

// metaVersion is the version this package writes.
const metaVersion = 1

// memberMeta is the decoded JoinGroup protocol metadata of one member.
type memberMeta struct {
	V          int         `json:"v"`
	ID         string      `json:"id"`
	Peer       string      `json:"peer,omitempty"`
	Owner      bool        `json:"owner"`
	Partitions int32       `json:"partitions"`
	Owned      []ownedPart `json:"owned,omitempty"`
}

// ownedPart is one partition a member holds, with the generation since
// which it holds it.
type ownedPart struct {
	P   int32 `json:"p"`
	Gen int32 `json:"gen"`
}

// assignmentDoc is the decoded SyncGroup member assignment.
type assignmentDoc struct {
	V          int          `json:"v"`
	Gen        int32        `json:"gen"`
	Leader     string       `json:"leader,omitempty"`
	Partitions int32        `json:"partitions"`
	Table      []tableEntry `json:"table,omitempty"`
	Yours      []int32      `json:"yours,omitempty"`
}

// tableEntry is one assigned partition in an assignment's table.
type tableEntry struct {
	P        int32  `json:"p"`
	ID       string `json:"id"`
	MemberID string `json:"member"`
	Peer     string `json:"peer,omitempty"`
	Gen      int32  `json:"gen"`
}

// maxDocPartitions bounds what a decoder accepts, so a hostile or corrupt
// document cannot make a member allocate a huge table.
const maxDocPartitions = 1 << 16

func encodeMeta(m memberMeta) []byte {
	m.V = metaVersion
	b, _ := json.Marshal(m) // cannot fail: plain strings, ints and bools
	return b
}

func decodeMeta(b []byte) (memberMeta, error) {
	var m memberMeta
	if len(b) == 0 {
		return m, errors.New("empty metadata")
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return memberMeta{}, fmt.Errorf("decoding fleet metadata: %w", err)
	}
	if m.V < 1 {
		return memberMeta{}, fmt.Errorf("fleet metadata version %d unknown", m.V)
	}
	if m.Partitions < 0 || m.Partitions > maxDocPartitions {
		return memberMeta{}, fmt.Errorf("fleet metadata: partitions %d out of range", m.Partitions)
	}
	return m, nil
}

func encodeAssignment(a assignmentDoc) []byte {
	a.V = metaVersion
	b, _ := json.Marshal(a) // cannot fail: plain strings, ints and bools
	return b
}

func decodeAssignment(b []byte) (assignmentDoc, error) {
	var a assignmentDoc
	if len(b) == 0 {
		return a, errors.New("empty assignment")
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return assignmentDoc{}, fmt.Errorf("decoding fleet assignment: %w", err)
	}
	if a.V < 1 {
		return assignmentDoc{}, fmt.Errorf("fleet assignment version %d unknown", a.V)
	}
	if a.Partitions < 0 || a.Partitions > maxDocPartitions {
		return assignmentDoc{}, fmt.Errorf("fleet assignment: partitions %d out of range", a.Partitions)
	}
	for _, e := range a.Table {
		if e.P < 0 || e.P >= a.Partitions {
			return assignmentDoc{}, fmt.Errorf("fleet assignment: table partition %d out of range [0,%d)", e.P, a.Partitions)
		}
	}
	for _, p := range a.Yours {
		if p < 0 || p >= a.Partitions {
			return assignmentDoc{}, fmt.Errorf("fleet assignment: own partition %d out of range [0,%d)", p, a.Partitions)
		}
	}
	return a, nil
}
