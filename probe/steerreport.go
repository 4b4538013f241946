package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// SamplesPath is signaling's endpoint for synthetic clients' round trips
// (docs/steering.md): only an API key marked probe: true may post them,
// and they count for the prefix and location the probe calls from.
const SamplesPath = "/v1/steering/samples"

// ReportRTT posts the echo round trip a call measured (its median)
// through the POP it was placed on to signaling's steering table, with
// cfg's credential. A report without a POP or a round trip is not sent.
func ReportRTT(ctx context.Context, cfg Config, r Report) error {
	if r.POP == "" || r.RTTP50Ms <= 0 {
		return nil
	}
	body, err := json.Marshal(map[string]any{"samples": []map[string]any{{"pop": r.POP, "rtt_ms": r.RTTP50Ms}}})
	if err != nil {
		return fmt.Errorf("probe: encode the round trip: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(cfg.SignalingURL, "/")+SamplesPath, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("probe: report the round trip: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.Token)
	}
	for k, v := range cfg.Headers {
		req.Header[k] = v
	}
	client := cfg.HTTPClient
	if client == nil {
		client = http.DefaultClient
	}
	res, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("probe: report the round trip: %w", err)
	}
	defer res.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(res.Body, 4<<10))
	if res.StatusCode != http.StatusAccepted {
		return fmt.Errorf("probe: report the round trip: %w", &HTTPError{Status: res.StatusCode, Body: string(msg)})
	}
	return nil
}
