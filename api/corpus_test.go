package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/megamoe/megamoe/internal/schematest"
)

// TestSchemaCorpus sends every schema of the grammar package's corpus as
// structured_outputs.json to the embedded model, with seeds, and
// checks each output with an independent validator: it parses, validates and
// ends with finish_reason "stop". The fast tier sends every fourth schema.
func TestSchemaCorpus(t *testing.T) {
	files, err := filepath.Glob("../grammar/testdata/schemas/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 {
		t.Fatalf("corpus has %d schemas, want at least 50", len(files))
	}
	if testing.Short() {
		var some []string
		for i := 0; i < len(files); i += 4 {
			some = append(some, files[i])
		}
		files = some
	}
	srv, tok := startRandomServer(t, Config{ModelName: "m"})
	// The random weights rarely end a string, a number or a container; the
	// bias makes closing them likely, the grammar still decides what is allowed.
	// A few schemas need text the random weights almost never spell (a
	// search pattern's literal, an email's @): hint tokens for them.
	hints := map[string][]string{
		"pattern_unanchored":     {"a", "b", "c"},
		"pattern_search_unicode": {"é", "1"},
		"mixed_required":         {"@"},
	}
	bias := func(name string) string {
		var b []string
		for _, s := range []string{`"`, `}`, `]`, `,`} {
			b = append(b, fmt.Sprintf(`"%d":5`, tok.Encode(s)[0]))
		}
		for _, s := range hints[name] {
			for _, id := range tok.Encode(s) { // "é": its two byte tokens
				b = append(b, fmt.Sprintf(`"%d":10`, id))
			}
		}
		return strings.Join(b, ",")
	}
	type job struct {
		name, body string
		seed       int
		val        *schematest.Validator
	}
	var jobs []job
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		schema, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		val, err := schematest.New(schema)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for seed := range seeds() {
			body := fmt.Sprintf(`{"model":"m","prompt":"JSON:","max_tokens":600,"temperature":1,"seed":%d,"logit_bias":{%s},`+
				`"structured_outputs":{"json":%s}}`, seed, bias(name), schema)
			jobs = append(jobs, job{name, body, seed, val})
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4) // the test server runs 4 sequences
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := corpusOutput(srv, j.body, j.val); err != nil {
				t.Errorf("%s seed %d: %v", j.name, j.seed, err)
			}
		}()
	}
	wg.Wait()
}

// corpusOutput posts one completion and validates its text.
func corpusOutput(srv *httptest.Server, body string, val *schematest.Validator) error {
	resp, err := srv.Client().Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var r struct {
		Choices []struct {
			Text         string
			FinishReason string `json:"finish_reason"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || len(r.Choices) != 1 {
		return fmt.Errorf("status %d, %d choices, decode: %v", resp.StatusCode, len(r.Choices), err)
	}
	text := r.Choices[0].Text
	if r.Choices[0].FinishReason != "stop" {
		return fmt.Errorf("finish %q after %.300q", r.Choices[0].FinishReason, text)
	}
	if err := schematest.CheckCompact(text); err != nil {
		return fmt.Errorf("%q: %w", text, err)
	}
	if err := val.Text(text); err != nil {
		return fmt.Errorf("%q: %w", text, err)
	}
	return nil
}
