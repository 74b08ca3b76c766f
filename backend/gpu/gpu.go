// Package gpu implements backend.Backend on an NVIDIA GPU with MegaMoE's own
// CUDA kernels (package cuda): every op of the forward pass is one or a few
// kernel launches on a single stream, so ops are ordered without host waits;
// the host synchronises only to download results. Small steps run
// independent ops on a second stream, ordered by events (side.go), unless
// Options.NoSideStream.
//
// Activations are fp32 (I32 for ids) device buffers, exactly like the CPU
// reference: in faithful mode the kernels round to bf16, quantise to FP8/FP4
// and store at the same points as backend/cpu, so the two backends compute the
// same function up to fp32 summation order (see docs/numerics.md).
//
// Every op of backend.Backend is implemented (see docs/gpu-verification.md for
// which ones are proven on the H200 so far); the MoE experts run in faithful
// numerics only (FP8 activations on tensor cores).
package gpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

// Options configure the GPU backend.
type Options struct {
	Device int  // CUDA device ordinal
	Graphs bool // record decode steps as CUDA graphs and replay them (RecordStep)
	NoPDL  bool // launch without programmatic dependent launch (cuda/pdl.go)
	// TimeReplays times every graph replay on the device (GraphStats.ReplayMs):
	// two events a step, so that tools can tell device time from host time.
	TimeReplays bool
	// NoSideStream runs every op on the main stream. Otherwise independent
	// ops of steps up to 64 rows run on a second stream beside it
	// (Backend.Fork: the shared expert beside the routed ones), which
	// shortens decode steps by a few percent (docs/performance.md).
	NoSideStream bool
}

// Backend is the CUDA backend.
type Backend struct {
	drv  *cuda.Driver
	dev  *cuda.Device
	ctx  *cuda.Context
	s    *cuda.Stream
	mode backend.Numerics

	mu       sync.Mutex
	ropes    map[any]*ropeTable // device frequency tables by *rope.Freqs
	batches  []*devBatch        // the last uploaded batch layouts, most recent first
	idxLists []*devIndex        // the last uploaded index lists (indexList), most recent first
	blockTok int                // the KV store's tokens per block (recorded layouts)
	graphs   graphSet           // recorded decode steps
	rec      *recording         // the step being recorded, if any
	pdl      bool               // programmatic dependent launch for small steps (pdlFor)
	drawBuf  *cuda.HostBuffer   // pinned staging of SampleDraw's parameters and ids
	side     sideStream         // forked ops (side.go)
	split    bool               // RopeHadamardFP4 and ExpertsCombinePost as their parts (SetSplitFused)
	closed   bool
}

// New opens the device and a stream. It fails with a clear error on machines
// without a CUDA driver or device.
func New(o Options) (*Backend, error) {
	drv, err := cuda.Load()
	if err != nil {
		return nil, fmt.Errorf("gpu backend: %w", err)
	}
	n, err := drv.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("gpu backend: %w", err)
	}
	if o.Device < 0 || o.Device >= n {
		return nil, fmt.Errorf("gpu backend: device %d of %d", o.Device, n)
	}
	dev, err := drv.Device(o.Device)
	if err != nil {
		return nil, fmt.Errorf("gpu backend: %w", err)
	}
	ctx, err := dev.NewContext()
	if err != nil {
		return nil, fmt.Errorf("gpu backend: %w", err)
	}
	s, err := ctx.NewStream()
	if err != nil {
		ctx.Close()
		return nil, fmt.Errorf("gpu backend: %w", err)
	}
	pdl := s.SetPDL(!o.NoPDL)
	b := &Backend{drv: drv, dev: dev, ctx: ctx, s: s, ropes: map[any]*ropeTable{}, pdl: pdl, side: sideStream{on: !o.NoSideStream}}
	b.graphs = graphSet{on: o.Graphs, graphs: map[string]*stepGraph{}, seen: map[string]bool{}, failed: map[string]error{}}
	if o.Graphs && o.TimeReplays {
		if b.graphs.timer, err = newReplayTimer(ctx); err != nil {
			b.Close()
			return nil, fmt.Errorf("gpu backend: %w", err)
		}
	}
	return b, nil
}

