package gpu

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

// Recorded decode steps (CUDA graphs). A step's ops are captured once per
// layout (sequences, rows per sequence, context bucket) and replayed for later
// steps: the host then only packs the step's inputs (row layout, block
// tables, token ids) into pinned memory, copies them to the recording's fixed
// device buffer and launches the graph, with no per-op host work and no
// launch gaps.
//
// Every buffer an op allocates while recording comes from the arena, a pool
// no eager op draws from: the addresses baked into the graphs stay theirs.
// Graphs run one at a time on the backend's stream and rewrite every buffer
// before reading it, so they share the arena.
//
// A verification of drafts (Batch.Name "verify": every row's logits wanted,
// the last token and N drafts a drafting sequence) is recorded too: its key
// is the batch and every sequence's rows (at most mtpGraphRows), its slots
// and positions inputs like a decode step's. Rollback rewinds lengths only,
// so nothing else of a step with drafts is baked.
//
// A pass of the MTP block (Batch.Name "mtp") is recorded apart from the
// main model's steps: its key is the batch and its rows in all (a catch-up
// feeds the rows a verification kept, a chained draft one), and the last
// row of every sequence, which its head gathers, is an input list. A
// recording under such a key fails (and the layout runs eagerly) when an
// op would bake rows or slots that the key does not fix.
//
// The DSpark drafter's passes are recorded apart too: the context (Batch.Name
// "dspark ctx"; its input rows staged at a fixed address as the MTP's) keys on
// the batch and its rows in all, with at most mtpGraphRows rows a sequence;
// the blocks ("dspark", "dspark draw" with the Markov chain drawn) on the
// batch and the rows, every block having the model's rows, with the block's
// attention layout (Batch.Also) an input beside its own.
//
// A layout is recorded the second time it is seen (the first step warms the
// kernels, tables and pools eagerly); a layout whose recording fails runs
// eagerly from then on.

// ctxBucketMin is the smallest context capacity of a recording; capacities
// double from there (the indexer's score rows and the block tables are sized
// by it).
const ctxBucketMin = 1024

// mtpGraphRows bounds the rows per sequence of a recorded MTP pass: a
// catch-up after a verification has at most 1 + the drafts; more is a
// prompt, run eagerly.
const mtpGraphRows = 16

// maxGraphs bounds the recordings kept (each holds its graph and inputs).
const maxGraphs = 64

// stepGraph is one recorded step.
type stepGraph struct {
	exec  *cuda.GraphExec
	outs  []backend.Tensor
	meta  *cuda.Buffer     // the step's inputs: devBatch words, then the token ids
	stage *cuda.HostBuffer // pinned staging of meta
	words int              // int32 words of meta
	cap   int              // context capacity (tokens)
	nodes int
	used  uint64 // replay clock at last use
}

// recording is the state while a step is captured.
type recording struct {
	bt    *backend.Batch
	ids   []int32
	db    devBatch
	tok   cuda.DevicePtr    // token ids on the device
	subs  []subLayout       // the parts of a step with drafts
	lists [numLists]recList // its index lists (stepLists)
	// totals: the key holds the batch's totals, not its sequences' rows
	// (totalsKey): what the lists do not give must not depend on them.
	totals bool
}

// recList is one index list of a recorded step, on the host and in its
// inputs on the device.
type recList struct {
	host []int32
	ptr  cuda.DevicePtr
}

// subLayout is one part of a recorded step with drafts.
type subLayout struct {
	words []int32
	db    devBatch
}

// graphSet holds the recordings of a backend.
type graphSet struct {
	on     bool
	arena  *cuda.Pool
	graphs map[string]*stepGraph
	seen   map[string]bool
	failed map[string]error
	clock  uint64
	stats  GraphStats   // counts; Graphs, Nodes and Failed filled on demand
	timer  *replayTimer // Options.TimeReplays
}

// replayTimer times replays on the device: an event before the inputs' copy
// and one after the graph. A replay's time is read at the next replay or at
// GraphStats, when the caller has long waited for the step's output.
type replayTimer struct {
	start, end *cuda.Event
	pending    bool
	ms         []float32
}

