package groupstate

import (
	"bytes"
	"sort"
)

// This file holds the KIP-848 server-side assignors (uniform and range,
// after Kafka's UniformAssignor and RangeAssignor) as pure
// functions: they read their input and return a fresh target assignment,
// touching no group state.

// topicID is a topic's UUID as KIP-848 requests name topics.
type topicID = [16]byte

// partSet is a set of partitions per topic.
type partSet map[topicID]map[int32]struct{}

// add inserts topic/partition.
func (ps partSet) add(t topicID, p int32) {
	m := ps[t]
	if m == nil {
		m = make(map[int32]struct{})
		ps[t] = m
	}
	m[p] = struct{}{}
}

// has reports whether topic/partition is in the set.
func (ps partSet) has(t topicID, p int32) bool {
	_, ok := ps[t][p]
	return ok
}

// size counts the partitions in the set.
func (ps partSet) size() int {
	n := 0
	for _, m := range ps {
		n += len(m)
	}
	return n
}

// clone returns a deep copy of the set.
func (ps partSet) clone() partSet {
	out := make(partSet, len(ps))
	for t, m := range ps {
		for p := range m {
			out.add(t, p)
		}
	}
	return out
}

// equal reports whether both sets hold the same partitions.
func (ps partSet) equal(o partSet) bool {
	if ps.size() != o.size() {
		return false
	}
	for t, m := range ps {
		for p := range m {
			if !o.has(t, p) {
				return false
			}
		}
	}
	return true
}

// sortedTopics returns the set's topics with at least one partition, in
// byte order.
func (ps partSet) sortedTopics() []topicID {
	out := make([]topicID, 0, len(ps))
	for t, m := range ps {
		if len(m) > 0 {
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i][:], out[j][:]) < 0 })
	return out
}

// sortedPartitions returns the partitions of topic t in order.
func (ps partSet) sortedPartitions(t topicID) []int32 {
	out := make([]int32, 0, len(ps[t]))
	for p := range ps[t] {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// assignMember is one member as an assignor sees it.
type assignMember struct {
	ID         string
	InstanceID string
	// Topics are the member's subscribed topics that exist.
	Topics []topicID
	// Current is the member's current target, for stickiness.
	Current partSet
}

// Assignor names (ServerAssignor in ConsumerGroupHeartbeat).
const (
	AssignorUniform = "uniform"
	AssignorRange   = "range"
)

// assignorFunc computes a target assignment: every partition of every
// topic some member subscribes to, given partition counts, goes to
// exactly one of its subscribers.
type assignorFunc func(members []assignMember, partitions map[topicID]int32) map[string]partSet

// assignors maps the assignor names the engine serves to their function.
var assignors = map[string]assignorFunc{
	AssignorUniform: assignUniform,
	AssignorRange:   assignRange,
}

// subscribersByTopic returns, per topic that exists, the indexes of its
// subscribers in members order.
func subscribersByTopic(members []assignMember, partitions map[topicID]int32) map[topicID][]int {
	out := make(map[topicID][]int)
	for i, m := range members {
		for _, t := range m.Topics {
			if _, ok := partitions[t]; ok {
				out[t] = append(out[t], i)
			}
		}
	}
	return out
}

// sameSubscriptions reports whether every member subscribes to the same
// set of topics.
func sameSubscriptions(members []assignMember) bool {
	if len(members) == 0 {
		return true
	}
	key := func(ts []topicID) string {
		c := append([]topicID(nil), ts...)
		sort.Slice(c, func(i, j int) bool { return bytes.Compare(c[i][:], c[j][:]) < 0 })
		var b bytes.Buffer
		for i, t := range c {
			if i > 0 && t == c[i-1] {
				continue
			}
			b.Write(t[:])
		}
		return b.String()
	}
	first := key(members[0].Topics)
	for _, m := range members[1:] {
		if key(m.Topics) != first {
			return false
		}
	}
	return true
}

// tp is one topic partition.
type tp struct {
	t topicID
	p int32
}

// assignUniform is the uniform assignor: with identical subscriptions
// every member gets P/M partitions (P mod M of them one more), keeping
// the partitions it had up to that quota; balance comes before
// stickiness. With mixed subscriptions each topic is balanced the same
// way among its own subscribers.
func assignUniform(members []assignMember, partitions map[topicID]int32) map[string]partSet {
	out := make(map[string]partSet, len(members))
	for _, m := range members {
		out[m.ID] = partSet{}
	}
	if len(members) == 0 {
		return out
	}
	order := make([]int, len(members))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return members[order[a]].ID < members[order[b]].ID })
	subs := subscribersByTopic(members, partitions)
	if sameSubscriptions(members) {
		var all []tp
		topics := make([]topicID, 0, len(subs))
		for t := range subs {
			topics = append(topics, t)
		}
		sort.Slice(topics, func(i, j int) bool { return bytes.Compare(topics[i][:], topics[j][:]) < 0 })
		for _, t := range topics {
			for p := int32(0); p < partitions[t]; p++ {
				all = append(all, tp{t, p})
			}
		}
		balanceSticky(members, order, all, out)
		return out
	}
	for t, idx := range subs {
		in := make(map[int]bool, len(idx))
		for _, i := range idx {
			in[i] = true
		}
		var sub []int
		for _, i := range order {
			if in[i] {
				sub = append(sub, i)
			}
		}
		var all []tp
		for p := int32(0); p < partitions[t]; p++ {
			all = append(all, tp{t, p})
		}
		balanceSticky(members, sub, all, out)
	}
	return out
}

