package backend

import (
	"fmt"
	"reflect"
)

// The argument and shape rules of the Backend ops, one validator per op,
// written against the handle interfaces only so that every backend applies
// the same rules with the same messages. A backend calls the op's validator
// first and keeps only its own limits (kernel alignment, handle types).

// isNil reports a nil handle, also one holding a nil pointer (whose methods
// would panic).
func isNil(h any) bool {
	if h == nil {
		return true
	}
	v := reflect.ValueOf(h)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

func (d DType) name() string {
	switch d {
	case F32:
		return "F32"
	case I32:
		return "I32"
	}
	return fmt.Sprintf("dtype %d", int(d))
}

// want checks that t is a dt tensor of rows×cols (a negative size: any).
func want(t Tensor, rows, cols int, dt DType, what string) error {
	if isNil(t) {
		return fmt.Errorf("%s: no tensor", what)
	}
	if t.DType() != dt {
		return fmt.Errorf("%s: want %s tensor", what, dt.name())
	}
	if (rows >= 0 && t.Rows() != rows) || (cols >= 0 && t.Cols() != cols) {
		return fmt.Errorf("%s: tensor is %dx%d, want %dx%d", what, t.Rows(), t.Cols(), rows, cols)
	}
	return nil
}

// firstErr returns the first non-nil error of errs.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Tensors returns ts as the calling backend's tensor type T once check, the
// op's Check result, is nil: an op checks and converts in one call.
func Tensors[T Tensor](check error, op string, ts ...Tensor) ([]T, error) {
	if check != nil {
		return nil, check
	}
	out := make([]T, len(ts))
	for i, t := range ts {
		h, ok := t.(T)
		if !ok || isNil(h) {
			return nil, fmt.Errorf("%s: tensor %T is not a %T", op, t, h)
		}
		out[i] = h
	}
	return out, nil
}

// As is Tensors for one tensor.
func As[T Tensor](check error, op string, t Tensor) (T, error) {
	h, ok := t.(T)
	if check == nil && (!ok || isNil(h)) {
		check = fmt.Errorf("%s: tensor %T is not a %T", op, t, h)
	}
	return h, check
}

// Args is Tensors for an op with a prepared weight w, returned as the
// calling backend's type W.
func Args[W any, T Tensor](check error, op string, w any, ts ...Tensor) (W, []T, error) {
	t, err := Tensors[T](check, op, ts...)
	h, ok := w.(W)
	if err == nil && (!ok || isNil(h)) {
		err = fmt.Errorf("%s: weight %T is not a %T", op, w, h)
	}
	return h, t, err
}

// CheckView checks that t can be viewed as rows×cols.
func CheckView(t Tensor, rows, cols int) error {
	if isNil(t) {
		return fmt.Errorf("view: no tensor")
	}
	if rows < 0 || cols < 0 || rows*cols != t.Rows()*t.Cols() {
		return fmt.Errorf("view %dx%d as %dx%d", t.Rows(), t.Cols(), rows, cols)
	}
	return nil
}

// CheckSlice checks a view of t's rows [row0, row0+rows).
func CheckSlice(t Tensor, row0, rows int) error {
	if isNil(t) {
		return fmt.Errorf("slice: no tensor")
	}
	if row0 < 0 || rows < 0 || row0+rows > t.Rows() {
		return fmt.Errorf("slice: rows [%d, %d) of %d", row0, row0+rows, t.Rows())
	}
	return nil
}

// CheckCopy checks a host copy of n values to or from the dt tensor t (op:
// "upload" or "download").
func CheckCopy(op string, t Tensor, dt DType, n int) error {
	if err := want(t, -1, -1, dt, op); err != nil {
		return err
	}
	if n != t.Rows()*t.Cols() {
		return fmt.Errorf("%s: %d values for %dx%d", op, n, t.Rows(), t.Cols())
	}
	return nil
}

// CheckKVSpec checks the sizes of a KVStore.
func CheckKVSpec(spec KVSpec) error {
	if spec.MaxSlots < 0 || spec.MaxBlocks < 0 {
		return fmt.Errorf("kv store: %d slots %d blocks", spec.MaxSlots, spec.MaxBlocks)
	}
	if spec.Slack < 0 {
		return fmt.Errorf("kv store: slack %d", spec.Slack)
	}
	for i, l := range spec.Layers {
		if l.Ratio != 0 && (spec.BlockTokens <= 0 || spec.BlockTokens%l.Ratio != 0) {
			return fmt.Errorf("kv store: layer %d ratio %d does not divide block tokens %d", i, l.Ratio, spec.BlockTokens)
		}
		if l.Window <= 0 || l.HeadDim <= 0 {
			return fmt.Errorf("kv store: layer %d window %d head dim %d", i, l.Window, l.HeadDim)
		}
	}
	return nil
}

// CheckResetSlot checks ResetSlot's slot.
func CheckResetSlot(s KVStore, slot int) error {
	if isNil(s) {
		return fmt.Errorf("reset slot: no kv store")
	}
	if n := s.Spec().MaxSlots; slot < 0 || slot >= n {
		return fmt.Errorf("kv store: slot %d of %d", slot, n)
	}
	return nil
}

// CheckCopySlot checks CopySlot's slots and layer range.
func CheckCopySlot(s KVStore, a SlotCopy) error {
	if isNil(s) {
		return fmt.Errorf("copy slot: no kv store")
	}
	sp := s.Spec()
	if a.Dst < 0 || a.Dst >= sp.MaxSlots || a.Src < 0 || a.Src >= sp.MaxSlots {
		return fmt.Errorf("copy slot: slots %d <- %d of %d", a.Dst, a.Src, sp.MaxSlots)
	}
	if a.From < 0 || a.From > a.To || a.To > len(sp.Layers) {
		return fmt.Errorf("copy slot: layers [%d, %d) of %d", a.From, a.To, len(sp.Layers))
	}
	if a.Part < SlotAll || a.Part > SlotIndexComp {
		return fmt.Errorf("copy slot: part %d", a.Part)
	}
	return nil
}

// CheckCopySlots checks each copy of a CopySlot call and that they are
// independent.
func CheckCopySlots(s KVStore, cs []SlotCopy) error {
	dst := map[int]bool{}
	for _, a := range cs {
		if err := CheckCopySlot(s, a); err != nil {
			return err
		}
		if dst[a.Dst] {
			return fmt.Errorf("copy slot: slot %d is the destination of two copies of one call", a.Dst)
		}
		dst[a.Dst] = true
	}
	for _, a := range cs {
		if dst[a.Src] {
			return fmt.Errorf("copy slot: slot %d is a source and a destination of one call", a.Src)
		}
	}
	return nil
}

// CheckCopyBlock checks CopyBlock's block ids.
func CheckCopyBlock(s KVStore, dst, src int32) error {
	if isNil(s) {
		return fmt.Errorf("copy block: no kv store")
	}
	if n := int32(s.Spec().MaxBlocks); dst < 0 || dst >= n || src < 0 || src >= n {
		return fmt.Errorf("copy block: blocks %d <- %d of %d", dst, src, n)
	}
	return nil
}

// CheckEmbed checks Embed's arguments, the token ids included.
func CheckEmbed(e Embedding, ids []int32, streams int, out Tensor) error {
	if isNil(e) {
		return fmt.Errorf("embed: table %T", e)
	}
	if err := want(out, len(ids), streams*e.Dim(), F32, "embed output"); err != nil {
		return err
	}
	for _, id := range ids {
		if id < 0 || int(id) >= e.Vocab() {
			return fmt.Errorf("embed: token id %d outside vocab %d", id, e.Vocab())
		}
	}
	return nil
}

// CheckRMSNorm checks RMSNorm's arguments.
func CheckRMSNorm(x Tensor, w Vec, out Tensor) error {
	if isNil(w) {
		return fmt.Errorf("rmsnorm: weight %T", w)
	}
	if err := want(x, -1, -1, F32, "rmsnorm input"); err != nil {
		return err
	}
	if d := w.Len(); d == 0 || x.Cols()%d != 0 {
		return fmt.Errorf("rmsnorm: width %d not a multiple of weight %d", x.Cols(), d)
	}
	return want(out, x.Rows(), x.Cols(), F32, "rmsnorm output")
}

// CheckHeadNorm checks HeadNorm's arguments.
func CheckHeadNorm(x Tensor, headDim int) error {
	if err := want(x, -1, -1, F32, "head norm"); err != nil {
		return err
	}
	if headDim <= 0 || x.Cols()%headDim != 0 {
		return fmt.Errorf("head norm: width %d not a multiple of %d", x.Cols(), headDim)
	}
	return nil
}

// checkHC checks an hc site against x and a.Streams and returns the width
// of one stream.
func checkHC(op string, x Tensor, h HC, a HcArgs) (int, error) {
	if isNil(h) {
		return 0, fmt.Errorf("%s: params %T", op, h)
	}
	if err := want(x, -1, h.Width(), F32, op+" input"); err != nil {
		return 0, err
	}
	if a.Streams <= 0 || h.Width()%a.Streams != 0 {
		return 0, fmt.Errorf("%s: width %d vs %d streams", op, h.Width(), a.Streams)
	}
	return h.Width() / a.Streams, nil
}

// CheckHcPre checks HcPre's arguments.
func CheckHcPre(x Tensor, h HC, a HcArgs, out, mix Tensor) error {
	d, err := checkHC("hc pre", x, h, a)
	if err != nil {
		return err
	}
	n := a.Streams
	if h.Mix() != (2+n)*n || h.Scales() != 3 {
		return fmt.Errorf("hc pre: mix %d / %d scales for %d streams", h.Mix(), h.Scales(), n)
	}
	if err := want(out, x.Rows(), d, F32, "hc pre output"); err != nil {
		return err
	}
	return want(mix, x.Rows(), n+n*n, F32, "hc pre mix")
}

// CheckHcPost checks HcPost's arguments.
func CheckHcPost(o, x, mix Tensor, a HcArgs, out Tensor) error {
	if err := want(x, -1, -1, F32, "hc post residual"); err != nil {
		return err
	}
	n := a.Streams
	if n <= 0 || x.Cols()%n != 0 {
		return fmt.Errorf("hc post: width %d vs %d streams", x.Cols(), n)
	}
	return firstErr(
		want(o, x.Rows(), x.Cols()/n, F32, "hc post sub-layer output"),
		want(mix, x.Rows(), n+n*n, F32, "hc post mix"),
		want(out, x.Rows(), x.Cols(), F32, "hc post output"))
}

// CheckHcHead checks HcHead's arguments.
func CheckHcHead(x Tensor, h HC, a HcArgs, out Tensor) error {
	d, err := checkHC("hc head", x, h, a)
	if err != nil {
		return err
	}
	n := a.Streams
	if h.Mix() != n || h.Scales() != 1 {
		return fmt.Errorf("hc head: mix %d / %d scales for %d streams", h.Mix(), h.Scales(), n)
	}
	return want(out, x.Rows(), d, F32, "hc head output")
}

// CheckAddStreams checks AddStreams' arguments.
func CheckAddStreams(x, e Tensor) error {
	if err := want(e, -1, -1, F32, "add streams term"); err != nil {
		return err
	}
	if err := want(x, e.Rows(), -1, F32, "add streams"); err != nil {
		return err
	}
	if e.Cols() == 0 || x.Cols()%e.Cols() != 0 {
		return fmt.Errorf("add streams: width %d vs %d", x.Cols(), e.Cols())
	}
	return nil
}

// checkLinear checks x [N, In] and out [N, Out] against w (op: "linear" or
// "linear-f32").
func checkLinear(op string, x Tensor, w Linear, out Tensor) error {
	if isNil(w) {
		return fmt.Errorf("%s: weight %T", op, w)
	}
	if err := want(x, -1, w.In(), F32, op+" "+w.Name()+" input"); err != nil {
		return err
	}
	return want(out, x.Rows(), w.Out(), F32, op+" "+w.Name()+" output")
}

// CheckLinear checks Linear's arguments.
func CheckLinear(x Tensor, w Linear, out Tensor) error { return checkLinear("linear", x, w, out) }

// CheckLinears checks Linears' arguments: every pair as Linear's.
func CheckLinears(x Tensor, ws []Linear, outs []Tensor) error {
	if len(ws) != len(outs) {
		return fmt.Errorf("linears: %d weights, %d outputs", len(ws), len(outs))
	}
	for i, w := range ws {
		if err := CheckLinear(x, w, outs[i]); err != nil {
			return err
		}
	}
	return nil
}

// CheckLinearF32 checks LinearF32's arguments.
func CheckLinearF32(x Tensor, w Linear, out Tensor) error {
	return checkLinear("linear-f32", x, w, out)
}

// CheckGroupedOutProj checks GroupedOutProj's arguments.
func CheckGroupedOutProj(x Tensor, w Linear, groups int, out Tensor) error {
	if isNil(w) {
		return fmt.Errorf("grouped out proj: weight %T", w)
	}
	if groups <= 0 || w.Out()%groups != 0 {
		return fmt.Errorf("grouped out proj %s: %d rows not divisible into %d groups", w.Name(), w.Out(), groups)
	}
	if err := want(x, -1, groups*w.In(), F32, "grouped out proj input"); err != nil {
		return err
	}
	return want(out, x.Rows(), w.Out(), F32, "grouped out proj output")
}

// CheckScale checks Scale's tensor.
func CheckScale(x Tensor) error { return want(x, -1, -1, F32, "scale") }

// CheckRope checks Rope's arguments.
func CheckRope(x Tensor, a RopeArgs, b *Batch) error {
	if b == nil {
		return fmt.Errorf("rope: no batch")
	}
	if err := want(x, b.Rows(), -1, F32, "rope"); err != nil {
		return err
	}
	if a.Freqs == nil || a.HeadDim <= 0 || x.Cols()%a.HeadDim != 0 || a.Freqs.Dim() > a.HeadDim {
		return fmt.Errorf("rope: width %d, head dim %d", x.Cols(), a.HeadDim)
	}
	return nil
}

// CheckKVQuant checks KVQuant's arguments.
func CheckKVQuant(x Tensor, nope, block int) error {
	if err := want(x, -1, -1, F32, "kv quant"); err != nil {
		return err
	}
	if nope < 0 || nope > x.Cols() || block <= 0 {
		return fmt.Errorf("kv quant: nope %d of %d, block %d", nope, x.Cols(), block)
	}
	return nil
}

// CheckHadamardFP4 checks HadamardFP4's arguments.
func CheckHadamardFP4(x Tensor, headDim int) error {
	if err := want(x, -1, -1, F32, "hadamard"); err != nil {
		return err
	}
	if headDim <= 0 || headDim&(headDim-1) != 0 || x.Cols()%headDim != 0 {
		return fmt.Errorf("hadamard: width %d, head dim %d", x.Cols(), headDim)
	}
	return nil
}

// CheckRopeHadamardFP4 checks RopeHadamardFP4's arguments: its parts'.
func CheckRopeHadamardFP4(x Tensor, a RopeArgs, b *Batch) error {
	if err := CheckRope(x, a, b); err != nil {
		return err
	}
	return CheckHadamardFP4(x, a.HeadDim)
}

// checkLayer returns the spec of cache layer `layer` of s.
func checkLayer(op string, s KVStore, layer int, b *Batch) (LayerKV, error) {
	if isNil(s) {
		return LayerKV{}, fmt.Errorf("%s: no kv store", op)
	}
	if b == nil {
		return LayerKV{}, fmt.Errorf("%s: no batch", op)
	}
	ls := s.Spec().Layers
	if layer < 0 || layer >= len(ls) {
		return LayerKV{}, fmt.Errorf("kv store: layer %d of %d", layer, len(ls))
	}
	return ls[layer], nil
}

// CompressCoff is the compressor's c (spec §5.4): 2 for ratio 4, whose
// windows overlap, else 1.
func CompressCoff(ratio int) int {
	if ratio == 4 {
		return 2
	}
	return 1
}

// CheckCompress checks Compress's arguments against the store.
func CheckCompress(s KVStore, A, Z Tensor, a CompressArgs, b *Batch) error {
	lk, err := checkLayer("compress", s, a.Layer, b)
	if err != nil {
		return err
	}
	r, dc := a.Ratio, a.Dim
	if r != lk.Ratio || r == 0 || (a.Kind == CompressKV && dc != lk.HeadDim) || (a.Kind == CompressIndex && dc != lk.IndexDim) {
		return fmt.Errorf("compress layer %d: ratio %d dim %d do not match the store", a.Layer, r, dc)
	}
	w := CompressCoff(r) * dc
	if err := firstErr(want(A, b.Rows(), w, F32, "compress kv"), want(Z, b.Rows(), w, F32, "compress gate")); err != nil {
		return err
	}
	if isNil(a.APE) || a.APE.Rows() != r || a.APE.Cols() != w {
		return fmt.Errorf("compress layer %d: ape %T", a.Layer, a.APE)
	}
	if isNil(a.Norm) || a.Norm.Len() != dc {
		return fmt.Errorf("compress layer %d: norm %T", a.Layer, a.Norm)
	}
	if a.Rope == nil || a.Rope.Dim() > dc {
		return fmt.Errorf("compress layer %d: no rope of at most %d dims", a.Layer, dc)
	}
	return nil
}

// CheckIndexerTopK checks IndexerTopK's arguments against the store.
func CheckIndexerTopK(s KVStore, q, w Tensor, a IndexerArgs, b *Batch, out Tensor) error {
	lk, err := checkLayer("indexer", s, a.Layer, b)
	if err != nil {
		return err
	}
	if lk.Ratio == 0 || lk.IndexDim <= 0 || a.Ratio != lk.Ratio || a.HeadDim != lk.IndexDim {
		return fmt.Errorf("indexer layer %d: ratio %d dim %d do not match the store", a.Layer, a.Ratio, a.HeadDim)
	}
	n := b.Rows()
	return firstErr(
		want(q, n, a.Heads*a.HeadDim, F32, "indexer q"),
		want(w, n, a.Heads, F32, "indexer weights"),
		want(out, n, a.TopK, I32, "indexer top-k"))
}

// CheckSparseAttention checks SparseAttention's arguments against the store
// (sel only for ratio 4).
func CheckSparseAttention(s KVStore, q, kv, sel Tensor, a AttnArgs, b *Batch, out Tensor) error {
	lk, err := checkLayer("attention", s, a.Layer, b)
	if err != nil {
		return err
	}
	n, D, H := b.Rows(), a.HeadDim, a.Heads
	if D != lk.HeadDim || a.Window != lk.Window || a.Ratio != lk.Ratio {
		return fmt.Errorf("attention layer %d: head dim %d window %d ratio %d do not match the store", a.Layer, D, a.Window, a.Ratio)
	}
	if err := firstErr(
		want(q, n, H*D, F32, "attention q"),
		want(kv, n, D, F32, "attention kv"),
		want(out, n, H*D, F32, "attention output")); err != nil {
		return err
	}
	if a.Ratio == 4 {
		if err := want(sel, n, -1, I32, "attention selection"); err != nil {
			return err
		}
	}
	if isNil(a.Sink) || a.Sink.Len() != H {
		return fmt.Errorf("attention layer %d: sink %T", a.Layer, a.Sink)
	}
	return nil
}

// CheckWriteWindow checks WriteWindow's arguments against the store.
func CheckWriteWindow(s KVStore, layer int, kv Tensor, b *Batch) error {
	lk, err := checkLayer("write window", s, layer, b)
	if err != nil {
		return err
	}
	return want(kv, b.Rows(), lk.HeadDim, F32, "write window")
}

// CheckRouter checks Router's arguments, the hash layers' token ids
// included (the experts a tid2eid table holds are the backend's to check).
func CheckRouter(f Tensor, gate Linear, a RouterArgs, weights, ids Tensor) error {
	if isNil(gate) {
		return fmt.Errorf("router: gate %T", gate)
	}
	if err := want(f, -1, gate.In(), F32, "router input"); err != nil {
		return err
	}
	n, E, K := f.Rows(), gate.Out(), a.TopK
	if err := firstErr(want(weights, n, K, F32, "router weights"), want(ids, n, K, I32, "router ids")); err != nil {
		return err
	}
	if K <= 0 || K > E {
		return fmt.Errorf("router: top-%d of %d experts", K, E)
	}
	if a.Bias != nil && (isNil(a.Bias) || a.Bias.Len() != E) {
		return fmt.Errorf("router: bias %T for %d experts", a.Bias, E)
	}
	if a.Tid2Eid == nil {
		if a.Bias == nil {
			return fmt.Errorf("router: neither bias nor tid2eid")
		}
		return nil
	}
	if isNil(a.Tid2Eid) || a.Tid2Eid.Cols() != K {
		return fmt.Errorf("router: tid2eid %T for top-%d", a.Tid2Eid, K)
	}
	if len(a.IDs) != n {
		return fmt.Errorf("router: %d token ids for %d rows", len(a.IDs), n)
	}
	for _, id := range a.IDs {
		if id < 0 || int(id) >= a.Tid2Eid.Rows() {
			return fmt.Errorf("router: token id %d outside tid2eid (%d rows)", id, a.Tid2Eid.Rows())
		}
	}
	return nil
}

// CheckExperts checks Experts' arguments (expert ids are the backend's to
// check: the GPU checks them only when tracing).
func CheckExperts(f Tensor, e Experts, weights, ids Tensor, a ExpertsArgs, acc Tensor) error {
	if isNil(e) {
		return fmt.Errorf("experts: %T", e)
	}
	if err := want(f, -1, e.Dim(), F32, "experts input"); err != nil {
		return err
	}
	n := f.Rows()
	if err := want(ids, n, -1, I32, "experts ids"); err != nil {
		return err
	}
	return firstErr(
		want(weights, n, ids.Cols(), F32, "experts weights"),
		want(acc, n, e.Dim(), F32, "experts accumulator"))
}

// sameShape checks that a, b and c are F32 tensors of a's shape (op's
// operands named by what).
func sameShape(op string, what [3]string, a, b, c Tensor) error {
	if err := want(a, -1, -1, F32, op+" "+what[0]); err != nil {
		return err
	}
	return firstErr(
		want(b, a.Rows(), a.Cols(), F32, op+" "+what[1]),
		want(c, a.Rows(), a.Cols(), F32, op+" "+what[2]))
}

// CheckSwiGLU checks SwiGLU's arguments.
func CheckSwiGLU(g, u, out Tensor) error {
	return sameShape("swiglu", [3]string{"gate", "up", "output"}, g, u, out)
}

// CheckCombine checks Combine's arguments.
func CheckCombine(acc, shared, out Tensor) error {
	return sameShape("combine", [3]string{"acc", "shared", "output"}, acc, shared, out)
}

// CheckGatherRows checks GatherRows' arguments, the row indices included.
func CheckGatherRows(x Tensor, rows []int, out Tensor) error {
	if err := want(x, -1, -1, F32, "gather"); err != nil {
		return err
	}
	if err := want(out, len(rows), x.Cols(), F32, "gather output"); err != nil {
		return err
	}
	for _, r := range rows {
		if r < 0 || r >= x.Rows() {
			return fmt.Errorf("gather: row %d of %d", r, x.Rows())
		}
	}
	return nil
}

// CheckMarkovDraw checks MarkovDraw's shapes.
func CheckMarkovDraw(base Tensor, tokens []int32, k int, w1 Embedding, w2 Linear, ids Tensor) error {
	switch {
	case isNil(base) || isNil(ids) || isNil(w1) || isNil(w2):
		return fmt.Errorf("markov draw: nil operand")
	case k <= 0 || len(tokens) == 0 || len(tokens)%k != 0:
		return fmt.Errorf("markov draw: %d tokens in blocks of %d", len(tokens), k)
	case base.DType() != F32 || base.Rows() != len(tokens) || base.Cols() != w2.Out():
		return fmt.Errorf("markov draw: base %dx%d for %d rows of vocab %d", base.Rows(), base.Cols(), len(tokens), w2.Out())
	case w2.In() != w1.Dim():
		return fmt.Errorf("markov draw: w2 takes %d values, w1 rows have %d", w2.In(), w1.Dim())
	case ids.DType() != I32 || ids.Rows() != k || ids.Cols() != len(tokens)/k:
		return fmt.Errorf("markov draw: ids %dx%d, want I32 %dx%d", ids.Rows(), ids.Cols(), k, len(tokens)/k)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= w1.Vocab() {
			return fmt.Errorf("markov draw: token %d outside vocab %d", t, w1.Vocab())
		}
	}
	return nil
}