// pdlMaxRows is the largest step (rows) launched with programmatic dependent
// launch: it is faster at 1 and 8 rows and slower at 64 rows of the Flash
// stack.
const pdlMaxRows = 16

// pdlFor sets the backend stream's launch mode for the step of bt.
func (b *Backend) pdlFor(bt *backend.Batch) {
	b.s.SetPDL(b.pdl && bt.Rows() <= pdlMaxRows)
}

// PDL reports whether decode steps of up to pdlMaxRows rows are launched
// with programmatic dependent launch.
func (b *Backend) PDL() bool { return b.pdl }

// Close releases the stream and the context (all device memory).
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	err := b.sync()
	if e := b.closeSide(); err == nil {
		err = e
	}
	if e := b.closeGraphs(); err == nil {
		err = e
	}
	if b.drawBuf != nil {
		if e := b.drawBuf.Close(); err == nil {
			err = e
		}
	}
	if e := b.s.Close(); err == nil {
		err = e
	}
	if e := b.ctx.Close(); err == nil {
		err = e
	}
	return err
}

// Device describes the GPU.
func (b *Backend) Device() *cuda.Device { return b.dev }

// Context is the CUDA context (tests, tools).
func (b *Backend) Context() *cuda.Context { return b.ctx }

// Stream is the backend's stream (tests, tools).
func (b *Backend) Stream() *cuda.Stream { return b.s }

// Sync waits for all queued work and reports any asynchronous kernel error.
func (b *Backend) Sync() error { return b.sync() }

// sync joins an open fork and waits for the stream: a download or a check
// may read what the fork wrote.
func (b *Backend) sync() error {
	if err := b.Join(); err != nil {
		return err
	}
	return b.s.Synchronize()
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "cuda:" + b.dev.Name }

// SetNumerics implements backend.Backend.
func (b *Backend) SetNumerics(n backend.Numerics) { b.mode = n }

// Numerics implements backend.Backend.
func (b *Backend) Numerics() backend.Numerics { return b.mode }

func (b *Backend) faithful() bool { return b.mode == backend.Faithful }

// Tensor is a device activation buffer (fp32 or int32 elements).
type Tensor struct {
	rows, cols int
	dt         backend.DType
	buf        *cuda.Buffer // owner; nil for views
	ptr        cuda.DevicePtr
	// q8 (owned) holds these values FP8-quantised for the linears that take
	// them (fp8Layout), written with them by RMSNormQuant or SwiGLUQuant;
	// nil for plain tensors.
	q8 *cuda.Buffer
}

// Rows implements backend.Tensor.
func (t *Tensor) Rows() int { return t.rows }

// Cols implements backend.Tensor.
func (t *Tensor) Cols() int { return t.cols }

// DType implements backend.Tensor.
func (t *Tensor) DType() backend.DType { return t.dt }

// Ptr is the device address of element 0.
func (t *Tensor) Ptr() cuda.DevicePtr { return t.ptr }

// Row returns the device address of row r.
func (t *Tensor) Row(r int) cuda.DevicePtr { return t.ptr.Add(4 * r * t.cols) }

func (t *Tensor) bytes() int { return 4 * t.rows * t.cols }

// Alloc implements backend.Backend. Buffers start zeroed, like the CPU's.
// It panics only if the device is out of memory (the interface has no error).
func (b *Backend) Alloc(rows, cols int, dt backend.DType) backend.Tensor {
	t, err := b.alloc(rows, cols, dt)
	if err != nil {
		panic(fmt.Sprintf("gpu backend: alloc %dx%d: %v", rows, cols, err))
	}
	return t
}

