// Package kvcache keeps the per-sequence cache bookkeeping of spec §5.9: which
// state slot (window rings + compressor pending state) and which blocks
// (compressed entries and indexer keys, growing with the sequence) a sequence
// owns, and how many bytes that is. The storage itself lives in the backend,
// addressed by these slot and block ids.
//
// It also defines the compact storage formats of the cache and their byte
// geometry (format.go), and the per-component byte accounting of a model
// (account.go).
//
// # Main KV entry (window ring and compressed entries)
//
// An entry of HeadDim = Nope + Rope values (Flash/Pro: 448 + 64) holds the
// values after the reference's FP8 simulation (spec §5.3 step 7, §5.4 step 3):
// the nope dims are e4m3 codes times a power-of-two scale per 64 values, the
// rope dims are bf16. It is stored as, in this order:
//
//	[0, Nope)                   e4m3fn codes of the nope dims, one byte each
//	[Nope, Nope+2·Rope)         rope dims as bf16, little-endian
//	[Nope+2·Rope, +⌈Nope/64⌉)   ue8m0 scale bytes, 2^(b−127), one per 64 nope dims
//	then zero padding to a multiple of 8 bytes
//
// For Flash and Pro that is 448 + 128 + 7 + 1 = 584 bytes, the layout of
// FlashMLA's FP8 sparse cache for this model as vLLM uses it: the rope part
// starts at byte 448 (16-byte aligned) and consecutive entries stay 8-byte
// aligned. A scale byte of 0xFF (NaN) marks a block whose input held a NaN or
// an infinity; it decodes to NaN in every value of the block, as the
// simulation yields.
//
// # Indexer key (CSA layers)
//
// An index key of IndexDim values (128) holds the values after the Hadamard
// rotation and the FP4 simulation (spec §5.4 step 3, fp4_act_quant of §3.3:
// e2m1 codes times a power-of-two scale per 32 values, the reference's scales
// being e8m0). It is stored as:
//
//	[0, ⌈IndexDim/2⌉)           e2m1 codes, two per byte, element 2i in the low nibble
//	then ⌈IndexDim/32⌉          ue8m0 scale bytes, one per 32 values
//	then zero padding to a multiple of 4 bytes
//
// For Flash and Pro that is 64 + 4 = 68 bytes; the four scales can be read as
// one 32-bit word.
//
// Both formats hold the faithful simulation's values exactly: Decode(Encode(x))
// is x, bit for bit, when x is already rounded by the simulation (and finite:
// near the fp32 maximum the simulation can overflow to Inf), and for any other
// x Encode rounds exactly as the simulation does. The `exact` numerics round
// nothing, so they need the fp32 store (docs/numerics.md).
package kvcache
