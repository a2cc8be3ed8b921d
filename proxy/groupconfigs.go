package proxy

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kproxy/kproxy/codec"
)

// isConfigKey: DescribeConfigs, AlterConfigs, IncrementalAlterConfigs.
func isConfigKey(key int16) bool {
	return key == codec.KeyDescribeConfigs || key == codec.KeyAlterConfigs || key == codec.KeyIncrementalAlterConfigs
}

// allGroupResources reports whether req (a config request) names at
// least one resource and only GROUP ones.
func allGroupResources(req kmsg.Request) bool {
	var types []kmsg.ConfigResourceType
	switch r := req.(type) {
	case *kmsg.DescribeConfigsRequest:
		for _, rr := range r.Resources {
			types = append(types, rr.ResourceType)
		}
	case *kmsg.AlterConfigsRequest:
		for _, rr := range r.Resources {
			types = append(types, rr.ResourceType)
		}
	case *kmsg.IncrementalAlterConfigsRequest:
		for _, rr := range r.Resources {
			types = append(types, rr.ResourceType)
		}
	}
	for _, t := range types {
		if t != kmsg.ConfigResourceTypeGroupConfig {
			return false
		}
	}
	return len(types) > 0
}

// routeGroupConfigs serves a config request whose resources are all
// GROUP configs with Config.GroupConfigs; any other (a mixed one, one
// too large to read, one that does not decode) goes to the brokers as
// it came, as without GroupConfigs.
func (s *session) routeGroupConfigs(h codec.RequestHeader, start int64, head []byte, total int) error {
	var watch func(kmsg.Response)
	if s.p.cfg.ConfigsAltered != nil && h.Key != codec.KeyDescribeConfigs {
		watch = s.p.cfg.ConfigsAltered
	}
	if limit := s.p.cfg.MaxGroupRequest; total-4 > int(limit) {
		return s.forward(h, codec.Forward, start, head, total)
	}
	if err := s.authGate(h); err != nil {
		return err
	}
	frame, done, err := s.readFrame(total)
	if err != nil {
		return err
	}
	req := kmsg.RequestForKey(h.Key)
	req.SetVersion(h.Version)
	err = req.ReadFrom(frame[4+h.Len:])
	done()
	if err != nil || !allGroupResources(req) {
		return s.forwardBytes(h, codec.Forward, start, frame, watch)
	}
	r := getReply()
	if err := s.push(slot{route: codec.Local, key: h.Key, version: h.Version, corr: h.CorrelationID, start: start, reply: r}); err != nil {
		return err
	}
	s.p.cfg.GroupConfigs.Handle(s.rc, req, r.deliver)
	return nil
}
