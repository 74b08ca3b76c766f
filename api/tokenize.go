package api

import (
	"encoding/json"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/megamoe/megamoe/tokenizer"
)

// tokenizeRequest is vLLM's /tokenize body: a prompt, or chat messages
// rendered as /v1/chat/completions renders them.
type tokenizeRequest struct {
	Model               string            `json:"model"`
	Prompt              *string           `json:"prompt"`
	Messages            []chatMessage     `json:"messages"`
	Tools               []json.RawMessage `json:"tools"`
	AddGenerationPrompt *bool             `json:"add_generation_prompt"`
	ReasoningEffort     *string           `json:"reasoning_effort"`
	ChatTemplateKwargs  *templateKwargs   `json:"chat_template_kwargs"`
	ReturnTokenStrs     bool              `json:"return_token_strs"`
}

func (s *Server) tokenize(c *gin.Context) {
	var req tokenizeRequest
	if err := readJSON(c, &req, nil); err != nil {
		writeError(c, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		writeError(c, err)
		return
	}
	var ids []int32
	switch {
	case req.Prompt != nil && req.Messages == nil:
		ids = s.encode(*req.Prompt)
	case req.Prompt == nil && req.Messages != nil:
		thinking, effort, err := thinkingOptions(req.ReasoningEffort, req.ChatTemplateKwargs)
		if err != nil {
			writeError(c, err)
			return
		}
		text, err := renderChatWith(req.Messages, req.Tools, tokenizer.ChatOptions{Thinking: thinking, ReasoningEffort: effort}, s.quote)
		if err != nil {
			writeError(c, err)
			return
		}
		cr := chatRequest{Messages: req.Messages, AddGenerationPrompt: req.AddGenerationPrompt}
		if text, _, err = cr.ending(text, thinking); err != nil {
			writeError(c, err)
			return
		}
		ids = s.encodeQuoted(text)
	default:
		writeError(c, errorf(http.StatusBadRequest, "prompt", "", "send either prompt or messages"))
		return
	}
	out := gin.H{"count": len(ids), "max_model_len": s.maxLen, "tokens": ids, "token_strs": nil}
	if req.ReturnTokenStrs {
		strs := make([]string, len(ids))
		for i, id := range ids {
			strs[i], _ = s.tok.TokenString(int(id))
		}
		out["token_strs"] = strs
	}
	c.JSON(http.StatusOK, out)
}

type detokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int32 `json:"tokens"`
}

func (s *Server) detokenize(c *gin.Context) {
	var req detokenizeRequest
	if err := readJSON(c, &req, nil); err != nil {
		writeError(c, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		writeError(c, err)
		return
	}
	for _, id := range req.Tokens {
		if id < 0 || int(id) >= s.eng.Vocab() {
			writeError(c, errorf(http.StatusBadRequest, "tokens", "", "token id %d outside the vocabulary [0, %d)", id, s.eng.Vocab()))
			return
		}
	}
	c.JSON(http.StatusOK, gin.H{"prompt": s.tok.Decode(int32sToInts(req.Tokens))})
}