func newReplayTimer(ctx *cuda.Context) (*replayTimer, error) {
	start, err := ctx.NewEvent()
	if err != nil {
		return nil, err
	}
	end, err := ctx.NewEvent()
	if err != nil {
		start.Close()
		return nil, err
	}
	return &replayTimer{start: start, end: end}, nil
}

// flush records the time of the last replay.
func (t *replayTimer) flush() error {
	if t == nil || !t.pending {
		return nil
	}
	t.pending = false
	if err := t.end.Synchronize(); err != nil {
		return err
	}
	ms, err := t.end.ElapsedMs(t.start)
	if err != nil {
		return err
	}
	t.ms = append(t.ms, ms)
	return nil
}

func (t *replayTimer) close() {
	if t != nil {
		t.start.Close()
		t.end.Close()
	}
}

// GraphCounts counts how steps of one kind ran.
type GraphCounts struct{ Recorded, Replayed, Eager int }

// GraphStats counts how steps ran.
type GraphStats struct {
	Graphs, Recorded, Replayed, Eager int
	// Kinds splits the counts by step kind: "step" (the main model's
	// steps without drafts), "verify" (with drafts), "mtp" (the MTP
	// block's passes), "dspark ctx" and "dspark" (the DSpark drafter's
	// context and block passes).
	Kinds  map[string]GraphCounts
	Nodes  int // nodes (kernels, copies, memsets) of the recordings kept
	Failed []string
	// ReplayMs is the device time of every replay (inputs' copy and graph),
	// in order, with Options.TimeReplays.
	ReplayMs []float32
}

// GraphStats reports how steps ran (tests, tools).
func (b *Backend) GraphStats() GraphStats {
	g := &b.graphs
	st := g.stats
	st.Kinds = maps.Clone(g.stats.Kinds)
	st.Graphs = len(g.graphs)
	for _, sg := range g.graphs {
		st.Nodes += sg.nodes
	}
	for k, err := range g.failed {
		st.Failed = append(st.Failed, k+": "+err.Error())
	}
	slices.Sort(st.Failed)
	if g.timer != nil {
		if err := g.timer.flush(); err != nil {
			st.Failed = append(st.Failed, "replay timing: "+err.Error())
		}
		st.ReplayMs = slices.Clone(g.timer.ms)
	}
	return st
}

// graphKey is the recorded layout of bt, or "" when bt is no decode step
// (one row per sequence) or verification.
func graphKey(bt *backend.Batch) (key string, capacity int) {
	key, capacity = layoutKey(bt)
	if key != "" && bt.Hidden {
		key += " hidden"
	}
	return key, capacity
}

// layoutKey is graphKey without the outputs.
func layoutKey(bt *backend.Batch) (key string, capacity int) {
	if strings.HasPrefix(bt.Name, "dspark") {
		return dsparkKey(bt)
	}
	if len(bt.Seqs) == 0 || bt.Name != "" && bt.Name != "mtp" && bt.Name != "verify" {
		return "", 0
	}
	end := 0
	var spec strings.Builder
	mtp := bt.Name == "mtp"
	for _, s := range bt.Seqs {
		switch {
		case (mtp || bt.Name == "verify") && s.Rows >= 1 && s.Rows <= mtpGraphRows:
			fmt.Fprintf(&spec, " %d", s.Rows)
		case s.Rows != 1:
			return "", 0
		default:
			spec.WriteString(" 1")
		}
		end = max(end, s.Start+s.Rows)
	}
	capacity = ctxBucketMin
	for capacity < end {
		capacity *= 2
	}
	if mtp { // the last rows are inputs
		return fmt.Sprintf("mtp n=%d ctx=%d rows=%d", len(bt.Seqs), capacity, bt.Rows()), capacity
	}
	if bt.Rows() == len(bt.Seqs) {
		return fmt.Sprintf("decode n=%d ctx=%d", len(bt.Seqs), capacity), capacity
	}
	return fmt.Sprintf("verify n=%d ctx=%d rows%s", len(bt.Seqs), capacity, spec.String()), capacity
}

