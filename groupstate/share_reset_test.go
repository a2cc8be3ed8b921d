package groupstate

import (
	"math"
	"testing"
	"time"
)

// TestShareResetDuration: share.auto.offset.reset's by_duration form
// parses the ISO-8601 durations Java's Duration.parse takes (without a
// sign), and refuses the others.
func TestShareResetDuration(t *testing.T) {
	for _, tc := range []struct {
		reset string
		want  time.Duration
	}{
		{"by_duration:PT1H", time.Hour},
		{"by_duration:P1D", 24 * time.Hour},
		{"by_duration:PT0S", 0},
		{"by_duration:P0D", 0},
		{"by_duration:PT30M", 30 * time.Minute},
		{"by_duration:PT45S", 45 * time.Second},
		{"by_duration:P1DT2H3M4.5S", 26*time.Hour + 3*time.Minute + 4500*time.Millisecond},
		{"by_duration:PT0.000000001S", time.Nanosecond},
		{"by_duration:PT1,25S", 1250 * time.Millisecond},
		{"by_duration:PT1.S", time.Second},      // Java: an empty fraction is 0
		{"by_duration:pt2h", 2 * time.Hour},     // letters in either case
		{"by_duration:P1Dt", 24 * time.Hour},    // Java refuses an empty time part after an upper-case T only
		{"by_duration:PT90M", 90 * time.Minute}, // no carrying rules
		{"by_duration:PT36H", 36 * time.Hour},
		{"by_duration:P200000D", math.MaxInt64},                 // within Java's range, beyond time.Duration's
		{"by_duration:PT9223372036854775807S", math.MaxInt64},   // Java's largest
		{"by_duration:P106751991167300DT15M", math.MaxInt64},    // 9223372036854720000 + 900 s
		{"by_duration:PT9223372036S", 9223372036 * time.Second}, // time.Duration's largest whole seconds
	} {
		d, isDur, err := ShareResetDuration(tc.reset)
		if !isDur || err != nil || d != tc.want {
			t.Errorf("%s: %v %v %v, want %v", tc.reset, d, isDur, err, tc.want)
		}
	}
	for _, reset := range []string{"earliest", "latest", "", "by_duration", "BY_DURATION:PT1H", "by_duration PT1H", " by_duration:PT1H"} {
		if _, isDur, err := ShareResetDuration(reset); isDur || err != nil {
			t.Errorf("%q: by_duration %v (%v), want not a by_duration value", reset, isDur, err)
		}
	}
	for _, iso := range []string{
		"", "P", "PT", "P1DT", "pT", "1H", "T1H", "P1H", "PT1D", "P1DT1D", "P1W", "P1Y", "P1M", "PT1M1H", "PT1S1M", "PT1H1H",
		"PT1.5H", "PT1.5M", "PT.5S", "PT1.1234567890S", "PT1.5", "PT1", "P1", "P1DX", "PT1H ", " PT1H", "PT 1H",
		"-PT1H", "+PT1H", "PT-1H", "PT+1H", "P-1D", "PT1H-30M", // no sign
		"PT1H30", "PT1H30MS", "P1DT1H2", "PT1_000S", "P١D",
		"PT9223372036854775808S", // more than Long.parseLong takes
		"P106751991167301D",      // days overflow 2^63-1 seconds (Java's multiplyExact)
		"PT153722867280912931M",  // minutes overflow 2^63-1 seconds
		"P106751991167300DT16H",  // the sum overflows (Java's addExact)
	} {
		if d, isDur, err := ShareResetDuration("by_duration:" + iso); !isDur || err == nil {
			t.Errorf("by_duration:%s: %v %v, want a by_duration value that does not parse", iso, d, isDur)
		}
	}
}
