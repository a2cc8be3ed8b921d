package groupconfig

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/proxy"
)

// Service answers DescribeConfigs, AlterConfigs and
// IncrementalAlterConfigs whose resources are all GROUP configs from a
// Store, for a cluster that has no GROUP configs (Kafka before 4.0), with
// the answers a Kafka 4.4 broker gives (see defs.go for the checks).
// It is proxy.Config.GroupConfigs.
type Service struct {
	store *Store        // immutable
	log   *slog.Logger  // immutable
	wait  time.Duration // immutable: how long a request waits for the store's first read
}

// NewService answers from store.
func NewService(store *Store, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{store: store, log: log, wait: 10 * time.Second}
}

// Handle answers req on a goroutine of its own (an alter waits for its
// write to be acknowledged); reply is called once.
func (s *Service) Handle(_ proxy.Client, req kmsg.Request, reply func(kmsg.Response)) {
	go func() { reply(s.answer(req)) }()
}

// answer answers one request.
func (s *Service) answer(req kmsg.Request) kmsg.Response {
	t := time.NewTimer(s.wait)
	defer t.Stop()
	ready := true
	select {
	case <-s.store.Ready():
	case <-t.C:
		ready = false
	}
	switch r := req.(type) {
	case *kmsg.DescribeConfigsRequest:
		return s.describe(r, ready)
	case *kmsg.IncrementalAlterConfigsRequest:
		return s.incremental(r, ready)
	case *kmsg.AlterConfigsRequest:
		return s.alter(r, ready)
	}
	return nil
}

var errNotReady = &kerr.Error{Message: "REQUEST_TIMED_OUT", Code: kerr.RequestTimedOut.Code}

func strp(s string) *string { return &s }

func hasKey(m map[string]string, k string) bool { _, ok := m[k]; return ok }

func (s *Service) describe(req *kmsg.DescribeConfigsRequest, ready bool) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
	for _, rr := range req.Resources {
		res := kmsg.NewDescribeConfigsResponseResource()
		res.ResourceType, res.ResourceName = rr.ResourceType, rr.ResourceName
		switch {
		case rr.ResourceName == "":
			res.ErrorCode, res.ErrorMessage = kerr.InvalidRequest.Code, strp("Group name must not be empty")
		case !ready:
			res.ErrorCode, res.ErrorMessage = errNotReady.Code, strp("kproxy has not read the group configs yet")
		default:
			res.ErrorMessage = strp("")
			res.Configs = describeGroup(s.store.Group(rr.ResourceName), rr.ConfigNames, req.IncludeSynonyms, req.IncludeDocumentation)
		}
		resp.Resources = append(resp.Resources, res)
	}
	return resp
}

// describeGroup is one group's configs as Kafka describes them: the
// names asked (nil: every listed config; an unknown name is left out),
// each with its value, set on the group (GROUP_CONFIG) or Kafka's default
// (DEFAULT_CONFIG).
func describeGroup(set map[string]string, names []string, synonyms, docs bool) []kmsg.DescribeConfigsResponseResourceConfig {
	var defs []*groupConfigDef
	if names == nil {
		for i := range groupConfigDefs {
			if d := &groupConfigDefs[i]; d.listed || hasKey(set, d.name) {
				defs = append(defs, d)
			}
		}
	} else {
		for _, n := range names {
			if d := defByName[n]; d != nil {
				defs = append(defs, d)
			}
		}
	}
	out := make([]kmsg.DescribeConfigsResponseResourceConfig, 0, len(defs))
	for _, d := range defs {
		c := kmsg.NewDescribeConfigsResponseResourceConfig()
		c.Name, c.ConfigType = d.name, d.typ
		def := kmsg.NewDescribeConfigsResponseResourceConfigConfigSynonym()
		def.Name, def.Value, def.Source = d.synonym, strp(d.def), kmsg.ConfigSourceDefaultConfig
		if v, ok := set[d.name]; ok {
			c.Value, c.Source = strp(v), kmsg.ConfigSourceGroupConfig
			if synonyms {
				own := kmsg.NewDescribeConfigsResponseResourceConfigConfigSynonym()
				own.Name, own.Value, own.Source = d.name, strp(v), kmsg.ConfigSourceGroupConfig
				c.ConfigSynonyms = append(c.ConfigSynonyms, own)
			}
		} else {
			c.Value, c.Source = strp(d.def), kmsg.ConfigSourceDefaultConfig
		}
		if synonyms {
			c.ConfigSynonyms = append(c.ConfigSynonyms, def)
		}
		if docs {
			c.Documentation = strp(d.doc)
		}
		out = append(out, c)
	}
	return out
}

// alterOp is one config change of a resource.
type alterOp struct {
	name  string
	op    kmsg.IncrementalAlterConfigOp
	value *string
}

