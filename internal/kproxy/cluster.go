package kproxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// NewDevCluster starts the in-memory Kafka cluster of `kproxy dev` and
// of the in-process tests: franz-go's kfake with brokers brokers on
// loopback, topics created on first use with partitions partitions
// (kfake's default when partitions <= 0), listeners that survive accept
// errors. Extra kfake options come last. Close it after the kproxy in
// front of it has shut down.
func NewDevCluster(brokers, partitions int, log *slog.Logger, opts ...kfake.Opt) (*kfake.Cluster, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	base := []kfake.Opt{
		kfake.NumBrokers(brokers),
		kfake.AllowAutoTopicCreation(),
		kfake.ListenFn(listenRetrying(log)),
	}
	if partitions > 0 {
		base = append(base, kfake.DefaultNumPartitions(partitions))
	}
	c, err := kfake.NewCluster(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("starting the in-memory cluster: %w", err)
	}
	return c, nil
}

// listenRetrying returns a listen function for the in-memory brokers
// whose listeners survive accept errors. kfake stops accepting for good
// on any Accept error, so one EMFILE (out of file descriptors) would kill
// a broker of the dev cluster; this listener backs off (5ms doubling to
// 1s), logs, and keeps accepting until it is closed.
func listenRetrying(log *slog.Logger) func(network, address string) (net.Listener, error) {
	return func(network, address string) (net.Listener, error) {
		ln, err := net.Listen(network, address)
		if err != nil {
			return nil, err
		}
		return &retryingListener{Listener: ln, log: log}, nil
	}
}

// retryingListener is used by one kfake accept loop only.
type retryingListener struct {
	net.Listener
	log   *slog.Logger
	delay time.Duration // owned by the accept loop
}

func (l *retryingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			l.delay = 0
			return c, nil
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		l.delay = min(max(2*l.delay, 5*time.Millisecond), time.Second)
		l.log.Warn("in-memory broker: accept failed", "listen", l.Addr().String(), "err", err, "retry_in", l.delay)
		time.Sleep(l.delay)
	}
}