// Empty implements backend.Backend: no zeroing (one graph node and one
// dependency less per activation of a decode step).
func (b *Backend) Empty(rows, cols int, dt backend.DType) backend.Tensor {
	t, err := b.empty(rows, cols, dt)
	if err != nil {
		panic(fmt.Sprintf("gpu backend: alloc %dx%d: %v", rows, cols, err))
	}
	return t
}

func (b *Backend) alloc(rows, cols int, dt backend.DType) (*Tensor, error) {
	t, err := b.empty(rows, cols, dt)
	if err != nil {
		return nil, err
	}
	if err := b.s.Memset8(t.ptr, 0, max(t.bytes(), 4)); err != nil {
		t.buf.Free()
		return nil, err
	}
	return t, nil
}

func (b *Backend) empty(rows, cols int, dt backend.DType) (*Tensor, error) {
	if rows < 0 || cols < 0 {
		return nil, fmt.Errorf("alloc: shape %dx%d", rows, cols)
	}
	t := &Tensor{rows: rows, cols: cols, dt: dt}
	buf, err := b.pool().Alloc(max(t.bytes(), 4))
	if err != nil {
		return nil, err
	}
	t.buf, t.ptr = buf, buf.Ptr
	return t, nil
}

// Poison fills t with 0xFF bytes (fp32 NaN, int32 -1), so that a test sees
// every element a kernel failed to write.
func (b *Backend) Poison(t backend.Tensor) error {
	g, err := gt(t)
	if err != nil {
		return err
	}
	return b.s.Memset8(g.ptr, 0xFF, g.bytes())
}

// View implements backend.Backend.
func (b *Backend) View(t backend.Tensor, rows, cols int) (backend.Tensor, error) {
	g, err := backend.As[*Tensor](backend.CheckView(t, rows, cols), "view", t)
	if err != nil {
		return nil, err
	}
	return &Tensor{rows: rows, cols: cols, dt: g.dt, ptr: g.ptr}, nil
}

// Slice implements backend.Backend (a view: its quantised copy is not kept).
func (b *Backend) Slice(t backend.Tensor, row0, rows int) (backend.Tensor, error) {
	g, err := backend.As[*Tensor](backend.CheckSlice(t, row0, rows), "slice", t)
	if err != nil {
		return nil, err
	}
	return &Tensor{rows: rows, cols: g.cols, dt: g.dt, ptr: g.Row(row0)}, nil
}

// Free implements backend.Backend (views free nothing but a quantised copy).
func (b *Backend) Free(t backend.Tensor) {
	g, ok := t.(*Tensor)
	if !ok || g == nil {
		return
	}
	if g.buf != nil {
		g.buf.Free()
		g.buf = nil
	}
	if g.q8 != nil {
		g.q8.Free()
		g.q8 = nil
	}
}

func gt(t backend.Tensor) (*Tensor, error) {
	g, ok := t.(*Tensor)
	if !ok || g == nil {
		return nil, fmt.Errorf("gpu: tensor %T is not a gpu tensor", t)
	}
	return g, nil
}

func f32(t backend.Tensor, rows, cols int, what string) (*Tensor, error) {
	return typed(t, rows, cols, backend.F32, what)
}

func typed(t backend.Tensor, rows, cols int, dt backend.DType, what string) (*Tensor, error) {
	g, err := gt(t)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if g.dt != dt {
		return nil, fmt.Errorf("%s: want %s tensor", what, map[backend.DType]string{backend.F32: "F32", backend.I32: "I32"}[dt])
	}
	if (rows >= 0 && g.rows != rows) || (cols >= 0 && g.cols != cols) {
		return nil, fmt.Errorf("%s: tensor is %dx%d, want %dx%d", what, g.rows, g.cols, rows, cols)
	}
	return g, nil
}

// Upload implements backend.Backend.
func (b *Backend) Upload(t backend.Tensor, data []float32) error {
	g, err := backend.As[*Tensor](backend.CheckCopy("upload", t, backend.F32, len(data)), "upload", t)
	if err != nil {
		return err
	}
	if b.rec != nil {
		return errHostInRecording
	}
	return b.s.CopyHtoD(g.ptr, cuda.Bytes(data))
}

