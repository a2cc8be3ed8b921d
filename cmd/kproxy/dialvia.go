package main

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/spf13/pflag"
)

// The hidden serve flag --upstream-dial-via FROM=TO[,FROM=TO] makes every
// connection kproxy opens to the cluster address FROM (its own client's,
// its store's and fleet member's, and its clients' forwarded traffic) go
// to TO instead. It exists for the interop tier's fault rows, which put a
// fault relay between a kproxy process and the broker: the broker
// advertises its own address in Metadata, so pointing --upstream at the
// relay alone would leave every per-broker connection outside it. Not
// for production (a TLS upstream still verifies the broker's name, FROM's
// host), hence hidden.

// dialVia maps cluster addresses to the addresses actually dialled.
type dialVia map[string]string

// bindDialVia registers the hidden flag on fs and returns its value.
func bindDialVia(fs *pflag.FlagSet) *[]string {
	v := fs.StringSlice("upstream-dial-via", nil, "FROM=TO: dial TO whenever kproxy connects to the cluster address FROM (fault tests)")
	_ = fs.MarkHidden("upstream-dial-via")
	return v
}

// parseDialVia reads the flag's FROM=TO pairs.
func parseDialVia(pairs []string) (dialVia, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := dialVia{}
	for _, p := range pairs {
		from, to, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("--upstream-dial-via %q: want FROM=TO", p)
		}
		for _, a := range []string{from, to} {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, fmt.Errorf("--upstream-dial-via %q: %w", p, err)
			}
		}
		m[from] = to
	}
	return m, nil
}

// dial connects to addr, or to what addr maps to.
func (m dialVia) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if to, ok := m[addr]; ok {
		addr = to
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}
