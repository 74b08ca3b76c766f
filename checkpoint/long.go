package checkpoint

// LongConfig is a 3-layer model (SWA, CSA, HCA) at toy width for checks at
// long context, where the small preset's 6 layers cost too much on a CPU: the
// indexer's pass over every compressed key grows with the context. YaRN's
// original context is 4,096 tokens, so positions past it exercise the
// scaling; index_topk 8 selects among thousands of CSA entries.
func LongConfig() *Config {
	c := SmallConfig()
	c.Layers, c.HashLayers, c.MTPLayers = 3, 1, 0
	c.CompressRatios = []int{0, 4, 128}
	c.Dim, c.Heads, c.OGroups, c.OLoraRank, c.QLoraRank = 128, 2, 1, 64, 64
	c.IndexHeads, c.IndexTopK = 1, 8
	c.Experts, c.TopK, c.MoEInter = 4, 2, 64
	c.Vocab = 256
	c.RopeScaling.OriginalLen = 4096
	return c
}
