package fleet

import (
	"reflect"
	"testing"
)

func TestMetaRoundTrip(t *testing.T) {
	in := memberMeta{ID: "kp-a", Peer: "127.0.0.1:9093", Owner: true, Partitions: 16, Owned: []ownedPart{{P: 3, Gen: 7}, {P: 9, Gen: 8}}}
	out, err := decodeMeta(encodeMeta(in))
	if err != nil {
		t.Fatal(err)
	}
	in.V = metaVersion
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip: got %+v, want %+v", out, in)
	}
}

func TestAssignmentRoundTrip(t *testing.T) {
	in := assignmentDoc{Gen: 8, Leader: "kp-a", Partitions: 4,
		Table: []tableEntry{{P: 0, ID: "kp-a", MemberID: "m1", Peer: "p:1", Gen: 7}, {P: 3, ID: "kp-b", MemberID: "m2", Gen: 8}},
		Yours: []int32{0}}
	out, err := decodeAssignment(encodeAssignment(in))
	if err != nil {
		t.Fatal(err)
	}
	in.V = metaVersion
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip: got %+v, want %+v", out, in)
	}
}

func TestDecodeForwardCompatible(t *testing.T) {
	// A later version adds fields; v1 readers keep what they know.
	m, err := decodeMeta([]byte(`{"v":2,"id":"kp-z","owner":true,"partitions":16,"owned":[{"p":1,"gen":2}],"zone":"eu-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != "kp-z" || !m.Owner || len(m.Owned) != 1 || m.Owned[0] != (ownedPart{P: 1, Gen: 2}) {
		t.Fatalf("decoded %+v", m)
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, b := range []string{
		``, `{`, `[]`, `{"v":0,"id":"x"}`, `{"id":"x"}`, `{"v":1,"partitions":-1}`, `{"v":1,"partitions":99999999}`,
	} {
		if _, err := decodeMeta([]byte(b)); err == nil {
			t.Errorf("decodeMeta(%q) accepted", b)
		}
	}
	for _, b := range []string{
		``, `{"v":0}`, `{"v":1,"partitions":2,"table":[{"p":2,"member":"m"}]}`,
		`{"v":1,"partitions":2,"yours":[-1]}`, `{"v":1,"partitions":2,"table":[{"p":-3}]}`,
	} {
		if _, err := decodeAssignment([]byte(b)); err == nil {
			t.Errorf("decodeAssignment(%q) accepted", b)
		}
	}
}

// FuzzDecode checks that no input makes the decoders panic and that
// whatever they accept re-encodes to something they accept equally.
func FuzzDecode(f *testing.F) {
	f.Add(encodeMeta(memberMeta{ID: "a", Owner: true, Partitions: 3, Owned: []ownedPart{{P: 1, Gen: 2}}}))
	f.Add(encodeAssignment(assignmentDoc{Gen: 1, Partitions: 3, Table: []tableEntry{{P: 1, ID: "a", MemberID: "m"}}, Yours: []int32{1}}))
	f.Add([]byte(`{"v":1,"partitions":65536,"table":[{"p":65535}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := decodeMeta(b); err == nil {
			m2, err := decodeMeta(encodeMeta(m))
			if err != nil || !reflect.DeepEqual(normMeta(m), normMeta(m2)) {
				t.Fatalf("metadata not stable: %+v vs %+v (%v)", m, m2, err)
			}
		}
		if a, err := decodeAssignment(b); err == nil {
			a2, err := decodeAssignment(encodeAssignment(a))
			if err != nil || !reflect.DeepEqual(normDoc(a), normDoc(a2)) {
				t.Fatalf("assignment not stable: %+v vs %+v (%v)", a, a2, err)
			}
		}
	})
}

func normMeta(m memberMeta) memberMeta {
	m.V = 0
	if len(m.Owned) == 0 {
		m.Owned = nil
	}
	return m
}

func normDoc(a assignmentDoc) assignmentDoc {
	a.V = 0
	if len(a.Table) == 0 {
		a.Table = nil
	}
	if len(a.Yours) == 0 {
		a.Yours = nil
	}
	return a
}
