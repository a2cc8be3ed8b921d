package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kproxy/kproxy/tap"
)

// tapOptions are the flags of `kproxy tap`.
type tapOptions struct {
	admin string        // admin server base URL
	group string        // only this group's events when set
	json  bool          // print JSON lines
	retry time.Duration // pause before reconnecting
	token string        // file holding the admin server's bearer token (--admin-token-file)
}

// newTapCmd returns `kproxy tap`, which follows a kproxy admin server's
// live event stream and prints every group event as it happens.
func newTapCmd() *cobra.Command {
	o := tapOptions{retry: time.Second}
	cmd := &cobra.Command{
		Use:   "tap",
		Short: "Print consumer-group events live from a running kproxy",
		Long: "Follows the /api/events stream of a kproxy admin server (--admin-listen) and prints\n" +
			"each group event as it happens: one line per event (time, group, kind, generation,\n" +
			"member, cause), or the events as JSON lines with --json. It reconnects and resumes\n" +
			"when the stream drops.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTap(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&o.admin, "admin", "http://127.0.0.1:9644", "kproxy admin server URL")
	cmd.Flags().StringVar(&o.group, "group", "", "print only this group's events")
	cmd.Flags().BoolVar(&o.json, "json", false, "print events as JSON lines")
	cmd.Flags().StringVar(&o.token, "admin-token-file", "", "file holding the admin server's bearer token, when it requires one")
	return cmd
}

// runTap follows the event stream until ctx ends. It fails if the first
// connection fails; later drops are retried, resuming after the last
// event seen.
func runTap(ctx context.Context, o tapOptions, out, errOut io.Writer) error {
	base := strings.TrimRight(o.admin, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base + "/api/events")
	if err != nil {
		return fmt.Errorf("tap: admin URL %q: %w", o.admin, err)
	}
	if o.group != "" {
		u.RawQuery = url.Values{"group": {o.group}}.Encode()
	}
	var tok secret
	if o.token != "" {
		if tok, err = readSecretFile(o.token); err != nil {
			return fmt.Errorf("tap: admin token: %w", err)
		}
	}
	var lastID string
	for attempt := 0; ; attempt++ {
		connected, err := followOnce(ctx, u.String(), tok, &lastID, o.json, out, errOut)
		if ctx.Err() != nil {
			return nil
		}
		if !connected && attempt == 0 {
			return fmt.Errorf("tap: %w", err)
		}
		fmt.Fprintf(errOut, "kproxy tap: stream lost (%v); reconnecting\n", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.retry):
		}
	}
}

// followOnce reads one SSE connection until it ends. It reports whether
// the server accepted the stream and why it ended.
func followOnce(ctx context.Context, u string, tok secret, lastID *string, asJSON bool, out, errOut io.Writer) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, fmt.Errorf("building request: %w", err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok.reveal())
	}
	if *lastID != "" {
		req.Header.Set("Last-Event-ID", *lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, fmt.Errorf("connecting to %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return false, fmt.Errorf("%s: %s: %s", u, resp.Status, strings.TrimSpace(string(b)))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	var typ, id string
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data.Len() > 0 {
				if err := printEvent(typ, data.String(), asJSON, out, errOut); err != nil {
					return true, err
				}
				if id != "" {
					*lastID = id
				}
			}
			typ, id = "", ""
			data.Reset()
		case strings.HasPrefix(line, ":"):
			// comment (keep-alive)
		case strings.HasPrefix(line, "data:"):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		case strings.HasPrefix(line, "id:"):
			id = strings.TrimSpace(strings.TrimPrefix(line, "id:"))
		case strings.HasPrefix(line, "event:"):
			typ = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		}
	}
	if err := sc.Err(); err != nil {
		return true, fmt.Errorf("reading stream: %w", err)
	}
	return true, errors.New("server closed the stream")
}

// printEvent prints one SSE event. Unparseable events are reported, not
// fatal.
func printEvent(typ, data string, asJSON bool, out, errOut io.Writer) error {
	if typ == "dropped" {
		var d struct {
			Dropped int64 `json:"dropped"`
		}
		_ = json.Unmarshal([]byte(data), &d)
		fmt.Fprintf(errOut, "kproxy tap: %d events lost (this reader fell behind)\n", d.Dropped)
		return nil
	}
	if typ != "" && typ != "message" {
		return nil
	}
	if asJSON {
		if !json.Valid([]byte(data)) {
			fmt.Fprintf(errOut, "kproxy tap: ignoring malformed event %.200q\n", data)
			return nil
		}
		_, err := fmt.Fprintln(out, data)
		return err
	}
	var ev tap.StreamEvent
	if err := json.Unmarshal([]byte(data), &ev); err != nil {
		fmt.Fprintf(errOut, "kproxy tap: ignoring malformed event: %v\n", err)
		return nil
	}
	_, err := fmt.Fprintln(out, formatEvent(ev))
	return err
}

// formatEvent renders an event on one line: time, group, kind,
// generation, member, cause and kind-specific details.
func formatEvent(ev tap.StreamEvent) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %-20s %-18s gen=%d", ev.Time.Local().Format("15:04:05.000"), ev.Group, ev.Kind, ev.Generation)
	if m := ev.Member; m != nil {
		fmt.Fprintf(&b, "  member=%s", m.MemberID)
		var who []string
		if m.ClientID != "" {
			who = append(who, m.ClientID)
		}
		if m.ClientHost != "" {
			who = append(who, "@"+m.ClientHost)
		}
		if m.InstanceID != "" {
			who = append(who, "instance="+m.InstanceID)
		}
		if len(who) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(who, " "))
		}
	}
	if ev.Cause != "" {
		fmt.Fprintf(&b, "  cause=%s", ev.Cause)
	}
	switch ev.Kind {
	case "join_completed":
		fmt.Fprintf(&b, "  members=%d leader=%s protocol=%s", len(ev.Members), ev.Leader, ev.Protocol)
	case "sync_completed":
		parts := 0
		for _, m := range ev.Members {
			for _, tp := range m.Assignment {
				parts += len(tp.Partitions)
			}
		}
		fmt.Fprintf(&b, "  members=%d state=%s", len(ev.Members), ev.State)
		if parts > 0 {
			fmt.Fprintf(&b, " partitions=%d", parts)
		}
	case "offsets_committed":
		fmt.Fprintf(&b, "  partitions=%d", ev.Offsets)
	case "member_reconciling":
		if m := ev.Member; m != nil {
			count := func(tps []tap.TopicPartitions) int {
				n := 0
				for _, tp := range tps {
					n += len(tp.Partitions)
				}
				return n
			}
			fmt.Fprintf(&b, "  epoch=%d state=%s assigned=%d revoking=%d", m.Epoch, m.State, count(m.Assignment), count(m.Revoking))
		}
	}
	return b.String()
}
