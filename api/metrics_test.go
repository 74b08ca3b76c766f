package api

import (
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"testing"
)

func TestMetrics(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "m"}, 0)
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"temperature":0}`,
		`{"model":"m","messages":[]}`,
	} {
		post(t, srv, "/v1/chat/completions", body, nil)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	text := string(data)
	for _, c := range []struct{ re, min string }{
		{`megamoe_requests_total\{route="/v1/chat/completions",status="200"\} (\S+)`, "1"},
		{`megamoe_requests_total\{route="/v1/chat/completions",status="400"\} (\S+)`, "1"},
		{`megamoe_generation_tokens_total (\S+)`, "3"},
		{`megamoe_prompt_tokens_total (\S+)`, "1"},
		{`megamoe_time_to_first_token_seconds_count (\S+)`, "1"},
		{`megamoe_time_per_output_token_seconds_count (\S+)`, "1"},
		{`megamoe_kv_cache_capacity_bytes (\S+)`, "1"},
		{`megamoe_queue_depth (\S+)`, "0"},
		{`megamoe_running_sequences (\S+)`, "0"},
	} {
		m := regexp.MustCompile(`(?m)^` + c.re).FindStringSubmatch(text)
		if m == nil {
			t.Errorf("metric %s missing", c.re)
			continue
		}
		got, _ := strconv.ParseFloat(m[1], 64)
		want, _ := strconv.ParseFloat(c.min, 64)
		if got < want {
			t.Errorf("%s = %v, want >= %v", c.re, got, want)
		}
	}
}

// TestInterTokenLatency checks vLLM's inter-token latency is observed once
// per gap between a request's tokens (not once per request), that the gaps add
// up to the time from the first token to the last, and that the per-request
// mean is observed once per choice.
func TestInterTokenLatency(t *testing.T) {
	srv, _ := startServer(t, Config{ModelName: "m"}, 0)
	scrape := func(name string) float64 {
		t.Helper()
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\{model_name="m"\} (\S+)`).FindSubmatch(data)
		if m == nil {
			t.Fatalf("metric %s missing", name)
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		return v
	}
	names := []string{"vllm:inter_token_latency_seconds_count", "vllm:time_per_output_token_seconds_count",
		"vllm:request_time_per_output_token_seconds_count", "vllm:inter_token_latency_seconds_sum", "vllm:request_time_per_output_token_seconds_sum"}
	cases := []struct {
		n, tokens int
	}{{1, 5}, {2, 3}, {1, 1}}
	for _, c := range cases {
		before := make([]float64, len(names))
		for i, n := range names {
			before[i] = scrape(n)
		}
		resp, body := post(t, srv, "/v1/completions", `{"prompt":"Hi","ignore_eos":true,"temperature":0,"n":`+strconv.Itoa(c.n)+
			`,"max_tokens":`+strconv.Itoa(c.tokens)+`}`, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		d := make([]float64, len(names))
		for i, n := range names {
			d[i] = scrape(n) - before[i]
		}
		gaps, means := float64(c.n*(c.tokens-1)), float64(c.n)
		if c.tokens == 1 {
			means = 0
		}
		if d[0] != gaps || d[1] != gaps || d[2] != means {
			t.Errorf("n=%d, %d tokens: %v gaps, %v per-gap tpot, %v request means; want %v, %v, %v", c.n, c.tokens, d[0], d[1], d[2], gaps, gaps, means)
		}
		// Each request's gaps sum to (tokens-1) times its mean.
		if want := d[4] * float64(c.tokens-1); math.Abs(d[3]-want) > 1e-9+1e-6*want {
			t.Errorf("n=%d, %d tokens: gaps sum to %v s, the request means imply %v s", c.n, c.tokens, d[3], want)
		}
	}
}
