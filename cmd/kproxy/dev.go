package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kproxy/kproxy/internal/kproxy"
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
		cluster, err := kproxy.NewDevCluster(*brokers, *partitions, log, devTelemetryOpts(*telemetry)...)
		if err != nil {
			return err
		}
		defer cluster.Close()
		cfg.Upstream = cluster.ListenAddrs()
		// The in-memory cluster has no authorizer, yet answers
		// DescribeAcls with an empty list rather than SECURITY_DISABLED:
		// auto would deny every group request.
		cfg.Authorization.Mode = string(kproxy.AuthorizationOff)
		if err := cfg.validate(); err != nil {
			return err
		}
		return run(cmd.Context(), cfg, log, func(addr string) {
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "kproxy dev: an in-memory %d-broker Kafka cluster behind kproxy\n", *brokers)
			fmt.Fprintf(out, "  bootstrap: %s\n", addr)
			if cfg.AdminListen != "" {
				fmt.Fprintf(out, "  admin:     %s://%s/ (groups, rebalance timeline, /metrics)\n", adminScheme(cfg), cfg.AdminListen)
			}
			fmt.Fprintf(out, "  try:       kcat -b %s -P -t demo <<< hello && kcat -b %s -G demo-group demo\n", addr, addr)
			fmt.Fprintln(out, "Ctrl-C stops it.")
		})
	}
	return cmd
}
