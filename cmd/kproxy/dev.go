package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kfake"
)

func newDevCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run kproxy in front of an in-memory 3-broker Kafka cluster",
		Long: `dev starts an in-memory Kafka cluster of three brokers (franz-go's kfake,
topics created on first use) on loopback, puts kproxy in front of it and
prints the bootstrap address. Nothing is written to disk.`,
		Args: cobra.NoArgs,
	}
	f := bindFlags(cmd.Flags(), false)
	brokers := cmd.Flags().Int("brokers", 3, "brokers in the in-memory cluster")
	partitions := cmd.Flags().Int("partitions", 6, "partitions of auto-created topics")
	telemetry := cmd.Flags().Bool("client-telemetry", false, "offer KIP-714 client telemetry (GetTelemetrySubscriptions, PushTelemetry) as kfake does; off like a broker without a client-metrics plugin, since kfake's 30 s push interval makes every franz-go client reconnect for each push")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg, err := f.resolve()
		if err != nil {
			return err
		}
		if !f.fs.Changed("admin-listen") && cfg.AdminListen == "" {
			cfg.AdminListen = "127.0.0.1:9644"
		}
		log := cfg.logger()
		cluster, err := kfake.NewCluster(append([]kfake.Opt{
			kfake.NumBrokers(*brokers),
			kfake.AllowAutoTopicCreation(),
			kfake.DefaultNumPartitions(*partitions),
			kfake.ListenFn(listenRetrying(log)),
		}, devTelemetryOpts(*telemetry)...)...)
		if err != nil {
			return fmt.Errorf("starting the in-memory cluster: %w", err)
		}
		defer cluster.Close()
		cfg.Upstream = cluster.ListenAddrs()
		if err := cfg.validate(); err != nil {
			return err
		}
		return run(cmd.Context(), cfg, log, func(addr string) {
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "kproxy dev: an in-memory %d-broker Kafka cluster behind kproxy\n", *brokers)
			fmt.Fprintf(out, "  bootstrap: %s\n", addr)
			if cfg.AdminListen != "" {
				fmt.Fprintf(out, "  admin:     http://%s/ (groups, rebalance timeline, /metrics)\n", cfg.AdminListen)
			}
			fmt.Fprintf(out, "  try:       kcat -b %s -P -t demo <<< hello && kcat -b %s -G demo-group demo\n", addr, addr)
			fmt.Fprintln(out, "Ctrl-C stops it.")
		})
	}
	return cmd
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
