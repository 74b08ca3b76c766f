package backend

// OpKind groups the methods of Backend.
type OpKind int

const (
	Memory   OpKind = iota // tensors: allocation, views, transfers, statistics
	Prepare                // weights and cache storage, once per model
	Compute                // one operation of the forward pass
	Fused                  // a composition of Compute ops (each method's comment)
	Schedule               // where and when ops run: side stream, step recording
)

// OpInfo names one method of Backend.
type OpInfo struct {
	Name string
	Kind OpKind
}

// Ops is the table of every method of Backend, grouped by kind. The
// op checker (package opcheck) runs every Compute and Fused op on both
// backends, and the decorators of package observe hand every one of them to
// their hook; tests hold both to this table, and this table to the
// interface. Adding an op: docs/architecture.md.
var Ops = []OpInfo{
	{"Name", Memory}, {"SetNumerics", Memory}, {"Numerics", Memory},
	{"Alloc", Memory}, {"Empty", Memory}, {"View", Memory}, {"Slice", Memory}, {"Free", Memory},
	{"Upload", Memory}, {"Download", Memory}, {"DownloadI32", Memory}, {"Stats", Memory},

	{"PrepareLinear", Prepare}, {"PrepareVec", Prepare}, {"PrepareMat", Prepare}, {"PrepareHC", Prepare},
	{"PrepareEmbedding", Prepare}, {"PrepareIDTable", Prepare}, {"PrepareExperts", Prepare},
	{"NewKVStore", Prepare}, {"ResetSlot", Prepare}, {"CopySlot", Prepare}, {"CopyBlock", Prepare},

	{"Embed", Compute}, {"RMSNorm", Compute}, {"HeadNorm", Compute},
	{"HcPre", Compute}, {"HcPost", Compute}, {"HcHead", Compute}, {"AddStreams", Compute},
	{"Linear", Compute}, {"LinearF32", Compute}, {"GroupedOutProj", Compute}, {"Scale", Compute},
	{"Rope", Compute}, {"KVQuant", Compute}, {"HadamardFP4", Compute},
	{"Compress", Compute}, {"IndexerTopK", Compute}, {"SparseAttention", Compute}, {"WriteWindow", Compute},
	{"Router", Compute}, {"Experts", Compute}, {"SwiGLU", Compute}, {"Combine", Compute}, {"GatherRows", Compute},

	{"Linears", Fused}, {"NormLinears", Fused}, {"HcPreNormLinears", Fused}, {"SwiGLULinear", Fused},
	{"HeadNormRope", Fused}, {"NormRopeKVQuant", Fused}, {"RopeHadamardFP4", Fused}, {"ExpertsCombine", Fused},
	{"ExpertsCombinePost", Fused},

	{"Fork", Schedule}, {"Join", Schedule}, {"RecordStep", Schedule},
}

// OpsOf returns the names of the ops of the given kinds.
func OpsOf(kinds ...OpKind) []string {
	var r []string
	for _, op := range Ops {
		for _, k := range kinds {
			if op.Kind == k {
				r = append(r, op.Name)
			}
		}
	}
	return r
}
