package codec

import "encoding/binary"

// skimmer walks a flexible response without decoding it.
type skimmer struct {
	b  []byte
	ok bool
}

func (s *skimmer) skip(n int) {
	if !s.ok || n < 0 || n > len(s.b) {
		s.ok = false
		return
	}
	s.b = s.b[n:]
}

func (s *skimmer) uvarint() uint64 {
	if !s.ok {
		return 0
	}
	v, n := binary.Uvarint(s.b)
	if n <= 0 {
		s.ok = false
		return 0
	}
	s.b = s.b[n:]
	return v
}

// compactLen reads a compact array/string length (stored +1); null is 0.
func (s *skimmer) compactLen() int {
	v := s.uvarint()
	if v == 0 || v > uint64(len(s.b))+1 {
		if v != 0 {
			s.ok = false
		}
		return 0
	}
	return int(v - 1)
}

func (s *skimmer) skipTags() (tag0 bool) {
	for n := s.uvarint(); n > 0 && s.ok; n-- {
		key := s.uvarint()
		size := s.uvarint()
		if size > uint64(len(s.b)) {
			s.ok = false
			return false
		}
		if key == 0 {
			tag0 = true
		}
		s.skip(int(size))
	}
	return tag0
}

// ProduceHasEndpoints reports whether a Produce response body (after the
// response header) at version >= 9 carries the top-level NodeEndpoints
// tag (KIP-951). ok is false when the body does not parse; the caller then
// decodes it fully to get the error.
func ProduceHasEndpoints(body []byte, version int16) (has, ok bool) {
	s := skimmer{b: body, ok: version >= 9}
	for t := s.compactLen(); t > 0 && s.ok; t-- {
		if version >= 13 {
			s.skip(16)
		} else {
			s.skip(s.compactLen())
		}
		for p := s.compactLen(); p > 0 && s.ok; p-- {
			s.skip(4 + 2 + 8 + 8 + 8) // partition, error, base offset, append time, log start
			for e := s.compactLen(); e > 0 && s.ok; e-- {
				s.skip(4)
				s.skip(s.compactLen())
				s.skipTags()
			}
			s.skip(s.compactLen()) // error message
			s.skipTags()           // CurrentLeader (tag 0) holds no address
		}
		s.skipTags()
	}
	s.skip(4) // throttle
	has = s.skipTags()
	return has, s.ok && len(s.b) == 0
}

// HasEndpoints reports whether a response body of key at version carries
// leader endpoints, for the keys whose responses kproxy edits only when
// they do (Decision.Edit is EditIfEndpoints). ok is false when the body
// does not parse, or key is not one of them: the caller then decodes it.
func HasEndpoints(key int16, body []byte, version int16) (has, ok bool) {
	switch key {
	case KeyProduce:
		return ProduceHasEndpoints(body, version)
	case KeyShareFetch, KeyShareAcknowledge:
		return shareHasEndpoints(key, body, version)
	}
	return false, false
}

// shareHasEndpoints reports whether a ShareFetch or ShareAcknowledge
// response body carries NodeEndpoints, the array after its topics
// (KIP-932; both are flexible from v0). The records a ShareFetch carries
// are skipped by their length, never read.
func shareHasEndpoints(key int16, body []byte, version int16) (has, ok bool) {
	s := skimmer{b: body, ok: true}
	s.skip(4 + 2)          // throttle, error code
	s.skip(s.compactLen()) // error message
	if (key == KeyShareFetch && version >= 1) || (key == KeyShareAcknowledge && version >= 2) {
		s.skip(4) // acquisition lock timeout
	}
	for t := s.compactLen(); t > 0 && s.ok; t-- {
		s.skip(16) // topic id
		for p := s.compactLen(); p > 0 && s.ok; p-- {
			s.skip(4 + 2)          // partition, error code
			s.skip(s.compactLen()) // error message
			if key == KeyShareFetch {
				s.skip(2)              // acknowledge error code
				s.skip(s.compactLen()) // acknowledge error message
			}
			s.skip(4 + 4) // current leader: id and epoch, no address
			s.skipTags()
			if key == KeyShareFetch {
				s.skip(s.compactLen()) // records
				for a := s.compactLen(); a > 0 && s.ok; a-- {
					s.skip(8 + 8 + 2) // first, last offset, delivery count
					s.skipTags()
				}
			}
			s.skipTags()
		}
		s.skipTags()
	}
	has = s.compactLen() > 0
	if has {
		return true, s.ok
	}
	s.skipTags()
	return false, s.ok && len(s.b) == 0
}
