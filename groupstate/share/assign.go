package share

import (
	"bytes"
	"slices"
	"sort"
)

// TopicPartition names a partition by topic ID, as share-group requests
// and assignments do.
type TopicPartition struct {
	TopicID   [16]byte
	Partition int32
}

func compareTP(a, b TopicPartition) int {
	if c := bytes.Compare(a.TopicID[:], b.TopicID[:]); c != 0 {
		return c
	}
	return int(a.Partition) - int(b.Partition)
}

// Member is a share-group member as the assignor sees it: its id and the
// topic names it subscribes to.
type Member struct {
	ID     string
	Topics []string
}

// Topic describes a topic of the cluster: its ID and partition count.
type Topic struct {
	ID         [16]byte
	Partitions int32
}

// Assign computes the target assignment of the "simple" share-group
// assignor (KIP-932; Kafka's SimpleAssignor): every partition of a
// subscribed topic (topics absent from topics are ignored) goes to
// ⌈members/partitions⌉ of its subscribers, so that when there are more
// members than partitions a partition is shared. When all members
// subscribe to the same topics, assignment sizes differ by at most one;
// otherwise each topic is balanced over its own subscribers, as Kafka's
// heterogeneous builder does. Balance comes first, then stickiness: a
// member keeps the partitions of current it still subscribes to as far
// as balance allows. The result has an entry, possibly empty, for every
// member, with partitions sorted; it depends only on the arguments.
func Assign(members []Member, topics map[string]Topic, current map[string][]TopicPartition) map[string][]TopicPartition {
	ms := slices.Clone(members)
	sort.Slice(ms, func(i, j int) bool { return ms[i].ID < ms[j].ID })
	ms = slices.CompactFunc(ms, func(a, b Member) bool { return a.ID == b.ID })

	// Resolve subscriptions to topic IDs, sorted by name.
	subs := make([][]string, len(ms))
	homogeneous := true
	for i, m := range ms {
		var names []string
		for _, n := range m.Topics {
			if t, ok := topics[n]; ok && t.Partitions > 0 {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		subs[i] = slices.Compact(names)
		if i > 0 && !slices.Equal(subs[i], subs[0]) {
			homogeneous = false
		}
	}

	out := make(map[string][]TopicPartition, len(ms))
	for _, m := range ms {
		out[m.ID] = nil
	}
	if len(ms) == 0 {
		return out
	}
	cur := make([]map[TopicPartition]bool, len(ms))
	for i, m := range ms {
		cur[i] = map[TopicPartition]bool{}
		for _, tp := range current[m.ID] {
			cur[i][tp] = true
		}
	}
	partitionsOf := func(names []string) []TopicPartition {
		var ps []TopicPartition
		for _, n := range names {
			t := topics[n]
			for p := int32(0); p < t.Partitions; p++ {
				ps = append(ps, TopicPartition{TopicID: t.ID, Partition: p})
			}
		}
		return ps
	}
	all := make([]int, len(ms))
	for i := range all {
		all[i] = i
	}
	if homogeneous {
		assignPool(all, partitionsOf(subs[0]), cur, ms, out)
	} else {
		var names []string
		for _, s := range subs {
			names = append(names, s...)
		}
		sort.Strings(names)
		for _, n := range slices.Compact(names) {
			var who []int
			for i, s := range subs {
				if _, ok := slices.BinarySearch(s, n); ok {
					who = append(who, i)
				}
			}
			assignPool(who, partitionsOf([]string{n}), cur, ms, out)
		}
	}
	for id := range out {
		slices.SortFunc(out[id], compareTP)
	}
	return out
}

// assignPool assigns parts over the members who (indexes into ms, sorted
// by ID), keeping current ownership where balance allows.
func assignPool(who []int, parts []TopicPartition, cur []map[TopicPartition]bool, ms []Member, out map[string][]TopicPartition) {
	if len(parts) == 0 || len(who) == 0 {
		return
	}
	res, ok := fillPool(who, parts, cur, true)
	if !ok {
		// Kept partitions boxed the fill in; balance wins over stickiness.
		res, _ = fillPool(who, parts, cur, false)
	}
	for k, i := range who {
		out[ms[i].ID] = append(out[ms[i].ID], res[k]...)
	}
}

// fillPool returns, per member of who, its partitions, and whether every
// partition reached the desired sharing.
func fillPool(who []int, parts []TopicPartition, cur []map[TopicPartition]bool, sticky bool) ([][]TopicPartition, bool) {
	m, p := len(who), len(parts)
	sharing := (m + p - 1) / p
	total := sharing * p
	base, extra := total/m, total%m

	// Members that own more of parts today get the extra slots.
	owned := make([]int, m)
	if sticky {
		for k, i := range who {
			for _, tp := range parts {
				if cur[i][tp] {
					owned[k]++
				}
			}
		}
	}
	order := make([]int, m)
	for k := range order {
		order[k] = k
	}
	sort.SliceStable(order, func(a, b int) bool { return owned[order[a]] > owned[order[b]] })
	desired := make([]int, m)
	for r, k := range order {
		desired[k] = base
		if r < extra {
			desired[k]++
		}
	}

	res := make([][]TopicPartition, m)
	holders := make([][]int, p) // per partition, member positions in who
	has := make([]map[int]bool, p)
	for j := range has {
		has[j] = map[int]bool{}
	}
	give := func(k, j int) {
		res[k] = append(res[k], parts[j])
		holders[j] = append(holders[j], k)
		has[j][k] = true
	}
	if sticky {
		for k, i := range who {
			for j, tp := range parts {
				if len(res[k]) >= desired[k] {
					break
				}
				if cur[i][tp] && len(holders[j]) < sharing {
					give(k, j)
				}
			}
		}
	}
	ok := true
	for j := range parts {
		for len(holders[j]) < sharing {
			best := -1
			for k := range who {
				if has[j][k] || len(res[k]) >= desired[k] {
					continue
				}
				if best < 0 || desired[k]-len(res[k]) > desired[best]-len(res[best]) {
					best = k
				}
			}
			if best < 0 {
				ok = false
				break
			}
			give(best, j)
		}
	}
	return res, ok
}