// applyOps checks ops against group's current configs and returns the
// configs it would hold, with what to write and delete; a refusal is
// the resource's error code and message.
func applyOps(cur map[string]string, ops []alterOp, replace bool) (next map[string]string, set map[string]string, del []string, code int16, msg string) {
	seen := map[string]bool{}
	for _, o := range ops {
		if seen[o.name] {
			return nil, nil, nil, kerr.InvalidRequest.Code, "Error due to duplicate config keys"
		}
		seen[o.name] = true
		if o.op == kmsg.IncrementalAlterConfigOpSet && o.value == nil {
			return nil, nil, nil, kerr.InvalidRequest.Code, "Null value not supported for : " + o.name
		}
	}
	next = map[string]string{}
	if !replace {
		for n, v := range cur {
			next[n] = v
		}
	}
	for _, o := range ops {
		switch o.op {
		case kmsg.IncrementalAlterConfigOpSet:
			next[o.name] = *o.value
		case kmsg.IncrementalAlterConfigOpDelete:
			delete(next, o.name)
		case kmsg.IncrementalAlterConfigOpAppend, kmsg.IncrementalAlterConfigOpSubtract:
			d := defByName[o.name]
			if d == nil {
				return nil, nil, nil, kerr.InvalidConfig.Code, "Unknown group config name: " + o.name
			}
			if d.typ != kmsg.ConfigTypeList {
				return nil, nil, nil, kerr.InvalidConfig.Code, fmt.Sprintf("Can't %s to key %s because its type is not LIST.", o.op, o.name)
			}
			next[o.name] = listOp(next[o.name], d.def, o)
		default:
			return nil, nil, nil, kerr.InvalidRequest.Code, fmt.Sprintf("Unknown alter config operation %d", o.op)
		}
	}
	if err := validateGroupConfigs(next); err != nil {
		return nil, nil, nil, kerr.InvalidConfig.Code, err.Error()
	}
	set = map[string]string{}
	for n, v := range next {
		if old, ok := cur[n]; !ok || old != v {
			set[n] = v
		}
	}
	for n := range cur {
		if _, ok := next[n]; !ok {
			del = append(del, n)
		}
	}
	return next, set, del, 0, ""
}

// listOp appends to or subtracts from a LIST config's comma-separated
// value (cur, or def when unset) the items of o.value.
func listOp(cur, def string, o alterOp) string {
	if cur == "" {
		cur = def
	}
	items := splitList(cur)
	var change []string
	if o.value != nil {
		change = splitList(*o.value)
	}
	if o.op == kmsg.IncrementalAlterConfigOpAppend {
		for _, a := range change {
			if !slices.Contains(items, a) {
				items = append(items, a)
			}
		}
	} else {
		items = slices.DeleteFunc(items, func(it string) bool { return slices.Contains(change, it) })
	}
	return strings.Join(items, ",")
}

// splitList splits a LIST value at its commas, trimming each item.
func splitList(v string) []string {
	var out []string
	for _, it := range strings.Split(v, ",") {
		if it = strings.TrimSpace(it); it != "" {
			out = append(out, it)
		}
	}
	return out
}

// alterGroup checks and (unless validateOnly) writes one resource's
// changes; it returns the resource's error code and message (nil on
// success, as Kafka answers).
func (s *Service) alterGroup(group string, ops []alterOp, replace, validateOnly, ready bool) (int16, *string) {
	switch {
	case group == "":
		return kerr.InvalidRequest.Code, strp("Group name must not be empty")
	case !ready:
		return errNotReady.Code, strp("kproxy has not read the group configs yet")
	}
	_, set, del, code, msg := applyOps(s.store.Group(group), ops, replace)
	if code != 0 {
		return code, strp(msg)
	}
	if validateOnly {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.store.Alter(ctx, group, set, del); err != nil {
		s.log.Warn("altering a group's configs", "group", group, "err", err)
		return kerr.UnknownServerError.Code, strp(err.Error())
	}
	s.log.Info("group configs altered", "group", group, "set", set, "deleted", del)
	return 0, nil
}

func (s *Service) incremental(req *kmsg.IncrementalAlterConfigsRequest, ready bool) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.IncrementalAlterConfigsResponse)
	for _, rr := range req.Resources {
		ops := make([]alterOp, 0, len(rr.Configs))
		for _, c := range rr.Configs {
			ops = append(ops, alterOp{name: c.Name, op: c.Op, value: c.Value})
		}
		res := kmsg.NewIncrementalAlterConfigsResponseResource()
		res.ResourceType, res.ResourceName = rr.ResourceType, rr.ResourceName
		res.ErrorCode, res.ErrorMessage = s.alterGroup(rr.ResourceName, ops, false, req.ValidateOnly, ready)
		resp.Resources = append(resp.Resources, res)
	}
	return resp
}

// alter is the legacy AlterConfigs: a resource's configs become exactly
// those given.
func (s *Service) alter(req *kmsg.AlterConfigsRequest, ready bool) kmsg.Response {
	resp := req.ResponseKind().(*kmsg.AlterConfigsResponse)
	for _, rr := range req.Resources {
		ops := make([]alterOp, 0, len(rr.Configs))
		for _, c := range rr.Configs {
			ops = append(ops, alterOp{name: c.Name, op: kmsg.IncrementalAlterConfigOpSet, value: c.Value})
		}
		res := kmsg.NewAlterConfigsResponseResource()
		res.ResourceType, res.ResourceName = rr.ResourceType, rr.ResourceName
		res.ErrorCode, res.ErrorMessage = s.alterGroup(rr.ResourceName, ops, true, req.ValidateOnly, ready)
		resp.Resources = append(resp.Resources, res)
	}
	return resp
}
