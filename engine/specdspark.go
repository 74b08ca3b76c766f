package engine

import (
	"fmt"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
)

// MaxDSparkTokens bounds num_speculative_tokens for DSpark before the
// checkpoint is known (the loader's bound on dspark_block_size).
const MaxDSparkTokens = 64

// dsparkDrafter drafts with the DSpark drafter: the captured features of
// the positions the main model verified enter its windows, then one block
// from the last token gives base logits for every draft at once, and the
// Markov head chains them: draft j is chosen from its row plus the bias
// after draft j-1 (after the last token for j = 0).
type dsparkDrafter struct{}

// newDSparkDrafter checks the DSpark configuration against the model and
// returns the drafts per step.
func newDSparkDrafter(sm Speculator, c SpecConfig) (drafter, int, error) {
	rows := sm.DSparkRows()
	if rows == 0 {
		return nil, 0, fmt.Errorf("speculative config: method %q: the checkpoint has no DSpark drafter (no dspark_* config entries)", c.Method)
	}
	switch k := c.NumTokens; {
	case k == 0:
		return dsparkDrafter{}, rows, nil
	case k != rows:
		return nil, 0, fmt.Errorf("speculative config: num_speculative_tokens %d: the model was loaded with DSpark blocks of %d rows (model.Options.DSparkRows, at most dspark_block_size)", k, rows)
	}
	return dsparkDrafter{}, rows, nil
}

// CheckCheckpoint checks c against the checkpoint's config before the
// model is built: the DSpark block size also sizes the drafter's window
// rings (model.Options.DSparkRows).
func (c SpecConfig) CheckCheckpoint(cc *checkpoint.Config) error {
	if c.Method != "dspark" {
		return nil
	}
	if !cc.HasDSpark() {
		return fmt.Errorf("speculative config: method %q: the checkpoint has no DSpark drafter (no dspark_* config entries)", c.Method)
	}
	if c.NumTokens > cc.DSparkBlockSize {
		return fmt.Errorf("speculative config: num_speculative_tokens %d out of [1, dspark_block_size %d]", c.NumTokens, cc.DSparkBlockSize)
	}
	return nil
}

// dsparkHint names method dspark where a DSpark checkpoint was asked for MTP.
func dsparkHint(sm Speculator) string {
	if sm.DSparkRows() > 0 {
		return `; it has a DSpark drafter: use method "dspark"`
	}
	return ""
}

func (dsparkDrafter) propose(sp *speculator, items []Item) ([]*proposal, error) {
	w := sp.m.HiddenDim()
	props := make([]*proposal, len(items))
	// The context: every queued feature row enters the windows.
	queued, err := sp.queued(items, "dspark context")
	if err != nil {
		return nil, err
	}
	ctx := make([]model.DSparkItem, len(queued))
	for j, i := range queued {
		st := items[i].Seq.spec
		if st.dev.H != nil && len(st.hidden) > 0 { // rows of two steps: one input
			if err := sp.toHost(st); err != nil {
				return nil, err
			}
		}
		ctx[j] = model.DSparkItem{Seq: items[i].Seq.KV, Start: st.mtpLen, Context: st.hidden, In: st.dev}
	}
	if len(ctx) > 0 {
		if _, err := sp.m.ForwardDSpark(ctx); err != nil {
			return nil, err
		}
	}
	for _, i := range queued {
		st := items[i].Seq.spec
		st.mtpLen += st.pending(w)
		st.hidden, st.dev = st.hidden[:0], model.HiddenRef{}
	}
	// The blocks of the decoding sequences that can hold their drafts,
	// within the step's row budget.
	spare := sp.spare(items)
	dd := sp.dsparkDraw()
	var blk []model.DSparkItem
	var who, ks []int
	for i := range items {
		it := &items[i]
		st := sp.state(it.Seq)
		k := min(sp.drafts(it), spare)
		if k <= 0 || st.mtpLen != len(it.Seq.Tokens)-1 ||
			sp.m.Cache().Reserve(it.Seq.KV, it.Seq.Computed+it.N+k) != nil {
			continue // no drafts this step (no room): plain decoding
		}
		spare -= k
		blk = append(blk, model.DSparkItem{Seq: it.Seq.KV, Start: st.mtpLen, Anchor: it.Seq.Tokens[st.mtpLen], Draft: true,
			Draw: dd != nil && sp.mtpDraw(it.Seq) != nil})
		who, ks = append(who, i), append(ks, k)
		props[i] = &proposal{}
	}
	if len(blk) == 0 {
		return props, nil
	}
	var base [][]float32
	var drawn [][]int32
	if dd != nil {
		base, drawn, err = dd.ForwardDSparkDraw(blk)
	} else {
		base, err = sp.m.ForwardDSpark(blk)
	}
	if err != nil {
		return nil, err
	}
	host := who[:0:0] // the blocks whose drafts are chosen on the host
	var hks []int
	var hblk []model.DSparkItem
	for c, i := range who {
		if drawn != nil && drawn[c] != nil {
			if len(drawn[c]) < ks[c] {
				return nil, fmt.Errorf("engine: dspark drew %d drafts for %d", len(drawn[c]), ks[c])
			}
			props[i].tokens = append(props[i].tokens, drawn[c][:ks[c]]...)
			continue
		}
		host, hks, hblk = append(host, i), append(hks, ks[c]), append(hblk, blk[c])
		base[len(host)-1] = base[c]
	}
	return props, sp.markovChain(items, props, hblk, base[:len(host)], host, hks)
}

// markovChain chooses the drafts of blocks blk (of items who, ks drafts
// each) on the host from their base logits: draft j from row j plus the
// Markov bias after draft j-1 (after the anchor for j = 0).
func (sp *speculator) markovChain(items []Item, props []*proposal, blk []model.DSparkItem, base [][]float32, who, ks []int) error {
	vocab := sp.m.Vocab()
	for j := 0; ; j++ {
		var prev []int32
		var at []int
		for c, i := range who {
			if ks[c] <= j {
				continue
			}
			p := blk[c].Anchor
			if j > 0 {
				p = props[i].tokens[j-1]
			}
			prev, at = append(prev, p), append(at, c)
		}
		if len(prev) == 0 {
			return nil
		}
		bias, err := sp.m.MarkovBias(prev)
		if err != nil {
			return err
		}
		if len(bias) != len(prev) {
			return fmt.Errorf("engine: markov head returned %d rows for %d tokens", len(bias), len(prev))
		}
		for r, c := range at {
			if len(base[c]) < (j+1)*vocab {
				return fmt.Errorf("engine: dspark returned %d logits for row %d", len(base[c]), j)
			}
			row := base[c][j*vocab : (j+1)*vocab]
			lg := make([]float32, vocab)
			for v := range lg {
				lg[v] = row[v] + bias[r][v]
			}
			props[who[c]].add(items[who[c]].Seq.Sampler, lg)
		}
	}
}
