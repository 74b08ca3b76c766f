package api

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
)

// directRows runs prompt through a fresh copy of the embedded model in one
// forward pass and returns every row's logits.
func directRows(t *testing.T, prompt []int32) [][]float32 {
	t.Helper()
	w, _, err := checkpoint.Load(mustDir(t))
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(w, nil, model.Options{CacheBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: m.Cache().NewSequence(), Tokens: prompt, AllLogits: true}}})
	if err != nil {
		t.Fatal(err)
	}
	return o.Rows(0)
}

type testPromptLP struct {
	Logprob      float64 `json:"logprob"`
	Rank         int     `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

// TestPromptLogprobs checks vLLM's prompt_logprobs on both endpoints against
// log-softmax ranks and alternatives computed directly from the model's rows.
func TestPromptLogprobs(t *testing.T) {
	srv, _ := startServer(t, Config{}, 0)
	tok := goldenTokenizer(t)
	const msgs = `"messages":[{"role":"user","content":"The quick brown fox"}]`
	resp, body := post(t, srv, "/tokenize", `{`+msgs+`}`, nil)
	var chatIDs struct{ Tokens []int32 }
	if err := json.Unmarshal(body, &chatIDs); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("tokenize: %d %s (%v)", resp.StatusCode, body, err)
	}
	textIDs := make([]int32, 0)
	for _, id := range tok.Encode("Once upon a time, in a land far away") {
		textIDs = append(textIDs, int32(id))
	}
	idList := func(ids []int32) string { b, _ := json.Marshal(ids); return string(b) }
	cases := []struct {
		name, path, body string
		prompt           []int32
		k, n             int
	}{
		{"completions, no alternatives", "/v1/completions", `{"max_tokens":1,"prompt_logprobs":0,"prompt":` + idList(textIDs) + `}`, textIDs, 0, 1},
		{"completions, 3 alternatives, 2 choices", "/v1/completions", `{"max_tokens":2,"n":2,"prompt_logprobs":3,"prompt":` + idList(textIDs) + `}`, textIDs, 3, 2},
		{"chat, 5 alternatives", "/v1/chat/completions", `{"max_tokens":1,"prompt_logprobs":5,` + msgs + `}`, chatIDs.Tokens, 5, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, srv, c.path, c.body, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			var out struct {
				PromptLogprobs []map[string]testPromptLP `json:"prompt_logprobs"`
				Choices        []struct {
					PromptLogprobs []map[string]testPromptLP `json:"prompt_logprobs"`
				}
			}
			if err := json.Unmarshal(body, &out); err != nil || len(out.Choices) != c.n {
				t.Fatalf("decode %s: %v", body, err)
			}
			lists := [][]map[string]testPromptLP{out.PromptLogprobs} // chat: one, at the top
			if strings.Contains(c.path, "/completions") && !strings.Contains(c.path, "chat") {
				lists = lists[:0]
				for _, ch := range out.Choices {
					lists = append(lists, ch.PromptLogprobs)
				}
			}
			rows := directRows(t, c.prompt)
			for _, got := range lists {
				if err := checkPromptLogprobs(tok.Decode, got, c.prompt, rows, c.k); err != nil {
					t.Fatal(err)
				}
			}
		})
	}

	for _, c := range []struct{ name, path, body string }{
		{"stream", "/v1/completions", `{"prompt":"a","stream":true,"prompt_logprobs":1}`},
		{"too many", "/v1/completions", `{"prompt":"a","prompt_logprobs":21}`},
		{"negative", "/v1/chat/completions", `{"prompt_logprobs":-1,` + msgs + `}`},
		{"stream, chat", "/v1/chat/completions", `{"stream":true,"prompt_logprobs":0,` + msgs + `}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, body := post(t, srv, c.path, c.body, nil)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"param":"prompt_logprobs"`) {
				t.Errorf("status %d: %s, want a 400 naming prompt_logprobs", resp.StatusCode, body)
			}
		})
	}
}

// checkPromptLogprobs compares got with the log-softmax of rows (row j
// predicts prompt[j+1]): the prompt token with its rank (tokens at least as
// likely) and the k most likely tokens with ranks 1..k.
func checkPromptLogprobs(decode func([]int) string, got []map[string]testPromptLP, prompt []int32, rows [][]float32, k int) error {
	if len(got) != len(prompt) || got[0] != nil {
		return fmt.Errorf("%d positions (first %v) for a prompt of %d, want null first", len(got), got[0], len(prompt))
	}
	for p := 1; p < len(prompt); p++ {
		row := rows[p-1]
		var lse float64
		mx := float64(slices.Max(row))
		for _, v := range row {
			lse += math.Exp(float64(v) - mx)
		}
		lse = mx + math.Log(lse)
		order := make([]int, len(row))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(row[b], row[a]) })
		want := map[int]int{} // id -> rank
		for r, id := range order[:k] {
			want[id] = r + 1
		}
		id := int(prompt[p])
		if _, ok := want[id]; !ok {
			want[id] = 0
			for _, v := range row {
				if v >= row[id] {
					want[id]++
				}
			}
		}
		if len(got[p]) != len(want) {
			return fmt.Errorf("position %d: %d entries %v, want %d", p, len(got[p]), got[p], len(want))
		}
		for wid, rank := range want {
			e, ok := got[p][strconv.Itoa(wid)]
			lp := float64(row[wid]) - lse
			if !ok || e.Rank != rank || math.Abs(e.Logprob-lp) > 1e-4 {
				return fmt.Errorf("position %d token %d: %+v (present %v), want logprob %v rank %d", p, wid, e, ok, lp, rank)
			}
			if s := decode([]int{wid}); utf8.ValidString(s) && e.DecodedToken != s {
				return fmt.Errorf("position %d token %d: decoded %q, want %q", p, wid, e.DecodedToken, s)
			}
		}
	}
	return nil
}
