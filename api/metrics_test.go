package api

import (
	"io"
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
