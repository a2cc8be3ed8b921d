package share

import (
	"errors"
	"testing"
)

func TestValidateAckBatches(t *testing.T) {
	cases := []struct {
		name  string
		acks  []AckBatch
		renew bool
		ok    bool
	}{
		{"empty", nil, false, true},
		{"one type", []AckBatch{{0, 9, []AckType{AckAccept}}}, false, true},
		{"per offset", []AckBatch{{0, 2, []AckType{0, 1, 2}}}, false, true},
		{"ascending", []AckBatch{{0, 2, []AckType{1}}, {5, 6, []AckType{3}}}, false, true},
		{"touching", []AckBatch{{0, 2, []AckType{1}}, {2, 6, []AckType{3}}}, false, true},
		{"first after last", []AckBatch{{3, 2, []AckType{1}}}, false, false},
		{"overlap", []AckBatch{{0, 5, []AckType{1}}, {4, 6, []AckType{1}}}, false, false},
		{"descending", []AckBatch{{5, 6, []AckType{1}}, {0, 1, []AckType{1}}}, false, false},
		{"no types", []AckBatch{{0, 1, nil}}, false, false},
		{"type count", []AckBatch{{0, 2, []AckType{1, 1}}}, false, false},
		{"type range", []AckBatch{{0, 0, []AckType{5}}}, true, false},
		{"negative type", []AckBatch{{0, 0, []AckType{-1}}}, true, false},
		{"renew not allowed", []AckBatch{{0, 0, []AckType{AckRenew}}}, false, false},
		{"renew allowed", []AckBatch{{0, 0, []AckType{AckRenew}}}, true, true},
		{"renew per offset", []AckBatch{{0, 1, []AckType{AckAccept, AckRenew}}}, false, false},
	}
	for _, c := range cases {
		err := ValidateAckBatches(c.acks, c.renew)
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok=%v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidAckBatch) {
			t.Errorf("%s: %v does not wrap ErrInvalidAckBatch", c.name, err)
		}
	}
}