// dsparkKey is graphKey of a DSpark pass: the batch, the context bucket and
// the rows in all (a context pass: at most mtpGraphRows a sequence, more is
// a prompt, run eagerly).
func dsparkKey(bt *backend.Batch) (string, int) {
	switch bt.Name {
	case "dspark ctx", "dspark", "dspark draw":
	default:
		return "", 0
	}
	if len(bt.Seqs) == 0 {
		return "", 0
	}
	end := 0
	for _, s := range bt.Seqs {
		if s.Rows < 1 || bt.Name == "dspark ctx" && s.Rows > mtpGraphRows {
			return "", 0
		}
		end = max(end, s.Start+s.Rows)
	}
	capacity := ctxBucketMin
	for capacity < end {
		capacity *= 2
	}
	return fmt.Sprintf("%s n=%d ctx=%d rows=%d", bt.Name, len(bt.Seqs), capacity, bt.Rows()), capacity
}

// stepWords appends the device inputs of the step bt to dst: its layout,
// then the further layouts of its ops (Batch.Also), and its index lists
// (stepLists). It returns the layouts and the lists' word ranges
// in dst (empty for the lists a step has not).
func stepWords(bt *backend.Batch, capBlk int, dst []int32) ([]int32, []devBatch, [numLists][2]int, error) {
	var at [numLists][2]int
	dst, db, err := layoutBatch(bt, capBlk, dst)
	if err != nil {
		return nil, nil, at, err
	}
	dbs := []devBatch{db}
	lists := stepLists(bt)
	for _, part := range bt.Also {
		if dst, db, err = layoutBatch(part, capBlk, dst); err != nil {
			return nil, nil, at, err
		}
		dbs = append(dbs, db)
	}
	for i, l := range lists {
		at[i] = [2]int{len(dst), len(dst) + len(l)}
		dst = append(dst, l...)
	}
	return dst, dbs, at, nil
}

// The index lists of a step, inputs of its recording, so that its key need
// not hold what they index: for an MTP pass the last row of every sequence
// (the head's gather).
const (
	listLast = iota
	numLists
)

// stepLists returns bt's index lists by role.
func stepLists(bt *backend.Batch) (l [numLists][]int32) {
	if bt.Name == "mtp" {
		for _, sq := range bt.Seqs {
			l[listLast] = append(l[listLast], int32(sq.Row0+sq.Rows-1))
		}
	}
	return l
}

