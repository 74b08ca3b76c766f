// Package num implements the number formats of DeepSeek-V4 checkpoints and of the
// reference kernels' quantisation simulations (spec §3.2, §3.3, §8, §9): bf16, IEEE
// half, FP8 e4m3fn, E8M0 scale bytes, FP4 e2m1 (two codes per byte), the FP8/FP4
// activation block quantisers, weight dequantisers (FP8 128x128 blocks, MXFP4,
// NVFP4) and the Walsh-Hadamard rotation.
//
// Every conversion is exact to the bit: roundings are round-to-nearest-even unless
// stated otherwise, and float32 arithmetic is used wherever the reference computes
// in fp32. Functions that take a destination slice panic (like copy would index
// out of range) when the destination is too short; that is a programming error,
// not bad input. Data-dependent conditions (NaN, Inf, zero blocks) never panic.
package num
