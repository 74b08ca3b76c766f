package api

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"

	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/tokenizer"
)

// minLogprob stands for −inf, which JSON cannot hold (vLLM clamps alike).
const minLogprob = -9999.0

// promptLogprob is one candidate of a prompt position in vLLM's format.
type promptLogprob struct {
	id           int32
	Logprob      float32 `json:"logprob"`
	Rank         int     `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

// promptPosition maps token ids to their logprobs, in vLLM's order: the
// prompt token first, then the alternatives by rank.
type promptPosition []promptLogprob

func (p promptPosition) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, e := range p {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(strconv.Itoa(int(e.id))))
		b.WriteByte(':')
		v, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// makePromptLogprobs is vLLM's prompt_logprobs: null for the first prompt
// token (nothing predicts it), then per token a map of its id and the
// alternatives' ids to logprob, rank and text. An alternative that is the
// prompt token itself appears once, with its rank among the alternatives.
func makePromptLogprobs(tok *tokenizer.Tokenizer, toks []engine.Token) []*promptPosition {
	out := make([]*promptPosition, 1, len(toks)+1)
	entry := func(id int32, lp float32, rank int) promptLogprob {
		s, _ := tokenBytes(tok, id)
		if math.IsInf(float64(lp), -1) || lp != lp {
			lp = minLogprob
		}
		return promptLogprob{id: id, Logprob: lp, Rank: rank, DecodedToken: s}
	}
	for _, t := range toks {
		pos := promptPosition{entry(t.ID, t.Logprob, t.Rank)}
		for r, alt := range t.Top {
			if alt.ID == t.ID {
				pos[0].Rank = r + 1
				continue
			}
			pos = append(pos, entry(alt.ID, alt.Logprob, r+1))
		}
		out = append(out, &pos)
	}
	return out
}
