// Sinkhorn of backend/cpu sinkhorn on one whole warp, one matrix element a
// lane (the latency-bound core of hc pre at decode). Every step is the CPU's
// fp32 operation in the CPU's order: row and column sums are sequential adds
// of values gathered by shuffles, and each element is divided by its row's
// or column's sum with the IEEE division __fdiv_rn (the CPU's float32 a/s).
// One division a lane a pass and no shared memory or warp barrier between
// passes: the chain of a pass is 4 shuffles, N adds and one division.
#pragma once
#include "common.cuh"

// Go's max(a, b) for the Sinkhorn row max: NaN propagates.
DEV float gomax(float a, float b) { return (b > a || b != b || a != a) ? (a != a ? a : b) : a; }

// Element layout of the N×N row-major matrix over a warp: lane l holds
// elements e0 + 32t (t < E), e0 = l mod N·N (lanes past N·N hold copies of the
// first ones, so every shuffle source is a lane that holds its own element).
// N divides 32, so a lane's elements share one column, and the row of element
// e0 + 32t starts at element rb + 32t: slot t of lanes rb..rb+N-1.
template <int N>
struct SkLayout {
	static constexpr int NN = N * N, E = (NN + 31) / 32;
	static_assert(32 % N == 0, "N must divide 32");
	int e0, rb, cl;
	__device__ __forceinline__ SkLayout(int lane) : e0(lane % (NN < 32 ? NN : 32)), rb(e0 / N * N), cl(e0 % N) {}
};

// Sum of v over the N elements of slot t's row (sequential, from the first):
// 0 + a is a for every a but -0 (then the sum differs only in the sign of a
// zero that divides zeros: NaN either way), so the chain starts at a.
template <int N>
DEV float sk_row_sum(float v, int rb) {
	float g[N];
#pragma unroll
	for (int i = 0; i < N; i++) g[i] = __shfl_sync(0xffffffffu, v, rb + i);
	float s = g[0];
#pragma unroll
	for (int i = 1; i < N; i++) s = __fadd_rn(s, g[i]);
	return s;
}

// Sum of the lane's column: element i·N + cl is slot i·N/32 of lane i·N%32 + cl.
template <int N, int E>
DEV float sk_col_sum(const float (&v)[E], int cl) {
	float g[N];
#pragma unroll
	for (int i = 0; i < N; i++) g[i] = __shfl_sync(0xffffffffu, v[i * N / 32], (i * N) % 32 + cl);
	float s = g[0];
#pragma unroll
	for (int i = 1; i < N; i++) s = __fadd_rn(s, g[i]);
	return s;
}

// c (slots of the layout, all 32 lanes) made doubly stochastic in place:
// row softmax + eps, then iters rounds of (row pass except in the first) and
// column pass, each dividing by sum + eps.
template <int N>
DEV void sinkhorn_lanes(float (&c)[SkLayout<N>::E], int iters, float eps, int lane) {
	constexpr int E = SkLayout<N>::E;
	const SkLayout<N> L(lane);
#pragma unroll
	for (int t = 0; t < E; t++) {
		float g[N];
#pragma unroll
		for (int i = 0; i < N; i++) g[i] = __shfl_sync(0xffffffffu, c[t], L.rb + i);
		float mx = g[0];
#pragma unroll
		for (int i = 1; i < N; i++) mx = gomax(mx, g[i]);
		c[t] = (float)exp((double)__fsub_rn(c[t], mx)); // never -0: the sum may start at its first term
	}
#pragma unroll
	for (int t = 0; t < E; t++) c[t] = __fadd_rn(__fdiv_rn(c[t], sk_row_sum<N>(c[t], L.rb)), eps);
	for (int it = 0; it < iters; it++) {
		if (it > 0) {
#pragma unroll
			for (int t = 0; t < E; t++) c[t] = __fdiv_rn(c[t], __fadd_rn(sk_row_sum<N>(c[t], L.rb), eps));
		}
		const float s = __fadd_rn(sk_col_sum<N, E>(c, L.cl), eps);
#pragma unroll
		for (int t = 0; t < E; t++) c[t] = __fdiv_rn(c[t], s);
	}
}