func int32s(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// list returns the device copy of the recorded step's index list of the
// given role when idx is it, else 0.
func (c *recording) list(role int, idx []int32) cuda.DevicePtr {
	if c == nil || len(c.lists[role].host) == 0 || !slices.Equal(idx, c.lists[role].host) {
		return 0
	}
	return c.lists[role].ptr
}

// fixed reports whether a gather of rows (or, nil, a slot copy) that is no
// input list may be baked into the recording: its key must fix what it
// names. A key of totals fixes the strided gathers that start in the first
// stride (every row, or one hc stream of every row), which depend on the
// row count alone.
func (c *recording) fixed(rows []int) bool {
	if !c.totals {
		return true
	}
	if len(rows) == 0 {
		return false
	}
	if len(rows) == 1 {
		return rows[0] == 0
	}
	st := rows[1] - rows[0]
	if st < 1 || rows[0] >= st {
		return false
	}
	for i := 2; i < len(rows); i++ {
		if rows[i]-rows[i-1] != st {
			return false
		}
	}
	return true
}

// RecordStep implements backend.Backend.
func (b *Backend) RecordStep(bt *backend.Batch, ids []int32, forward func() ([]backend.Tensor, error)) ([]backend.Tensor, error) {
	b.pdlFor(bt)
	g := &b.graphs
	kind := stepKind(bt)
	key, capacity := graphKey(bt)
	if !g.on || key == "" || b.rec != nil || len(ids) != bt.Rows() || !b.fits(bt, capacity) {
		g.count(kind, 0, 0, 1)
		return forward()
	}
	if sg := g.graphs[key]; sg != nil {
		return b.replay(sg, bt, ids, kind)
	}
	if _, bad := g.failed[key]; bad || !g.seen[key] {
		g.seen[key] = true
		g.count(kind, 0, 0, 1)
		return forward()
	}
	sg, err := b.record(bt, ids, capacity, forward)
	if err != nil {
		// Record nothing for this layout again; the step runs eagerly (and
		// reports its own error if forward itself failed).
		g.failed[key] = err
		g.count(kind, 0, 0, 1)
		return forward()
	}
	if len(g.graphs) >= maxGraphs {
		b.evictGraph()
	}
	g.graphs[key] = sg
	g.count(kind, 1, 0, 0)
	return b.replay(sg, bt, ids, kind)
}

// fits reports whether bt's block tables fit a recording of capacity
// tokens (an MTP pass lags the cache, whose blocks may reach past it).
func (b *Backend) fits(bt *backend.Batch, capacity int) bool {
	capBlk := b.capBlocks(capacity)
	for _, s := range bt.Seqs {
		if len(s.Blocks) > capBlk {
			return false
		}
	}
	return true
}

// totalsKey reports whether bt's key holds only totals (graphKey): an MTP
// or DSpark pass.
func totalsKey(bt *backend.Batch) bool {
	return bt.Name == "mtp" || strings.HasPrefix(bt.Name, "dspark")
}

// stepKind names bt's kind in GraphStats.Kinds.
func stepKind(bt *backend.Batch) string {
	switch {
	case strings.HasPrefix(bt.Name, "mtp"):
		return "mtp"
	case bt.Name == "dspark ctx":
		return "dspark ctx"
	case strings.HasPrefix(bt.Name, "dspark"):
		return "dspark"
	case bt.Name == "verify":
		return "verify"
	}
	return "step"
}

// count adds to the totals and to kind's counts.
func (g *graphSet) count(kind string, recorded, replayed, eager int) {
	g.stats.Recorded += recorded
	g.stats.Replayed += replayed
	g.stats.Eager += eager
	if g.stats.Kinds == nil {
		g.stats.Kinds = map[string]GraphCounts{}
	}
	c := g.stats.Kinds[kind]
	c.Recorded += recorded
	c.Replayed += replayed
	c.Eager += eager
	g.stats.Kinds[kind] = c
}

// record captures forward's ops into a new graph.
func (b *Backend) record(bt *backend.Batch, ids []int32, capacity int, forward func() ([]backend.Tensor, error)) (*stepGraph, error) {
	g := &b.graphs
	if g.arena == nil {
		g.arena = b.ctx.NewPool()
	}
	capBlk := b.capBlocks(capacity)
	words, dbs, lists, err := stepWords(bt, capBlk, nil)
	if err != nil {
		return nil, err
	}
	sg := &stepGraph{words: len(words) + len(ids), cap: capacity}
	if sg.meta, err = b.ctx.Alloc(4 * sg.words); err != nil {
		return nil, err
	}
	if sg.stage, err = b.ctx.AllocHost(4 * sg.words); err != nil {
		sg.free()
		return nil, err
	}
	rec := &recording{bt: bt, ids: ids, tok: sg.meta.Ptr.Add(4 * len(words))}
	at := 0
	for i := range dbs {
		d := &dbs[i]
		n := SeqFields*d.NSeq + 2*d.Rows + capBlk*d.NSeq
		d.place(sg.meta.Ptr.Add(4 * at))
		d.MaxEnd = capacity
		if i == 0 {
			rec.db = *d
		} else {
			rec.subs = append(rec.subs, subLayout{words: words[at : at+n], db: *d})
		}
		at += n
	}
	for i, r := range lists {
		rec.lists[i] = recList{host: words[r[0]:r[1]], ptr: sg.meta.Ptr.Add(4 * r[0])}
	}
	rec.totals = totalsKey(bt)
	b.rec = rec
	if err := b.s.BeginCapture(); err != nil {
		b.rec = nil
		sg.free()
		return nil, err
	}
	outs, ferr := forward()
	if err := b.Join(); ferr == nil { // a capture ends only with its forks joined
		ferr = err
	}
	graph, cerr := b.s.EndCapture()
	b.rec = nil
	if ferr == nil && cerr != nil {
		ferr = cerr
	}
	if ferr != nil {
		if graph != nil {
			graph.Close()
		}
		sg.free()
		return nil, fmt.Errorf("record step: %w", ferr)
	}
	defer graph.Close()
	if sg.nodes, err = graph.Nodes(); err != nil {
		sg.free()
		return nil, err
	}
	if sg.exec, err = graph.Instantiate(); err != nil {
		sg.free()
		return nil, err
	}
	sg.outs = outs
	return sg, nil
}

// replay runs a recorded step with bt's inputs.
func (b *Backend) replay(sg *stepGraph, bt *backend.Batch, ids []int32, kind string) ([]backend.Tensor, error) {
	g := &b.graphs
	capBlk := b.capBlocks(sg.cap)
	host := unsafeInt32s(sg.stage.Bytes())[:0]
	host, _, _, err := stepWords(bt, capBlk, host)
	if err != nil {
		return nil, err
	}
	host = append(host, ids...)
	if len(host) != sg.words {
		return nil, fmt.Errorf("replay step: %d input words, the recording holds %d", len(host), sg.words)
	}
	// The staging is pinned: the copy is asynchronous, and the next replay of
	// this graph rewrites the staging only after the caller has synchronised
	// (it downloads the step's output).
	t := g.timer
	if t != nil {
		if err := t.flush(); err != nil {
			return nil, fmt.Errorf("replay step: timing: %w", err)
		}
		if err := t.start.Record(b.s); err != nil {
			return nil, fmt.Errorf("replay step: %w", err)
		}
	}
	if err := b.s.CopyHtoD(sg.meta.Ptr, sg.stage.Bytes()); err != nil {
		return nil, fmt.Errorf("replay step: %w", err)
	}
	if err := sg.exec.Launch(b.s); err != nil {
		return nil, fmt.Errorf("replay step: %w", err)
	}
	if t != nil {
		if err := t.end.Record(b.s); err != nil {
			return nil, fmt.Errorf("replay step: %w", err)
		}
		t.pending = true
	}
	g.clock++
	sg.used = g.clock
	g.count(kind, 0, 1, 0)
	return sg.outs, nil
}

// evictGraph drops the least recently replayed recording.
func (b *Backend) evictGraph() {
	g := &b.graphs
	var oldest string
	for k, sg := range g.graphs {
		if oldest == "" || sg.used < g.graphs[oldest].used {
			oldest = k
		}
	}
	if sg := g.graphs[oldest]; sg != nil {
		// The stream may still run its last replay.
		_ = b.s.Synchronize()
		sg.free()
		delete(g.graphs, oldest)
	}
}

func (sg *stepGraph) free() {
	if sg.exec != nil {
		_ = sg.exec.Close()
		sg.exec = nil
	}
	if sg.meta != nil {
		sg.meta.Free()
		sg.meta = nil
	}
	if sg.stage != nil {
		_ = sg.stage.Close()
		sg.stage = nil
	}
}

// closeGraphs frees every recording and the arena (the stream is idle).
func (b *Backend) closeGraphs() error {
	g := &b.graphs
	for k, sg := range g.graphs {
		sg.free()
		delete(g.graphs, k)
	}
	g.timer.close()
	g.timer = nil
	if g.arena != nil {
		return g.arena.Trim()
	}
	return nil
}

// DropGraphs discards every recorded step; later steps record anew (the
// second time a layout is seen). A replay runs the kernels it captured, so a
// tool that changes the kernel choice or the side stream between runs drops
// them first. The counts of GraphStats go on.
func (b *Backend) DropGraphs() error {
	if err := b.sync(); err != nil {
		return err
	}
	g := &b.graphs
	for k, sg := range g.graphs {
		sg.free()
		delete(g.graphs, k)
	}
	clear(g.seen)
	clear(g.failed)
	return nil
}

// capBlocks is the block-table capacity of a recording: the blocks that
// hold capacity tokens (at least one slot).
func (b *Backend) capBlocks(capacity int) int {
	if b.blockTok <= 0 {
		return 1
	}
	return max((capacity+b.blockTok-1)/b.blockTok, 1)
}

// recordedIDs returns the device copy of ids when they are the recorded
// step's token ids (Embed, hash routing), else 0.
func (b *Backend) recordedIDs(ids []int32) cuda.DevicePtr {
	if c := b.rec; c != nil && len(ids) == len(c.ids) && (len(ids) == 0 || &ids[0] == &c.ids[0] || slices.Equal(ids, c.ids)) {
		return c.tok
	}
	return 0
}
