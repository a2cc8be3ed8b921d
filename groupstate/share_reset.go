package groupstate

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ShareResetDuration returns the duration of a share.auto.offset.reset of
// the form by_duration:<ISO-8601 duration> (KIP-932; Kafka's
// ShareGroupAutoOffsetResetStrategy): a share-partition with no state
// starts at the first record whose timestamp is at or after now minus
// the duration. isDuration is false for any other value (earliest,
// latest); err is set when the duration does not parse. The prefix is
// matched exactly, as Kafka matches it.
func ShareResetDuration(reset string) (d time.Duration, isDuration bool, err error) {
	iso, ok := strings.CutPrefix(reset, "by_duration:")
	if !ok {
		return 0, false, nil
	}
	d, err = parseISODuration(iso)
	return d, true, err
}

// parseISODuration parses the ISO-8601 durations Java's Duration.parse
// takes (PnDTnHnMn.nS), without a sign: days, then after a T hours,
// minutes and seconds, each optional but at least one there, in that
// order; up to nine fraction digits after a period or a comma, on the
// seconds only; letters in either case. A T with no time part after it
// is refused when it is an upper-case T (Java checks only that one: P1Dt
// is a day there). Java refuses a duration of more than 2^63-1 seconds;
// one within that but beyond time.Duration's range (about 292 years)
// comes back as the largest time.Duration.
func parseISODuration(s string) (time.Duration, error) {
	bad := func(why string) (time.Duration, error) {
		return 0, fmt.Errorf("duration %q: %s (the form is PnDTnHnMn.nS)", s, why)
	}
	if s == "" || (s[0] != 'P' && s[0] != 'p') {
		return bad("no leading P")
	}
	var (
		secs  int64 // the sum of the parts, in seconds
		nanos int64 // the fraction of the seconds part
		parts int
	)
	// add adds n units of mult seconds to secs; false on an overflow of
	// int64 seconds, where Java's multiplyExact or addExact throws.
	add := func(n, mult int64) bool {
		if n > math.MaxInt64/mult {
			return false
		}
		if n *= mult; secs > math.MaxInt64-n {
			return false
		}
		secs += n
		parts++
		return true
	}
	// number reads the digits at s[i:]; ok is false when there are none
	// or they overflow an int64 (Java's Long.parseLong).
	number := func(i int) (n int64, end int, ok bool) {
		end = i
		for end < len(s) && s[end] >= '0' && s[end] <= '9' {
			end++
		}
		if end == i {
			return 0, i, false
		}
		n, err := strconv.ParseInt(s[i:end], 10, 64)
		return n, end, err == nil
	}
	i := 1
	if i < len(s) && s[i] >= '0' && s[i] <= '9' {
		n, end, ok := number(i)
		if !ok || end == len(s) || (s[end] != 'D' && s[end] != 'd') {
			return bad("a number that is not a count of days before the T")
		}
		if !add(n, 86400) {
			return bad("too long")
		}
		i = end + 1
	}
	if i < len(s) {
		if s[i] != 'T' && s[i] != 't' {
			return bad("unexpected " + strconv.Quote(s[i:i+1]))
		}
		upperT := s[i] == 'T'
		i++
		const units = "HMS"
		next, timeParts := 0, 0 // the first unit still allowed; time parts read
		for i < len(s) {
			n, end, ok := number(i)
			if !ok {
				return bad("a time part without a number")
			}
			frac, hasFrac := "", false
			if end < len(s) && (s[end] == '.' || s[end] == ',') {
				hasFrac = true
				f := end + 1
				end = f
				for end < len(s) && s[end] >= '0' && s[end] <= '9' {
					end++
				}
				if frac = s[f:end]; len(frac) > 9 {
					return bad("more than nine fraction digits")
				}
			}
			if end == len(s) {
				return bad("a number without its unit")
			}
			u := strings.IndexByte(units, s[end]&^0x20) // upper case
			if u < next || (hasFrac && u != 2) {
				return bad("unexpected " + strconv.Quote(s[end:end+1]))
			}
			if !add(n, []int64{3600, 60, 1}[u]) {
				return bad("too long")
			}
			if hasFrac {
				nanos, _ = strconv.ParseInt((frac + "000000000")[:9], 10, 64)
			}
			next, i = u+1, end+1
			timeParts++
		}
		if timeParts == 0 && upperT {
			return bad("a T without a time part")
		}
	}
	if parts == 0 {
		return bad("no part")
	}
	if secs > (math.MaxInt64-nanos)/int64(time.Second) {
		return math.MaxInt64, nil
	}
	return time.Duration(secs)*time.Second + time.Duration(nanos), nil
}