// UploadI32 fills an I32 tensor (tests, tools).
func (b *Backend) UploadI32(t backend.Tensor, data []int32) error {
	g, err := backend.As[*Tensor](backend.CheckCopy("upload", t, backend.I32, len(data)), "upload", t)
	if err != nil {
		return err
	}
	if b.rec != nil {
		return errHostInRecording
	}
	return b.s.CopyHtoD(g.ptr, cuda.Bytes(data))
}

// Download implements backend.Backend.
func (b *Backend) Download(t backend.Tensor, dst []float32) error {
	g, err := backend.As[*Tensor](backend.CheckCopy("download", t, backend.F32, len(dst)), "download", t)
	if err != nil {
		return err
	}
	if err := b.Join(); err != nil { // t may come from the open fork
		return fmt.Errorf("download: %w", err)
	}
	if err := b.s.CopyDtoH(cuda.Bytes(dst), g.ptr); err != nil {
		return fmt.Errorf("download: %w", err)
	}
	return b.s.Synchronize() // joined above
}

// DownloadI32 implements backend.Backend.
func (b *Backend) DownloadI32(t backend.Tensor, dst []int32) error {
	g, err := backend.As[*Tensor](backend.CheckCopy("download", t, backend.I32, len(dst)), "download", t)
	if err != nil {
		return err
	}
	if err := b.Join(); err != nil { // t may come from the open fork
		return fmt.Errorf("download: %w", err)
	}
	if err := b.s.CopyDtoH(cuda.Bytes(dst), g.ptr); err != nil {
		return fmt.Errorf("download: %w", err)
	}
	return b.s.Synchronize() // joined above
}

// Stats implements backend.Backend (NaN tracer path: downloads t).
func (b *Backend) Stats(t backend.Tensor) backend.Stats {
	g, err := f32(t, -1, -1, "stats")
	if err != nil {
		return backend.Stats{FirstBad: -1}
	}
	v := make([]float32, g.rows*g.cols)
	if err := b.Download(g, v); err != nil {
		return backend.Stats{FirstBad: 0, Min: float32(math.NaN()), Max: float32(math.NaN()), AbsMax: float32(math.NaN())}
	}
	return backend.SliceStats(v)
}

// scratch allocates a temporary device buffer. Freeing it right after the
// launches that use it is safe: a later kernel of the same stream that reuses
// the memory is ordered after them, and while a fork runs on the side stream
// the pool holds freed blocks until the join.
func (b *Backend) scratch(n int) (*cuda.Buffer, error) {
	return b.pool().Alloc(max(n, 16))
}

// pool is where activations and scratch come from: the recordings' arena
// while a step is recorded, else the context's pool.
func (b *Backend) pool() *cuda.Pool {
	if b.rec != nil {
		return b.graphs.arena
	}
	return b.ctx.Pool()
}

// errHostInRecording: a recorded step would replay a copy of host memory
// that is gone by then; the recording fails and the step runs eagerly.
var errHostInRecording = errors.New("gpu: host upload inside a recorded step")

// upload copies host bytes into a new device buffer.
func (b *Backend) upload(data []byte) (*cuda.Buffer, error) {
	if b.rec != nil {
		return nil, errHostInRecording
	}
	buf, err := b.ctx.Alloc(max(len(data), 16))
	if err != nil {
		return nil, err
	}
	if err := b.s.CopyHtoD(buf.Ptr, data); err != nil {
		buf.Free()
		return nil, err
	}
	if b.side.open { // a table made inside a fork may be read by either stream next
		if err := b.s.Synchronize(); err != nil {
			buf.Free()
			return nil, err
		}
	}
	return buf, nil
}

// unsafeInt32s views b (4-byte aligned, as pinned memory is) as int32s.
func unsafeInt32s(b []byte) []int32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func putF64(dst []byte, v float64) { binary.LittleEndian.PutUint64(dst, math.Float64bits(v)) }
