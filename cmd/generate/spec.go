package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
)

// generateSpec decodes steps greedy tokens after prompt through the engine
// with drafts (the same tokens as plain greedy decoding) and reports the
// acceptance.
func generateSpec(m *model.Model, prompt []int32, steps int, sc engine.SpecConfig, stdout, stderr io.Writer) error {
	if steps == 0 {
		return errors.New("--steps must be > 0 with speculative decoding")
	}
	eng, err := engine.New(engine.FromModel(m), engine.Config{MaxNumSeqs: 1, MaxModelLen: len(prompt) + steps + 1, Speculative: sc})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = eng.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	t0 := time.Now()
	st, err := eng.Submit(&engine.Request{Prompt: prompt, MaxTokens: steps})
	if err != nil {
		return err
	}
	var ids []string
	for {
		<-st.Ready()
		ev, ok := st.Next()
		if !ok {
			continue
		}
		for _, t := range ev.Tokens {
			ids = append(ids, strconv.Itoa(int(t.ID)))
		}
		if ev.Err != nil {
			return ev.Err
		}
		if ev.Finish != engine.FinishNone {
			break
		}
	}
	took := time.Since(t0)
	fmt.Fprintln(stdout, strings.Join(ids, ","))
	s := eng.Stats().Spec
	fmt.Fprintf(stderr, "prefill + %d tokens with %s drafts (%d per step) in %v: %d verifications, %d of %d drafts accepted, per position %v, mean acceptance length %.2f\n",
		len(ids), sc.Method, len(s.PerPos), took.Round(time.Millisecond), s.Steps, s.Accepted, s.Drafted, s.PerPos, s.MeanAcceptance())
	return nil
}