// balanceSticky spreads parts over the members at indexes order (sorted
// by id): each gets len/n or one more, keeping what it currently holds
// up to its quota. Results are added to out.
func balanceSticky(members []assignMember, order []int, parts []tp, out map[string]partSet) {
	n := len(order)
	if n == 0 || len(parts) == 0 {
		return
	}
	base, extra := len(parts)/n, len(parts)%n
	inPool := make(map[tp]bool, len(parts))
	for _, x := range parts {
		inPool[x] = true
	}
	taken := make(map[tp]bool, len(parts))
	kept := make([][]tp, n)
	current := make([][]tp, n)
	for k, i := range order {
		m := members[i]
		for _, t := range m.Current.sortedTopics() {
			for _, p := range m.Current.sortedPartitions(t) {
				x := tp{t, p}
				if inPool[x] && !taken[x] {
					current[k] = append(current[k], x)
					taken[x] = true
				}
			}
		}
	}
	quota := make([]int, n)
	for k := range order {
		quota[k] = base
	}
	// Members that already hold more than the base keep one extra while
	// extras remain; the remaining extras go to the others in order.
	for k := range order {
		if extra > 0 && len(current[k]) > base {
			quota[k]++
			extra--
		}
	}
	for k := range order {
		if extra == 0 {
			break
		}
		if quota[k] == base {
			quota[k]++
			extra--
		}
	}
	clear(taken)
	for k := range order {
		c := current[k]
		if len(c) > quota[k] {
			c = c[:quota[k]]
		}
		kept[k] = c
		for _, x := range c {
			taken[x] = true
		}
	}
	next := 0
	for k, i := range order {
		ps := out[members[i].ID]
		for _, x := range kept[k] {
			ps.add(x.t, x.p)
		}
		for need := quota[k] - len(kept[k]); need > 0; need-- {
			for next < len(parts) && taken[parts[next]] {
				next++
			}
			if next == len(parts) {
				break
			}
			x := parts[next]
			taken[x] = true
			ps.add(x.t, x.p)
		}
	}
}

// assignRange is the range assignor: members sorted static first (by
// instance id), then by member id; per topic its n subscribers take
// contiguous ranges of P/n partitions, the first P mod n one more. No
// stickiness: equal subscriptions and counts give co-partitioning.
func assignRange(members []assignMember, partitions map[topicID]int32) map[string]partSet {
	out := make(map[string]partSet, len(members))
	for _, m := range members {
		out[m.ID] = partSet{}
	}
	order := make([]int, len(members))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool {
		x, y := members[order[a]], members[order[b]]
		if (x.InstanceID != "") != (y.InstanceID != "") {
			return x.InstanceID != ""
		}
		if x.InstanceID != y.InstanceID {
			return x.InstanceID < y.InstanceID
		}
		return x.ID < y.ID
	})
	rank := make(map[int]int, len(order))
	for r, i := range order {
		rank[i] = r
	}
	for t, idx := range subscribersByTopic(members, partitions) {
		sub := append([]int(nil), idx...)
		sort.Slice(sub, func(a, b int) bool { return rank[sub[a]] < rank[sub[b]] })
		n := int32(len(sub))
		count := partitions[t]
		per, extra := count/n, count%n
		start := int32(0)
		for k, i := range sub {
			size := per
			if int32(k) < extra {
				size++
			}
			for p := start; p < start+size; p++ {
				out[members[i].ID].add(t, p)
			}
			start += size
		}
	}
	return out
}
