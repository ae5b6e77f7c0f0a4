// Copyright (c) kcla_mm contributors. Licensed under the Apache License 2.0.
//
// The CPU kernels of KCLALayer's 'compiled' implementation
// (kcla_mm/models/layers/kcla/compiled.py): the block-sized part of one
// layer, forward and backward, one (sample, channel) plane at a time so that
// each plane's state, depthwise conv and norm stay in cache.
//
// Per plane (n, c) of head h, with w = w[n, h], s = gate / (Z + eps) [n, h]:
//   U^t = U^{t-1} + w X^t                           (the new state)
//   v   = DWConv3x3(U^t; s k_c)                     (the conv is linear and
//                                                    per channel: s scales
//                                                    its kernel)
//   y   = gamma_c (v - mean_c) / sqrt(var_c + eps) + beta_c
//                                                   (BN with the batch's or
//                                                    the running statistics)
//   out = X^t + m_n b_c ReLU(y)                     (m: drop path, b: the
//                                                    optional branch scale)
// The pure-PyTorch layer (kcla/layer.py, forward_reference) is the oracle
// these are tested against (tests/test_kcla_compiled.py).
//
// Threads: every at::parallel_for splits whole planes, or whole channels
// where a training norm needs a channel's N planes together (setup.py
// builds with -fopenmp, against torch's OpenMP runtime), and a plane's sums
// run in one thread in a fixed order (kBlock blocks; no alignment peeling,
// which would make them depend on a scratch buffer's address). What spans
// planes is summed in a fixed order too: a channel's batch statistics by
// the thread that owns the channel, in sample order; the parameters'
// gradients after the parallel loop, serially, in plane order. Results are
// bit for bit the same for any thread count (tests/test_kcla_threads.py).
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

// One copy of each hot loop for x86-64-v3 (AVX2, FMA) machines and one for any x86-64,
// chosen when the library loads: the extension is built from source by
// setup, but a wheel built with -march=native would not run elsewhere.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KCLA_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KCLA_CLONES
#endif

namespace {

using at::Tensor;

// Sums over a plane run in float vectors over blocks of this many values,
// each block's sum added in double: vector speed, and a rounding error that
// does not grow with the plane (a detection plane holds ~10^5 values).
constexpr int64_t kBlock = 1024;

// out[i, j] = sum_{a, b} k[3a + b] in[i + a - 1, j + b - 1], zero padded,
// for output rows [i0, i1): row by row, for tiny planes and border rows.
template <typename T>
void conv3x3_rows(const T* in, T* out, const T* k, int64_t H, int64_t W,
                  int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t j = 0; j < W; ++j) {
      T sum = 0;
      for (int64_t a = 0; a < 3; ++a) {
        const int64_t r = i + a - 1;
        if (r < 0 || r >= H) continue;
        for (int64_t b = 0; b < 3; ++b) {
          const int64_t col = j + b - 1;
          if (col >= 0 && col < W) sum += k[3 * a + b] * in[r * W + col];
        }
      }
      out[i * W + j] = sum;
    }
  }
}

// One edge row of the conv: out[j] = sum_b (ka[b] ra[j + b - 1] +
// kb[b] rb[j + b - 1]), the two input rows next to it (the third is
// outside the plane), zero padded at both ends. W >= 2.
template <typename T>
KCLA_CLONES void conv3x3_edge_row(const T* __restrict ra,
                                  const T* __restrict rb, T* __restrict out,
                                  const T* ka, const T* kb, int64_t W) {
  const T a0 = ka[0], a1 = ka[1], a2 = ka[2], b0 = kb[0], b1 = kb[1],
          b2 = kb[2];
#pragma omp simd
  for (int64_t j = 1; j < W - 1; ++j)
    out[j] = a0 * ra[j - 1] + a1 * ra[j] + a2 * ra[j + 1] + b0 * rb[j - 1] +
             b1 * rb[j] + b2 * rb[j + 1];
  out[0] = a1 * ra[0] + a2 * ra[1] + b1 * rb[0] + b2 * rb[1];
  out[W - 1] = a0 * ra[W - 2] + a1 * ra[W - 1] + b0 * rb[W - 2] +
               b1 * rb[W - 1];
}

// The 3x3 depthwise conv of one plane (as conv3x3_rows for all rows). Rows
// 1 .. H-2 run as one flat loop, so that the vectors span whole rows
// instead of restarting every W (56 or fewer) values; its first and last
// columns pick up taps wrapped from the neighbouring rows and are
// recomputed after it. The first and last rows have vector loops of their
// own: done tap by tap with bounds checks they took as long as all the
// other rows of a 14x14 plane.
template <typename T>
KCLA_CLONES void conv3x3(const T* __restrict in, T* __restrict out,
                         const T* __restrict k, int64_t H, int64_t W) {
  if (H < 3 || W < 3) {
    conv3x3_rows(in, out, k, H, W, 0, H);
    return;
  }
  const T k0 = k[0], k1 = k[1], k2 = k[2], k3 = k[3], k4 = k[4], k5 = k[5],
          k6 = k[6], k7 = k[7], k8 = k[8];
  const int64_t end = H * W - W - 1;
#pragma omp simd
  for (int64_t p = W + 1; p < end; ++p)
    out[p] = k0 * in[p - W - 1] + k1 * in[p - W] + k2 * in[p - W + 1] +
             k3 * in[p - 1] + k4 * in[p] + k5 * in[p + 1] +
             k6 * in[p + W - 1] + k7 * in[p + W] + k8 * in[p + W + 1];
  for (int64_t i = 1; i < H - 1; ++i) {
    const T* r0 = in + (i - 1) * W;
    const T* r1 = r0 + W;
    const T* r2 = r1 + W;
    out[i * W] = k1 * r0[0] + k2 * r0[1] + k4 * r1[0] + k5 * r1[1] +
                 k7 * r2[0] + k8 * r2[1];
    out[i * W + W - 1] = k0 * r0[W - 2] + k1 * r0[W - 1] + k3 * r1[W - 2] +
                         k4 * r1[W - 1] + k6 * r2[W - 2] + k7 * r2[W - 1];
  }
  conv3x3_edge_row(in, in + W, out, k + 3, k + 6, W);
  conv3x3_edge_row(in + (H - 2) * W, in + (H - 1) * W, out + (H - 1) * W, k,
                   k + 3, W);
}

// sum_p p[p] over n values.
template <typename T>
KCLA_CLONES double flat_sum(const T* __restrict p, int64_t n) {
  double total = 0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = b0; i < b1; ++i) sum += p[i];
    total += sum;
  }
  return total;
}

// sum_p (p[p] - mean)^2 over n values.
template <typename T>
KCLA_CLONES double centered_square(const T* __restrict p, T mean,
                                   int64_t n) {
  double total = 0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = b0; i < b1; ++i) {
      const T d = p[i] - mean;
      sum += d * d;
    }
    total += sum;
  }
  return total;
}

// gk[t] += g[i, j] in[i + a - 1, j + b - 1] (t = 3a + b) for the taps of
// position (i, j) that lie inside the plane.
template <typename T>
void add_exact_taps(const T* g, const T* in, double* gk, int64_t H, int64_t W,
                    int64_t i, int64_t j) {
  for (int64_t a = 0; a < 3; ++a) {
    const int64_t r = i + a - 1;
    if (r < 0 || r >= H) continue;
    for (int64_t b = 0; b < 3; ++b) {
      const int64_t col = j + b - 1;
      if (col >= 0 && col < W)
        gk[3 * a + b] += double(g[i * W + j]) * in[r * W + col];
    }
  }
}

// gk[3 ra + b] += sum_j g[j] in_a[j + b - 1] and gk[3 rb + b] +=
// sum_j g[j] in_b[j + b - 1] (valid taps only) for one edge row g whose
// neighbours in the other direction are outside the plane. W >= 2.
template <typename T>
KCLA_CLONES void kernel_grad_edge_row(const T* __restrict g,
                                      const T* __restrict in_a,
                                      const T* __restrict in_b, double* gk,
                                      int64_t ra, int64_t rb, int64_t W) {
  double a[3] = {0, 0, 0}, b[3] = {0, 0, 0};
  for (int64_t b0 = 1; b0 < W - 1; b0 += kBlock) {
    const int64_t b1 = std::min(W - 1, b0 + kBlock);
    T s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3, s4, s5)
    for (int64_t j = b0; j < b1; ++j) {
      const T gj = g[j];
      s0 += gj * in_a[j - 1];
      s1 += gj * in_a[j];
      s2 += gj * in_a[j + 1];
      s3 += gj * in_b[j - 1];
      s4 += gj * in_b[j];
      s5 += gj * in_b[j + 1];
    }
    a[0] += s0;
    a[1] += s1;
    a[2] += s2;
    b[0] += s3;
    b[1] += s4;
    b[2] += s5;
  }
  const double first = g[0], last = g[W - 1];
  a[1] += first * in_a[0] + last * in_a[W - 1];
  a[2] += first * in_a[1];
  a[0] += last * in_a[W - 2];
  b[1] += first * in_b[0] + last * in_b[W - 1];
  b[2] += first * in_b[1];
  b[0] += last * in_b[W - 2];
  for (int t = 0; t < 3; ++t) {
    gk[3 * ra + t] += a[t];
    gk[3 * rb + t] += b[t];
  }
}

// gk[3a + b] += sum_{i, j} g[i, j] in[i + a - 1, j + b - 1] (valid taps
// only): the kernel gradient of conv3x3, in one flat pass over rows
// 1 .. H-2 with nine vector accumulators, then the border: the taps that
// the flat pass wrapped across rows at columns 0 and W-1 taken off (and
// the two positions at its ends added), and rows 0 and H-1 in vector loops
// of their own.
template <typename T>
KCLA_CLONES void conv3x3_kernel_grad(const T* __restrict g,
                                     const T* __restrict in, double* gk,
                                     int64_t H, int64_t W) {
  if (H < 3 || W < 3) {
    for (int64_t i = 0; i < H; ++i)
      for (int64_t j = 0; j < W; ++j) add_exact_taps(g, in, gk, H, W, i, j);
    return;
  }
  const int64_t begin = W + 1, end = H * W - W - 1;
  for (int64_t b0 = begin; b0 < end; b0 += kBlock) {
    const int64_t b1 = std::min(end, b0 + kBlock);
    T s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0, s8 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3, s4, s5, s6, s7, s8)
    for (int64_t p = b0; p < b1; ++p) {
      const T gp = g[p];
      s0 += gp * in[p - W - 1];
      s1 += gp * in[p - W];
      s2 += gp * in[p - W + 1];
      s3 += gp * in[p - 1];
      s4 += gp * in[p];
      s5 += gp * in[p + 1];
      s6 += gp * in[p + W - 1];
      s7 += gp * in[p + W];
      s8 += gp * in[p + W + 1];
    }
    gk[0] += s0;
    gk[1] += s1;
    gk[2] += s2;
    gk[3] += s3;
    gk[4] += s4;
    gk[5] += s5;
    gk[6] += s6;
    gk[7] += s7;
    gk[8] += s8;
  }
  // Column 0 of rows 2 .. H-2 got its left taps (b = 0) from the end of
  // the row above; column W-1 of rows 1 .. H-3 its right taps (b = 2) from
  // the start of the row below. The flat range misses (1, 0) and
  // (H-2, W-1), whose valid taps are added.
  for (int64_t i = 1; i < H - 1; ++i) {
    const int64_t left = i * W, right = i * W + W - 1;
    if (left >= begin) {
      const double gl = g[left];
      for (int64_t a = 0; a < 3; ++a)
        gk[3 * a] -= gl * in[left + (a - 1) * W - 1];
    } else {
      add_exact_taps(g, in, gk, H, W, i, 0);
    }
    if (right < end) {
      const double gr = g[right];
      for (int64_t a = 0; a < 3; ++a)
        gk[3 * a + 2] -= gr * in[right + (a - 1) * W + 1];
    } else {
      add_exact_taps(g, in, gk, H, W, i, W - 1);
    }
  }
  kernel_grad_edge_row(g, in, in + W, gk, 1, 2, W);
  kernel_grad_edge_row(g + (H - 1) * W, in + (H - 2) * W, in + (H - 1) * W,
                       gk, 0, 1, W);
}

// out = (prev ? prev : 0) + w x. out may be prev (in-place update).
template <typename T>
KCLA_CLONES void state_update(T* out, const T* prev, const T* __restrict x,
                              T w, int64_t n) {
  if (prev == nullptr) {
    for (int64_t p = 0; p < n; ++p) out[p] = w * x[p];
  } else {
    for (int64_t p = 0; p < n; ++p) out[p] = prev[p] + w * x[p];
  }
}

// out = x + mb ReLU(a (v - mean) + beta). out may be x (in-place add).
// The norm is applied as PyTorch's BN applies it, centring first: the raw
// state grows with every layer's e^(||K|| / tau), and a folded
// a v + (beta - a mean) would cancel two large numbers in fp32.
template <typename T>
KCLA_CLONES void relu_residual(T* out, const T* x, const T* __restrict v,
                               T mean, T a, T beta, T mb, int64_t n) {
  for (int64_t p = 0; p < n; ++p) {
    const T y = a * (v[p] - mean) + beta;
    out[p] = x[p] + mb * std::max(y, T(0));
  }
}

// out[p] = max(value(p), 0) for p < n; returns sum out, in float vectors
// over kBlock blocks added in double (as flat_sum). Inlined into each
// caller's clone, so that it is vectorised for that clone's target.
template <typename T, typename Value>
__attribute__((always_inline)) inline double relu_sum(T* out, int64_t n,
                                                      Value value) {
  double total = 0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t p = b0; p < b1; ++p) {
      const T y = std::max(value(p), T(0));
      out[p] = y;
      sum += y;
    }
    total += sum;
  }
  return total;
}

// out = max(a (pre - mean) + beta + identity, 0); returns sum out. out may
// be pre (each value is read before the same index is written).
template <typename T>
KCLA_CLONES double relu_add_norm(T* out, const T* pre,
                                 const T* __restrict identity, T mean, T a,
                                 T beta, int64_t n) {
  return relu_sum<T>(out, n, [=](int64_t p) {
    return a * (pre[p] - mean) + beta + identity[p];
  });
}

// out = max(pre + identity, 0); returns sum out. out may be pre.
template <typename T>
KCLA_CLONES double add_relu_sum(T* out, const T* pre,
                                const T* __restrict identity, int64_t n) {
  return relu_sum<T>(out, n, [=](int64_t p) { return pre[p] + identity[p]; });
}

// Backward through x = ReLU(pre) and the plane mean of x, given dL/dx and
// dL/dmean: out = x <= 0 ? 0 : dL/dx + dL/dmean / n, exactly as
// threshold_backward (a NaN x passes its gradient, an inf gradient where
// x <= 0 gives 0). out may be grad_x.
template <typename T>
KCLA_CLONES void relu_mean_backward(T* out, const T* grad_x,
                                    const T* __restrict x, T grad_mean,
                                    int64_t n) {
  // The select as an integer mask on the bits: GCC keeps a float select
  // on a loaded value scalar, with a branch per value (ten times slower),
  // unless FP traps are off; a 0/1 factor would turn 0 * inf into NaN.
  using Bits = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
#pragma omp simd
  for (int64_t p = 0; p < n; ++p) {
    const T g = grad_x[p] + grad_mean;
    Bits bits;
    std::memcpy(&bits, &g, sizeof(T));
    bits &= -static_cast<Bits>(!(x[p] <= T(0)));
    std::memcpy(out + p, &bits, sizeof(T));
  }
}

// Backward through out = x + m b ReLU(y), y = a (v - mean) + beta, given
// dL/dout: writes dL/dy and returns in sums (sum dL/dy, sum dL/dy vhat,
// sum dL/d(b ReLU) ReLU), vhat = (v - mean) invstd.
template <typename T>
KCLA_CLONES void relu_backward(const T* __restrict v,
                               const T* __restrict grad_out,
                               T* __restrict grad_y, T mean, T a, T beta,
                               T invstd, T m, T bs, int64_t n,
                               double* __restrict sums) {
  // Local totals and a 0/1 factor instead of branches: GCC vectorises the
  // loop only in this form.
  double t0 = 0, t1 = 0, t2 = 0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    T s0 = 0, s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s0, s1, s2)
    for (int64_t p = b0; p < b1; ++p) {
      const T centred = v[p] - mean;
      const T y = a * centred + beta;
      const T on = y > T(0) ? T(1) : T(0);
      const T gr = m * grad_out[p];
      const T gy = gr * bs * on;
      grad_y[p] = gy;
      s0 += gy;
      s1 += gy * centred;
      s2 += gr * std::max(y, T(0));
    }
    t0 += s0;
    t1 += double(s1) * invstd;
    t2 += s2;
  }
  sums[0] = t0;
  sums[1] = t1;
  sums[2] = t2;
}

// The norm's backward: dL/dv = a (dL/dy - mean_gy - vhat mean_gy_vhat)
// (both means 0 for running statistics), vhat = (v - mean) invstd.
template <typename T>
KCLA_CLONES void norm_backward(const T* __restrict grad_y,
                               const T* __restrict v, T* __restrict grad_v,
                               T mean, T a, T invstd, T mean_gy,
                               T mean_gy_vhat, int64_t n) {
  for (int64_t p = 0; p < n; ++p)
    grad_v[p] =
        a * (grad_y[p] - mean_gy - (v[p] - mean) * invstd * mean_gy_vhat);
}

// dL/dU^{t-1} = dL/dU^t (from the next layer) + dL/dU^t (from the conv);
// dL/dx = dL/dout + w dL/dU^{t-1}; returns dL/dw = sum dL/dU^{t-1} x.
// grad_u_prev may be grad_u_next and grad_x grad_out (no __restrict on
// them): each value is read before the same index is written.
template <typename T>
KCLA_CLONES double state_backward(const T* grad_u_next,
                                  const T* __restrict grad_u_conv,
                                  const T* grad_out,
                                  const T* __restrict x,
                                  T* grad_u_prev,
                                  T* grad_x, T w, int64_t n) {
  double total = 0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t p = b0; p < b1; ++p) {
      const T gu = grad_u_next[p] + grad_u_conv[p];
      grad_u_prev[p] = gu;
      grad_x[p] = grad_out[p] + w * gu;
      sum += gu * x[p];
    }
    total += sum;
  }
  return total;
}

// count scratch planes of hw values for one thread, each starting on a
// 64-byte boundary: planes of 14 x 14 or 7 x 7 values packed end to end
// would leave most of them misaligned, which made the vector loops over
// them slower than recomputing the planes.
template <typename T>
class ScratchPlanes {
 public:
  ScratchPlanes(int64_t count, int64_t hw)
      : stride_((hw * int64_t(sizeof(T)) + 63) / 64 * 64 / int64_t(sizeof(T))),
        buffer_(count * stride_ + 64 / sizeof(T)) {
    const auto address = reinterpret_cast<std::uintptr_t>(buffer_.data());
    base_ = buffer_.data() + (64 - address % 64) % 64 / sizeof(T);
  }
  T* operator[](int64_t i) { return base_ + i * stride_; }

 private:
  int64_t stride_;
  std::vector<T> buffer_;
  T* base_;
};

// How many channels a thread takes at a time where a training norm needs a
// channel's N planes together: as many as keep their scratch planes
// (plane_bytes each, N per channel) within about 256 KiB, so that small
// planes (7 x 7 at stage 4) are visited sample by sample in memory order
// rather than one isolated plane per sample and channel, but at most a
// quarter of each thread's share of the channels.
int64_t channel_block(int64_t C, int64_t N, int64_t plane_bytes) {
  const int64_t fits = std::max<int64_t>(1, (256 << 10) / (N * plane_bytes));
  const int64_t share =
      std::max<int64_t>(1, C / (4 * int64_t(at::get_num_threads())));
  return std::min(fits, share);
}

// The norm of channel c: y = a (v - mean) + beta, a = gamma invstd.
struct ChannelNorm {
  double mean, a, beta, invstd;
};

ChannelNorm channel_norm(double mean, double var, double eps, double gamma,
                         double beta) {
  const double invstd = 1.0 / std::sqrt(var + eps);
  return {mean, gamma * invstd, beta, invstd};
}

struct Geometry {
  int64_t N, C, H, W, heads, head_dim;
};

Geometry geometry(const Tensor& x, const Tensor& w) {
  TORCH_CHECK(x.dim() == 4, "kcla compiled branch: x must be (N, C, H, W)");
  const int64_t heads = w.size(1);
  TORCH_CHECK(x.size(1) % heads == 0,
              "kcla compiled branch: heads must divide C");
  return {x.size(0), x.size(1), x.size(2), x.size(3), heads,
          x.size(1) / heads};
}

template <typename T>
const T* optional_ptr(const c10::optional<Tensor>& t) {
  return t.has_value() && t->defined() ? t->data_ptr<T>() : nullptr;
}

// channel_norm of channel c with an optional affine (gamma, beta).
template <typename T>
ChannelNorm affine_norm(const T* gamma, const T* beta, int64_t c, double mean,
                        double var, double eps) {
  return channel_norm(mean, var, eps, gamma ? gamma[c] : 1.0,
                      beta ? beta[c] : 0.0);
}

// The inputs that branch_forward and branch_backward share, and what they
// derive per plane nc = n C + c (head h): the state update, the kernel
// scaled by the plane's scale, the norm and the drop-path factor.
template <typename T>
struct BranchInputs {
  Geometry g;
  const T *x, *u_prev, *w, *scale, *kernel, *gamma, *beta, *branch_scale,
      *mask;

  BranchInputs(const Geometry& geom, const Tensor& x_,
               const c10::optional<Tensor>& u_prev_, const Tensor& w_,
               const Tensor& scale_, const Tensor& kernel_,
               const c10::optional<Tensor>& gamma_,
               const c10::optional<Tensor>& beta_,
               const c10::optional<Tensor>& branch_scale_,
               const c10::optional<Tensor>& mask_)
      : g(geom),
        x(x_.data_ptr<T>()),
        u_prev(optional_ptr<T>(u_prev_)),
        w(w_.data_ptr<T>()),
        scale(scale_.data_ptr<T>()),
        kernel(kernel_.data_ptr<T>()),
        gamma(optional_ptr<T>(gamma_)),
        beta(optional_ptr<T>(beta_)),
        branch_scale(optional_ptr<T>(branch_scale_)),
        mask(optional_ptr<T>(mask_)) {}

  int64_t sample(int64_t nc) const { return nc / g.C; }
  int64_t channel(int64_t nc) const { return nc % g.C; }
  // Index of the plane's (sample, head) in w and scale.
  int64_t head_index(int64_t nc) const {
    return sample(nc) * g.heads + channel(nc) / g.head_dim;
  }
  // U^t of the plane into out (which may be U^{t-1}'s plane).
  void update_state(T* out, int64_t nc) const {
    const int64_t HW = g.H * g.W;
    state_update<T>(out, u_prev ? u_prev + nc * HW : nullptr, x + nc * HW,
                    w[head_index(nc)], HW);
  }
  // k = scale * the plane's channel kernel.
  void scaled_kernel(int64_t nc, T* k) const {
    const T s = scale[head_index(nc)];
    const T* kc = kernel + channel(nc) * 9;
    for (int t = 0; t < 9; ++t) k[t] = s * kc[t];
  }
  T drop_factor(int64_t nc) const { return mask ? mask[sample(nc)] : T(1); }
  // v = DWConv(u; scale k) of plane nc from its state u, where its branch
  // counts (finish_plane only copies X^t where it does not).
  void branch_conv(const T* u, T* v, int64_t nc) const {
    if (drop_factor(nc) * branch_factor(nc) != T(0)) {
      T k[9];
      scaled_kernel(nc, k);
      conv3x3<T>(u, v, k, g.H, g.W);
    }
  }
  T branch_factor(int64_t nc) const {
    return branch_scale ? branch_scale[channel(nc)] : T(1);
  }
  ChannelNorm norm(int64_t c, double mean, double var, double eps) const {
    return affine_norm(gamma, beta, c, mean, var, eps);
  }
  // The norm folded into the kernel, ReLU, drop path and the residual add
  // of plane nc into out, from its conv output v and the statistics the
  // norm applies (mean, var of its channel); out may be x (inplace).
  void finish_plane(T* out, int64_t nc, const T* v, T mean, T var, double eps,
                    bool inplace) const {
    const int64_t HW = g.H * g.W, c = channel(nc);
    const T mb = drop_factor(nc) * branch_factor(nc);
    if (mb == T(0)) {
      // A dropped sample (or a branch scale of 0): out = X^t.
      if (!inplace) std::copy(x + nc * HW, x + (nc + 1) * HW, out + nc * HW);
      return;
    }
    const ChannelNorm cn = norm(c, mean, var, eps);
    relu_residual<T>(out + nc * HW, x + nc * HW, v, mean, T(cn.a), T(cn.beta),
                     mb, HW);
  }
};

// Forward. Returns (out, U^t, mean, var); mean and var are the statistics
// the norm applied (the batch's, biased, when batch_stats; else the given
// running ones), in x's dtype. inplace writes out over x, state_inplace
// U^t over U^{t-1}.
std::vector<Tensor> branch_forward(
    const Tensor& x, const c10::optional<Tensor>& u_prev, const Tensor& w,
    const Tensor& scale, const Tensor& kernel,
    const c10::optional<Tensor>& gamma, const c10::optional<Tensor>& beta,
    const c10::optional<Tensor>& running_mean,
    const c10::optional<Tensor>& running_var, bool batch_stats, double eps,
    const c10::optional<Tensor>& branch_scale,
    const c10::optional<Tensor>& mask, bool inplace, bool state_inplace) {
  const Geometry g = geometry(x, w);
  const int64_t HW = g.H * g.W, planes = g.N * g.C;
  Tensor out = inplace ? x : at::empty_like(x);
  Tensor u_new =
      (state_inplace && u_prev.has_value()) ? *u_prev : at::empty_like(x);
  Tensor mean = at::empty({g.C}, x.options());
  Tensor var = at::empty({g.C}, x.options());

  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kcla_branch_forward", [&] {
    using T = scalar_t;
    const BranchInputs<T> in(g, x, u_prev, w, scale, kernel, gamma, beta,
                             branch_scale, mask);
    T* op = out.data_ptr<T>();
    T* unp = u_new.data_ptr<T>();
    T* meanp = mean.data_ptr<T>();
    T* varp = var.data_ptr<T>();

    auto finish_plane = [&](int64_t nc, const T* v) {
      const int64_t c = in.channel(nc);
      in.finish_plane(op, nc, v, meanp[c], varp[c], eps, inplace);
    };

    if (batch_stats) {
      // A block of channels at a time (channel_block), their N planes'
      // conv outputs in scratch planes: the state update and the conv of
      // pass 1 give the batch statistics (Chan's parallel combination over
      // the batch, in sample order), and pass 2 reads the outputs back
      // from cache instead of recomputing them.
      const int64_t block = channel_block(g.C, g.N, HW * sizeof(T));
      const int64_t blocks = (g.C + block - 1) / block;
      at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
        ScratchPlanes<T> v(block * g.N, HW);
        std::vector<double> plane_mean(block * g.N), plane_m2(block * g.N);
        for (int64_t b = begin; b < end; ++b) {
          const int64_t c0 = b * block, c1 = std::min(g.C, c0 + block);
          // Scratch plane i = (c - c0) N + n.
          for (int64_t n = 0; n < g.N; ++n) {
            for (int64_t c = c0; c < c1; ++c) {
              const int64_t nc = n * g.C + c, i = (c - c0) * g.N + n;
              T* un = unp + nc * HW;
              in.update_state(un, nc);
              T k[9];
              in.scaled_kernel(nc, k);
              conv3x3<T>(un, v[i], k, g.H, g.W);
              const double m = flat_sum<T>(v[i], HW) / HW;
              plane_mean[i] = m;
              plane_m2[i] = centered_square<T>(v[i], T(m), HW);
            }
          }
          for (int64_t c = c0; c < c1; ++c) {
            const double* pm = plane_mean.data() + (c - c0) * g.N;
            const double* pm2 = plane_m2.data() + (c - c0) * g.N;
            double m = 0;
            for (int64_t n = 0; n < g.N; ++n) m += pm[n];
            m /= g.N;
            double m2 = 0;
            for (int64_t n = 0; n < g.N; ++n) {
              const double d = pm[n] - m;
              m2 += pm2[n] + HW * d * d;
            }
            meanp[c] = T(m);
            varp[c] = T(m2 / (g.N * HW));
          }
          for (int64_t n = 0; n < g.N; ++n)
            for (int64_t c = c0; c < c1; ++c)
              finish_plane(n * g.C + c, v[(c - c0) * g.N + n]);
        }
      });
    } else {
      const T* rmp = running_mean->data_ptr<T>();
      const T* rvp = running_var->data_ptr<T>();
      for (int64_t c = 0; c < g.C; ++c) {
        meanp[c] = rmp[c];
        varp[c] = rvp[c];
      }
      // One pass: the state update, the conv and the rest per plane.
      at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
        std::vector<T> v(HW);
        for (int64_t nc = begin; nc < end; ++nc) {
          T* un = unp + nc * HW;
          in.update_state(un, nc);
          in.branch_conv(un, v.data(), nc);
          finish_plane(nc, v.data());
        }
      });
    }
  });
  return {out, u_new, mean, var};
}

// branch_forward's out from U^t itself (not U^{t-1}) and the statistics
// it returned: the same conv and finish of each plane, bit for bit, without
// the state update or the batch statistics. For the next block's convs,
// which recompute their input in backward instead of keeping it.
Tensor branch_output(const Tensor& x, const Tensor& u, const Tensor& w,
                     const Tensor& scale, const Tensor& kernel,
                     const c10::optional<Tensor>& gamma,
                     const c10::optional<Tensor>& beta, const Tensor& mean,
                     const Tensor& var, double eps,
                     const c10::optional<Tensor>& branch_scale,
                     const c10::optional<Tensor>& mask) {
  const Geometry g = geometry(x, w);
  TORCH_CHECK(u.sizes() == x.sizes() && u.is_contiguous() &&
                  u.scalar_type() == x.scalar_type(),
              "kcla branch_output: U^t must be a contiguous tensor like x");
  const int64_t HW = g.H * g.W, planes = g.N * g.C;
  Tensor out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kcla_branch_output", [&] {
    using T = scalar_t;
    const BranchInputs<T> in(g, x, c10::nullopt, w, scale, kernel, gamma,
                             beta, branch_scale, mask);
    const T* up = u.data_ptr<T>();
    const T* meanp = mean.data_ptr<T>();
    const T* varp = var.data_ptr<T>();
    T* op = out.data_ptr<T>();
    at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> v(HW);
      for (int64_t nc = begin; nc < end; ++nc) {
        in.branch_conv(up + nc * HW, v.data(), nc);
        const int64_t c = in.channel(nc);
        in.finish_plane(op, nc, v.data(), meanp[c], varp[c], eps, false);
      }
    });
  });
  return out;
}

// What holds t, for kcla_mm's gradient reuse
// (kcla_mm/models/layers/kcla/gradient_reuse.py): references to its
// TensorImpl and to its StorageImpl, this call's own among them; -1 where t
// is not a contiguous tensor that spans the whole of a storage torch's
// allocator owns (a view, an offset, memory of numpy, DLPack or from_blob),
// which is never written over. Counted here rather than through Python's
// untyped_storage(), which on torch >= 2.2 ties a Python object to the
// storage that a caller keeping it would then share unseen.
std::vector<int64_t> holders(const Tensor& t) {
  if (!t.defined() || t.layout() != at::kStrided || t.is_view() ||
      !t.is_contiguous() || t.storage_offset() != 0)
    return {-1, -1};
  const c10::Storage& storage = t.storage();
  if (!storage.resizable() ||
      storage.nbytes() != size_t(t.numel()) * t.element_size())
    return {-1, -1};
  return {int64_t(t.use_count()), int64_t(storage.use_count())};
}

// A gradient into out where given (x's shape, dtype, contiguous), else into
// a new tensor.
Tensor gradient_buffer(const c10::optional<Tensor>& out, const Tensor& x,
                       const char* name) {
  if (!out.has_value()) return at::empty_like(x);
  TORCH_CHECK(out->sizes() == x.sizes() && out->scalar_type() ==
                  x.scalar_type() && out->is_contiguous(),
              "branch_backward: ", name,
              " must be a contiguous tensor of x's shape and dtype");
  return *out;
}

// Backward of branch_forward given U^{t-1} (recomputing U^t plane by plane)
// and the statistics it returned. Returns the gradients of (x, U^{t-1}, w,
// scale, kernel (C, 3, 3), gamma, beta, branch_scale); x's is only the part
// through these ops (the pooled keys and queries add theirs in autograd).
// x's and U^{t-1}'s go into grad_x_out and grad_u_prev_out where given,
// which may be grad_out and grad_u themselves: a plane of those is read
// before it is written, and nothing else reads it.
std::vector<Tensor> branch_backward(
    const Tensor& grad_out, const Tensor& grad_u, const Tensor& x,
    const c10::optional<Tensor>& u_prev, const Tensor& w, const Tensor& scale,
    const Tensor& kernel, const c10::optional<Tensor>& gamma,
    const c10::optional<Tensor>& beta, const Tensor& mean, const Tensor& var,
    bool batch_stats, double eps, const c10::optional<Tensor>& branch_scale,
    const c10::optional<Tensor>& mask,
    const c10::optional<Tensor>& grad_x_out,
    const c10::optional<Tensor>& grad_u_prev_out) {
  const Geometry g = geometry(x, w);
  const int64_t HW = g.H * g.W, planes = g.N * g.C;
  const double count = double(g.N) * HW;
  Tensor grad_x = gradient_buffer(grad_x_out, x, "grad_x_out");
  Tensor grad_u_prev = gradient_buffer(grad_u_prev_out, x, "grad_u_prev_out");
  // Each may be the incoming gradient it replaces, and nothing else: the
  // kernel reads a plane of grad_out and grad_u before writing the same
  // plane of these, not before writing the other one.
  TORCH_CHECK(!grad_x.is_alias_of(grad_u_prev) &&
                  !grad_x.is_alias_of(grad_u) &&
                  !grad_u_prev.is_alias_of(grad_out),
              "branch_backward: grad_x_out and grad_u_prev_out must not "
              "share memory with each other or with the other incoming "
              "gradient");
  std::vector<double> gk(planes * 9, 0.0), gs(planes), gw(planes);
  std::vector<double> gy_sum(planes), gy_vhat(planes), gbs(planes);
  std::vector<double> ch_gy_sum(g.C), ch_gy_vhat(g.C);

  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kcla_branch_backward", [&] {
    using T = scalar_t;
    const BranchInputs<T> in(g, x, u_prev, w, scale, kernel, gamma, beta,
                             branch_scale, mask);
    const T* gop = grad_out.data_ptr<T>();
    const T* gup = grad_u.data_ptr<T>();
    const T* meanp = mean.data_ptr<T>();
    const T* varp = var.data_ptr<T>();
    T* gxp = grad_x.data_ptr<T>();
    T* gupp = grad_u_prev.data_ptr<T>();

    // Per plane: U^t, v = DWConv(U^t; s k) (the forward's v, bit for bit,
    // so the ReLU mask is the forward's) and dL/dy into u, v and gy, and
    // the plane sums the norm's and branch scale's gradients need.
    auto recompute = [&](int64_t nc, T* u, T* v, T* gy, T* k) {
      const int64_t c = in.channel(nc);
      in.update_state(u, nc);
      in.scaled_kernel(nc, k);
      conv3x3<T>(u, v, k, g.H, g.W);
      const ChannelNorm cn = in.norm(c, meanp[c], varp[c], eps);
      double sums[3];
      relu_backward<T>(v, gop + nc * HW, gy, meanp[c], T(cn.a), T(cn.beta),
                       T(cn.invstd), in.drop_factor(nc), in.branch_factor(nc),
                       HW, sums);
      gy_sum[nc] = sums[0];
      gy_vhat[nc] = sums[1];
      gbs[nc] = sums[2];
    };
    auto channel_sum = [&](int64_t c) {
      double s1 = 0, s2 = 0;
      for (int64_t n = 0; n < g.N; ++n) {
        s1 += gy_sum[n * g.C + c];
        s2 += gy_vhat[n * g.C + c];
      }
      ch_gy_sum[c] = s1;
      ch_gy_vhat[c] = s2;
    };
    // The rest of plane nc's backward from its recomputed u, v, gy and
    // applied kernel k; gv and gu are scratch planes.
    auto plane_backward = [&](int64_t nc, const T* u, const T* v,
                              const T* gy, const T* k, T* gv, T* gu) {
      const int64_t c = in.channel(nc);
      const ChannelNorm cn = in.norm(c, meanp[c], varp[c], eps);
      const T s = in.scale[in.head_index(nc)];
      const T mean_gy = batch_stats ? T(ch_gy_sum[c] / count) : T(0);
      const T mean_gy_vhat = batch_stats ? T(ch_gy_vhat[c] / count) : T(0);
      norm_backward<T>(gy, v, gv, meanp[c], T(cn.a), T(cn.invstd), mean_gy,
                       mean_gy_vhat, HW);
      // The gradient of the applied kernel K = s k gives both
      // dL/dk = s dL/dK and dL/ds = sum_t k_t dL/dK_t.
      double gK[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
      conv3x3_kernel_grad<T>(gv, u, gK, g.H, g.W);
      double gs_plane = 0;
      for (int t = 0; t < 9; ++t) {
        gk[nc * 9 + t] = double(s) * gK[t];
        gs_plane += double(in.kernel[c * 9 + t]) * gK[t];
      }
      T flipped[9];
      for (int t = 0; t < 9; ++t) flipped[t] = k[8 - t];
      conv3x3<T>(gv, gu, flipped, g.H, g.W);
      gs[nc] = gs_plane;
      gw[nc] = state_backward<T>(gup + nc * HW, gu, gop + nc * HW,
                                 in.x + nc * HW, gupp + nc * HW,
                                 gxp + nc * HW, in.w[in.head_index(nc)], HW);
    };

    if (batch_stats) {
      // A training norm's gradient needs the batch's sums of dL/dy and
      // dL/dy vhat before any plane's dL/dv: a block of channels at a time
      // (channel_block), their N planes recomputed into scratch planes,
      // summed, then finished from the scratch while it is in cache.
      const int64_t block = channel_block(g.C, g.N, 3 * HW * sizeof(T));
      const int64_t blocks = (g.C + block - 1) / block;
      at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
        ScratchPlanes<T> u(block * g.N, HW), v(block * g.N, HW),
            gy(block * g.N, HW), grads(2, HW);
        std::vector<T> k(block * g.N * 9);
        for (int64_t b = begin; b < end; ++b) {
          const int64_t c0 = b * block, c1 = std::min(g.C, c0 + block);
          // Scratch plane i = (c - c0) N + n.
          for (int64_t n = 0; n < g.N; ++n)
            for (int64_t c = c0; c < c1; ++c) {
              const int64_t i = (c - c0) * g.N + n;
              recompute(n * g.C + c, u[i], v[i], gy[i], k.data() + i * 9);
            }
          for (int64_t c = c0; c < c1; ++c) channel_sum(c);
          for (int64_t n = 0; n < g.N; ++n)
            for (int64_t c = c0; c < c1; ++c) {
              const int64_t i = (c - c0) * g.N + n;
              plane_backward(n * g.C + c, u[i], v[i], gy[i], k.data() + i * 9,
                             grads[0], grads[1]);
            }
        }
      });
    } else {
      at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
        std::vector<T> u(HW), v(HW), gy(HW), gv(HW), gu(HW);
        T k[9];
        for (int64_t nc = begin; nc < end; ++nc) {
          recompute(nc, u.data(), v.data(), gy.data(), k);
          plane_backward(nc, u.data(), v.data(), gy.data(), k, gv.data(),
                         gu.data());
        }
      });
      for (int64_t c = 0; c < g.C; ++c) channel_sum(c);
    }
  });

  // The per-plane sums reduced to the parameters' shapes (in double, then
  // the parameters' dtype).
  auto options = x.options().dtype(at::kDouble);
  Tensor grad_w = at::zeros({g.N, g.heads}, options);
  Tensor grad_scale = at::zeros({g.N, g.heads}, options);
  Tensor grad_kernel = at::zeros({g.C, 3, 3}, options);
  Tensor grad_gamma = at::empty({g.C}, options);
  Tensor grad_beta = at::empty({g.C}, options);
  Tensor grad_bs = at::zeros({g.C}, options);
  double* gwp = grad_w.data_ptr<double>();
  double* gsp = grad_scale.data_ptr<double>();
  double* gkp = grad_kernel.data_ptr<double>();
  double* ggp = grad_gamma.data_ptr<double>();
  double* gbp = grad_beta.data_ptr<double>();
  double* gbsp = grad_bs.data_ptr<double>();
  for (int64_t nc = 0; nc < planes; ++nc) {
    const int64_t n = nc / g.C, c = nc % g.C, h = c / g.head_dim;
    gwp[n * g.heads + h] += gw[nc];
    gsp[n * g.heads + h] += gs[nc];
    for (int t = 0; t < 9; ++t) gkp[c * 9 + t] += gk[nc * 9 + t];
    gbsp[c] += gbs[nc];
  }
  for (int64_t c = 0; c < g.C; ++c) {
    // The norm's own gradients: dL/dbeta = sum dL/dy, dL/dgamma =
    // sum dL/dy vhat.
    gbp[c] = ch_gy_sum[c];
    ggp[c] = ch_gy_vhat[c];
  }
  auto to_x = [&](const Tensor& t) { return t.to(x.scalar_type()); };
  return {grad_x,          grad_u_prev,      to_x(grad_w),
          to_x(grad_scale), to_x(grad_kernel), to_x(grad_gamma),
          to_x(grad_beta), to_x(grad_bs)};
}

// The ECA-style conv1d over pooled channels v (C values, zero padded) at
// channel c: sum_t kernel[t] v[c + t - (ks - 1) / 2], in double.
template <typename T>
double eca_tap(const T* kernel, int64_t ks, const double* v, int64_t C,
               int64_t c) {
  const int64_t pad = (ks - 1) / 2;
  double total = 0;
  for (int64_t t = 0; t < ks; ++t) {
    const int64_t src = c + t - pad;
    if (src >= 0 && src < C) total += double(kernel[t]) * v[src];
  }
  return total;
}

// A layer weight w = exp(min(||K|| / tau, clamp)).
inline double layer_weight(double key_norm, double tau, double clamp) {
  return std::exp(std::min(key_norm / tau, clamp));
}

// The per-head vectors of one sample from its plane means pn (C values):
// Q and K (ECA conv1d, into q and k), ||K_h||, <Q_h, K_h> and
// ||Q_h|| cos theta = <Q_h, K_h> / ||K_h||, the norm floored at 1e-12 (it
// only guards K = 0, as in the PyTorch layer). pooled_forward computes them
// and pooled_backward recomputes them, with this one arithmetic.
template <typename T>
void pooled_vectors(const T* qw, const T* kw, int64_t ks, const double* pn,
                    int64_t C, int64_t heads, double* q, double* k,
                    double* k_norm, double* qk, double* q_cos) {
  const int64_t head_dim = C / heads;
  for (int64_t h = 0; h < heads; ++h) {
    double dot = 0, kk = 0;
    for (int64_t d = 0; d < head_dim; ++d) {
      const int64_t c = h * head_dim + d;
      q[c] = eca_tap(qw, ks, pn, C, c);
      k[c] = eca_tap(kw, ks, pn, C, c);
      dot += q[c] * k[c];
      kk += k[c] * k[c];
    }
    k_norm[h] = std::sqrt(kk);
    qk[h] = dot;
    q_cos[h] = dot / std::max(k_norm[h], 1e-12);
  }
}

// The gate of head h: sigmoid(Phi(q_cos))_h, Phi = mix (heads, heads).
template <typename T>
double head_gate(const T* mix, const double* q_cos, int64_t heads,
                 int64_t h) {
  double phi = 0;
  for (int64_t j = 0; j < heads; ++j)
    phi += double(mix[h * heads + j]) * q_cos[j];
  return 1.0 / (1.0 + std::exp(-phi));
}

// The pooled-vector work of one layer, where eager PyTorch
// spends more time dispatching a dozen ops on (N, C) vectors than
// computing them: Q and K (ECA conv1d over the pooled channels), the layer
// weight w = exp(min(||K_h|| / tau_h, clamp)), the gate
// sigmoid(Phi(<Q_h, K_h> / ||K_h||)), Z^t = Z^{t-1} + w and
// scale = gate / (Z^t + state_eps). Returns (w, Z^t, scale), (N, heads),
// in x's dtype. No autograd (a train step's node runs pooled_backward
// after it: kcla/compiled.py's CompiledPooled). ``means``,
// where given, are x's plane means (N, C) in float64, as block_tail_forward
// returns them, and x is not read.
std::vector<Tensor> pooled_forward(const Tensor& x, const Tensor& query_weight,
                                   const Tensor& key_weight, const Tensor& tau,
                                   double clamp, const Tensor& head_mix,
                                   const c10::optional<Tensor>& z_prev,
                                   double state_eps,
                                   const c10::optional<Tensor>& means) {
  TORCH_CHECK(x.dim() == 4, "kcla pooled_forward: x must be (N, C, H, W)");
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  const int64_t heads = tau.size(0);
  const int64_t ks = query_weight.numel();
  Tensor w = at::empty({N, heads}, x.options());
  Tensor z = at::empty({N, heads}, x.options());
  Tensor scale = at::empty({N, heads}, x.options());
  std::vector<double> pooled(N * C);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kcla_pooled_forward", [&] {
    using T = scalar_t;
    if (means.has_value() && means->defined()) {
      TORCH_CHECK(means->scalar_type() == at::kDouble &&
                      means->numel() == N * C && means->is_contiguous(),
                  "kcla pooled_forward: means must be (N, C) float64");
      const double* mp = means->data_ptr<double>();
      std::copy(mp, mp + N * C, pooled.begin());
    } else {
      const T* xp = x.data_ptr<T>();
      at::parallel_for(0, N * C, 16, [&](int64_t begin, int64_t end) {
        for (int64_t nc = begin; nc < end; ++nc)
          pooled[nc] = flat_sum<T>(xp + nc * HW, HW) / HW;
      });
    }
    const T* qw = query_weight.data_ptr<T>();
    const T* kw = key_weight.data_ptr<T>();
    const T* taup = tau.data_ptr<T>();
    const T* mix = head_mix.data_ptr<T>();
    const T* zp = optional_ptr<T>(z_prev);
    T* wp = w.data_ptr<T>();
    T* zo = z.data_ptr<T>();
    T* so = scale.data_ptr<T>();
    std::vector<double> q(C), k(C), k_norm(heads), qk(heads), q_cos(heads);
    for (int64_t n = 0; n < N; ++n) {
      pooled_vectors(qw, kw, ks, pooled.data() + n * C, C, heads, q.data(),
                     k.data(), k_norm.data(), qk.data(), q_cos.data());
      for (int64_t h = 0; h < heads; ++h)
        wp[n * heads + h] = T(layer_weight(k_norm[h], taup[h], clamp));
      for (int64_t h = 0; h < heads; ++h) {
        const double gate = head_gate(mix, q_cos.data(), heads, h);
        const T zt = (zp ? zp[n * heads + h] : T(0)) + wp[n * heads + h];
        zo[n * heads + h] = zt;
        so[n * heads + h] = T(gate / (double(zt) + state_eps));
      }
    }
  });
  return {w, z, scale};
}

// Backward of pooled_forward for a train step, from the plane means (N, C)
// in float64 that the forward read, recomputing its (N, C) and (N, heads)
// vectors in double. Each incoming gradient (N, heads) may be undefined
// (no gradient). The gradients follow PyTorch's ops on the same vectors
// (kcla/fused.py's fused_query_key and gate_and_weight): none through the
// clamp of ||K|| / tau where it is above the clamp, nor through the 1e-12
// floor of ||K|| where ||K|| is below it, and none from ||K|| = 0 into K.
// Returns the gradients of (means (N, C) float64, query_weight,
// key_weight (ks), head_mix (heads, heads), Z^{t-1} (N, heads)), the last
// four in x's dtype; summed serially in a fixed order.
std::vector<Tensor> pooled_backward(
    const c10::optional<Tensor>& grad_w, const c10::optional<Tensor>& grad_z,
    const c10::optional<Tensor>& grad_scale, const Tensor& x,
    const Tensor& query_weight, const Tensor& key_weight, const Tensor& tau,
    double clamp, const Tensor& head_mix, const c10::optional<Tensor>& z_prev,
    double state_eps, const Tensor& means) {
  TORCH_CHECK(x.dim() == 4, "kcla pooled_backward: x must be (N, C, H, W)");
  const int64_t N = x.size(0), C = x.size(1);
  const int64_t heads = tau.size(0), head_dim = C / heads;
  const int64_t ks = query_weight.numel(), pad = (ks - 1) / 2;
  TORCH_CHECK(means.scalar_type() == at::kDouble && means.numel() == N * C &&
                  means.is_contiguous(),
              "kcla pooled_backward: means must be (N, C) float64");
  auto as_double =
      [](const c10::optional<Tensor>& t) -> c10::optional<Tensor> {
    if (!(t.has_value() && t->defined())) return c10::nullopt;
    return t->to(at::kDouble).contiguous();
  };
  const auto gw_in = as_double(grad_w), gz_in = as_double(grad_z),
             gs_in = as_double(grad_scale);
  auto options = means.options();
  Tensor grad_means = at::zeros({N, C}, options);
  Tensor grad_qw = at::zeros({ks}, options);
  Tensor grad_kw = at::zeros({ks}, options);
  Tensor grad_mix = at::zeros({heads, heads}, options);
  Tensor grad_z_prev = at::empty({N, heads}, options);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kcla_pooled_backward", [&] {
    using T = scalar_t;
    const T* qw = query_weight.data_ptr<T>();
    const T* kw = key_weight.data_ptr<T>();
    const T* taup = tau.data_ptr<T>();
    const T* mix = head_mix.data_ptr<T>();
    const T* zp = optional_ptr<T>(z_prev);
    const double* mp = means.data_ptr<double>();
    const double* gwp = optional_ptr<double>(gw_in);
    const double* gzp = optional_ptr<double>(gz_in);
    const double* gsp = optional_ptr<double>(gs_in);
    double* gmp = grad_means.data_ptr<double>();
    double* gqwp = grad_qw.data_ptr<double>();
    double* gkwp = grad_kw.data_ptr<double>();
    double* gmixp = grad_mix.data_ptr<double>();
    double* gzpp = grad_z_prev.data_ptr<double>();
    std::vector<double> q(C), k(C), gq(C), gk(C);
    std::vector<double> k_norm(heads), qk(heads), q_cos(heads), gphi(heads),
        gw_total(heads);
    for (int64_t n = 0; n < N; ++n) {
      const double* pn = mp + n * C;
      pooled_vectors(qw, kw, ks, pn, C, heads, q.data(), k.data(),
                     k_norm.data(), qk.data(), q_cos.data());
      // Z^t = Z^{t-1} + w and scale = gate / (Z^t + eps), as the forward
      // rounded them.
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t i = n * heads + h;
        const T w = T(layer_weight(k_norm[h], taup[h], clamp));
        const double zt = double((zp ? zp[i] : T(0)) + w);
        const double gate = head_gate(mix, q_cos.data(), heads, h);
        const double den = zt + state_eps;
        const double gs = gsp ? gsp[i] : 0.0;
        const double gzt = (gzp ? gzp[i] : 0.0) - gs * gate / (den * den);
        gzpp[i] = gzt;
        gw_total[h] = (gwp ? gwp[i] : 0.0) + gzt;
        gphi[h] = gs / den * gate * (1.0 - gate);
      }
      for (int64_t h = 0; h < heads; ++h) {
        // Phi's gradient, and q_cos's through it.
        double g_cos = 0;
        for (int64_t j = 0; j < heads; ++j) {
          g_cos += gphi[j] * double(mix[j * heads + h]);
          gmixp[h * heads + j] += gphi[h] * q_cos[j];
        }
        const double floor_norm = std::max(k_norm[h], 1e-12);
        const double g_dot = g_cos / floor_norm;
        double g_norm = k_norm[h] >= 1e-12
                            ? -g_cos * qk[h] / (floor_norm * floor_norm)
                            : 0.0;
        const double tau_h = double(taup[h]);
        if (k_norm[h] / tau_h <= clamp)
          g_norm += gw_total[h] * std::exp(k_norm[h] / tau_h) / tau_h;
        for (int64_t d = 0; d < head_dim; ++d) {
          const int64_t c = h * head_dim + d;
          gq[c] = g_dot * k[c];
          gk[c] = g_dot * q[c] +
                  (k_norm[h] > 0 ? g_norm * k[c] / k_norm[h] : 0.0);
        }
      }
      // The conv1d's backward: q[c] = sum_t qw[t] m[c + t - pad].
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t t = 0; t < ks; ++t) {
          const int64_t src = c + t - pad;
          if (src < 0 || src >= C) continue;
          gmp[n * C + src] += gq[c] * double(qw[t]) + gk[c] * double(kw[t]);
          gqwp[t] += gq[c] * pn[src];
          gkwp[t] += gk[c] * pn[src];
        }
      }
    }
  });
  auto to_x = [&](const Tensor& t) { return t.to(x.scalar_type()); };
  return {grad_means, to_x(grad_qw), to_x(grad_kw), to_x(grad_mix),
          to_x(grad_z_prev)};
}

// The end of a residual block in inference, fused with the plane means
// that pooled_forward needs: x = ReLU(BN(pre) + identity), BN with its
// running statistics, per plane (n, c):
//   x = max(a_c (pre - mean_c) + beta_c + identity, 0)
// (centred first, as PyTorch's BN). Returns (x, its plane means (N, C) in
// float64). Where the block ran its norm, add and ReLU as three ops over
// memory and the layer a fourth to pool, this is one. inplace writes x over
// pre.
std::vector<Tensor> block_tail_forward(const Tensor& pre,
                                       const Tensor& identity,
                                       const c10::optional<Tensor>& gamma,
                                       const c10::optional<Tensor>& beta,
                                       const Tensor& running_mean,
                                       const Tensor& running_var, double eps,
                                       bool inplace) {
  TORCH_CHECK(pre.dim() == 4 && pre.sizes() == identity.sizes() &&
                  pre.is_contiguous() && identity.is_contiguous() &&
                  pre.scalar_type() == identity.scalar_type(),
              "kcla block_tail_forward: pre and identity must be contiguous "
              "(N, C, H, W) tensors of one shape and dtype");
  const int64_t N = pre.size(0), C = pre.size(1),
                HW = pre.size(2) * pre.size(3);
  TORCH_CHECK(!pre.is_alias_of(identity),
              "kcla block_tail_forward: identity must not share pre's memory");
  Tensor x = inplace ? pre : at::empty_like(pre);
  Tensor means = at::empty({N, C}, pre.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(pre.scalar_type(), "kcla_block_tail", [&] {
    using T = scalar_t;
    const T* pp = pre.data_ptr<T>();
    const T* ip = identity.data_ptr<T>();
    const T* gp = optional_ptr<T>(gamma);
    const T* bp = optional_ptr<T>(beta);
    const T* rmp = running_mean.data_ptr<T>();
    const T* rvp = running_var.data_ptr<T>();
    T* xp = x.data_ptr<T>();
    double* mp = means.data_ptr<double>();
    at::parallel_for(0, N * C, 1, [&](int64_t begin, int64_t end) {
      for (int64_t nc = begin; nc < end; ++nc) {
        const int64_t c = nc % C;
        const ChannelNorm cn = affine_norm(gp, bp, c, rmp[c], rvp[c], eps);
        mp[nc] = relu_add_norm<T>(xp + nc * HW, pp + nc * HW, ip + nc * HW,
                                  T(cn.mean), T(cn.a), T(cn.beta), HW) /
                 HW;
      }
    });
  });
  return {x, means};
}

// A residual block's add and ReLU in a train step, x = ReLU(pre + identity)
// written over pre, with the plane means of x (N, C) in x's dtype (summed
// as block_tail_forward sums them), which the next KCLA layer's pooled
// vectors read: one pass instead of the add, the ReLU and the sum.
std::vector<Tensor> add_relu_means(const Tensor& pre, const Tensor& identity) {
  TORCH_CHECK(pre.dim() == 4 && pre.sizes() == identity.sizes() &&
                  pre.is_contiguous() && identity.is_contiguous() &&
                  pre.scalar_type() == identity.scalar_type(),
              "kcla add_relu_means: pre and identity must be contiguous "
              "(N, C, H, W) tensors of one shape and dtype");
  TORCH_CHECK(!pre.is_alias_of(identity),
              "kcla add_relu_means: identity must not share pre's memory");
  const int64_t N = pre.size(0), C = pre.size(1),
                HW = pre.size(2) * pre.size(3);
  Tensor means = at::empty({N, C}, pre.options());
  AT_DISPATCH_FLOATING_TYPES(pre.scalar_type(), "kcla_add_relu_means", [&] {
    using T = scalar_t;
    T* xp = pre.data_ptr<T>();
    const T* ip = identity.data_ptr<T>();
    T* mp = means.data_ptr<T>();
    at::parallel_for(0, N * C, 1, [&](int64_t begin, int64_t end) {
      for (int64_t nc = begin; nc < end; ++nc) {
        mp[nc] =
            T(add_relu_sum<T>(xp + nc * HW, xp + nc * HW, ip + nc * HW, HW) /
              HW);
      }
    });
  });
  return {pre, means};
}

// add_relu_means' backward: dL/dpre (= dL/didentity) from dL/dx, dL/dmeans
// (N, C) and x, into out where given (which may be grad_x).
Tensor add_relu_means_backward(const Tensor& grad_x, const Tensor& grad_means,
                               const Tensor& x,
                               const c10::optional<Tensor>& out) {
  const bool has_out = out.has_value() && out->defined();
  TORCH_CHECK(x.dim() == 4 && x.is_contiguous() && grad_x.is_contiguous() &&
                  grad_x.sizes() == x.sizes() &&
                  grad_x.scalar_type() == x.scalar_type() &&
                  grad_means.is_contiguous() && grad_means.dim() == 2 &&
                  grad_means.size(0) == x.size(0) &&
                  grad_means.size(1) == x.size(1) &&
                  grad_means.scalar_type() == x.scalar_type() &&
                  (!has_out || (out->is_contiguous() &&
                                out->sizes() == x.sizes() &&
                                out->scalar_type() == x.scalar_type())),
              "kcla add_relu_means_backward: grad_x, x and out must be "
              "contiguous tensors of one shape and dtype, grad_means (N, C) "
              "in that dtype");
  const int64_t N = x.size(0), C = x.size(1), HW = x.size(2) * x.size(3);
  Tensor result = has_out ? *out : at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kcla_add_relu_means_backward",
                             [&] {
    using T = scalar_t;
    const T* gp = grad_x.data_ptr<T>();
    const T* gm = grad_means.data_ptr<T>();
    const T* xp = x.data_ptr<T>();
    T* op = result.data_ptr<T>();
    at::parallel_for(0, N * C, 1, [&](int64_t begin, int64_t end) {
      for (int64_t nc = begin; nc < end; ++nc) {
        // As autograd computes the mean's gradient: dL/dmean / HW.
        relu_mean_backward<T>(op + nc * HW, gp + nc * HW, xp + nc * HW,
                              gm[nc] / T(HW), HW);
      }
    });
  });
  return result;
}

// U^t = U^{t-1} + w X^t (w X^t without U^{t-1}) alone, plane by plane,
// with branch_forward's arithmetic (BranchInputs::update_state): what the
// state tape recomputes for the compiled nodes, bit for bit their forward's.
// Writes into out where given, which may be U^{t-1} itself.
Tensor state_forward(const Tensor& x, const c10::optional<Tensor>& u_prev,
                     const Tensor& w, const c10::optional<Tensor>& out) {
  const Geometry g = geometry(x, w);
  auto matches = [&](const c10::optional<Tensor>& t) {
    return !(t.has_value() && t->defined()) ||
           (t->sizes() == x.sizes() && t->is_contiguous() &&
            t->scalar_type() == x.scalar_type());
  };
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() &&
                  w.scalar_type() == x.scalar_type() && matches(u_prev) &&
                  matches(out),
              "kcla state_forward: x, U^{t-1} and out must be contiguous "
              "tensors of one shape and dtype, w (N, heads) in that dtype");
  Tensor u = (out.has_value() && out->defined()) ? *out : at::empty_like(x);
  const int64_t HW = g.H * g.W;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "kcla_state_forward", [&] {
    using T = scalar_t;
    const T* xp = x.data_ptr<T>();
    const T* pp = optional_ptr<T>(u_prev);
    const T* wp = w.data_ptr<T>();
    T* up = u.data_ptr<T>();
    at::parallel_for(0, g.N * g.C, 1, [&](int64_t begin, int64_t end) {
      for (int64_t nc = begin; nc < end; ++nc) {
        const int64_t h = (nc / g.C) * g.heads + (nc % g.C) / g.head_dim;
        state_update<T>(up + nc * HW, pp ? pp + nc * HW : nullptr,
                        xp + nc * HW, wp[h], HW);
      }
    });
  });
  return u;
}

// out = b + a x over n values.
template <typename T>
KCLA_CLONES void affine_plane(T* __restrict out, const T* __restrict x, T a,
                              T b, int64_t n) {
#pragma omp simd
  for (int64_t p = 0; p < n; ++p) out[p] = b + a * x[p];
}

// sum_i a[i] b[i] over n values, in double.
template <typename T>
KCLA_CLONES double dot(const T* __restrict a, const double* __restrict b,
                       int64_t n) {
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) total += double(a[i]) * b[i];
  return total;
}

// Algorithm 1 in inference (kcla/fused.py, folded_renormalise) in one call,
// where eager PyTorch runs some twenty small ops. With the incoming state
// (U, Z) (heads_in heads), the eval BN y = s_c x + t_c of the state norm and
// the head-grouped strided 1x1 adapter W (none: the re-normalisation within
// a stage), per sample n:
//   r_i   = 1 / Z[n, head of input channel i]
//   m_o   = s_o sum_i W[o, i] r_i mean(sub_i) + t_o   (mean of A = BN(W(U/Z)))
//   Z'    = exp(min(||conv1d_k(m)_h|| / tau_h, clamp))  (per new head h)
//   U'_o  = Z'_h (s_o sum_i W[o, i] r_i sub_i + t_o)
// where sub_i is what the adapter reads of U_i (every stride-th row and
// column). Pass 1 gathers sub and its plane means (parallel over planes);
// the pooled vectors are serial, in double; pass 2 is one batched matmul
// with every scaling folded into the per-sample weights, or, without an
// adapter, one affine map per plane. Returns (U', Z').
std::vector<Tensor> renormalise_forward(
    const Tensor& u, const Tensor& z, const c10::optional<Tensor>& adapt_weight,
    int64_t stride, const c10::optional<Tensor>& gamma,
    const c10::optional<Tensor>& beta, const Tensor& running_mean,
    const Tensor& running_var, double eps, const Tensor& key_weight,
    const Tensor& tau, double clamp) {
  TORCH_CHECK(u.dim() == 4 && u.is_contiguous() && z.dim() == 2 &&
                  z.size(0) == u.size(0) && u.size(1) % z.size(1) == 0 &&
                  stride >= 1,
              "kcla renormalise_forward: U must be a contiguous (N, C, H, W) "
              "tensor and Z (N, heads) with heads dividing C");
  const bool adapts = adapt_weight.has_value() && adapt_weight->defined();
  const int64_t N = u.size(0), C_in = u.size(1), H = u.size(2), W = u.size(3);
  const int64_t in_head = C_in / z.size(1);
  const int64_t C_out = adapts ? adapt_weight->size(0) : C_in;
  const int64_t cig = adapts ? adapt_weight->size(1) : 1;
  TORCH_CHECK(!adapts || (adapt_weight->is_contiguous() && C_in % cig == 0 &&
                          C_out % (C_in / cig) == 0),
              "kcla renormalise_forward: the adapter's weight must be a "
              "contiguous grouped 1x1 kernel that matches U");
  TORCH_CHECK(adapts || stride == 1,
              "kcla renormalise_forward: a stride needs an adapter");
  const int64_t groups = adapts ? C_in / cig : 1, cog = C_out / groups;
  const int64_t Ho = (H - 1) / stride + 1, Wo = (W - 1) / stride + 1;
  const int64_t P = Ho * Wo, HW = H * W;
  const int64_t heads = tau.size(0), head_dim = C_out / heads;
  TORCH_CHECK(C_out % heads == 0,
              "kcla renormalise_forward: heads must divide the new width");
  const int64_t ks = key_weight.numel();
  const bool gathers = adapts && stride > 1;
  Tensor sub = gathers ? at::empty({N, C_in, P}, u.options()) : u;
  Tensor out = at::empty({N, C_out, Ho, Wo}, u.options());
  Tensor z_new = at::empty({N, heads}, u.options());
  std::vector<double> plane_mean(N * C_in);
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "kcla_renormalise_forward", [&] {
    using T = scalar_t;
    const T* up = u.data_ptr<T>();
    T* sp = sub.data_ptr<T>();
    at::parallel_for(0, N * C_in, 16, [&](int64_t begin, int64_t end) {
      for (int64_t nc = begin; nc < end; ++nc) {
        const T* plane = up + nc * HW;
        if (gathers) {
          T* dst = sp + nc * P;
          for (int64_t i = 0; i < Ho; ++i) {
            const T* row = plane + i * stride * W;
            for (int64_t j = 0; j < Wo; ++j) dst[i * Wo + j] = row[j * stride];
          }
          plane = dst;
        }
        plane_mean[nc] = flat_sum<T>(plane, P) / P;
      }
    });

    const T* zp = z.data_ptr<T>();
    const T* wp = adapts ? adapt_weight->data_ptr<T>() : nullptr;
    const T* gp = optional_ptr<T>(gamma);
    const T* bp = optional_ptr<T>(beta);
    const T* rmp = running_mean.data_ptr<T>();
    const T* rvp = running_var.data_ptr<T>();
    const T* kw = key_weight.data_ptr<T>();
    const T* taup = tau.data_ptr<T>();
    T* zo = z_new.data_ptr<T>();
    // The eval BN as y = bn_scale x + bn_shift, as bn_affine computes it.
    std::vector<double> bn_scale(C_out), bn_shift(C_out);
    for (int64_t o = 0; o < C_out; ++o) {
      double s = T(1) / std::sqrt(rvp[o] + T(eps));
      if (gp) s = T(s) * gp[o];
      bn_scale[o] = T(s);
      bn_shift[o] = T(-rmp[o] * T(s)) + (bp ? bp[o] : T(0));
    }
    // Per sample: the weights (adapter, 1 / Z, BN scale, Z') and biases
    // (BN shift, Z') of pass 2.
    Tensor weight = at::empty({N * groups, cog, adapts ? cig : 1}, u.options());
    Tensor bias = at::empty({N * groups, cog, 1}, u.options());
    T* ew = weight.data_ptr<T>();
    T* eb = bias.data_ptr<T>();
    std::vector<double> in_scale(C_in), scaled_mean(C_in), mean(C_out);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < C_in; ++i)
        in_scale[i] = T(1) / zp[n * z.size(1) + i / in_head];
      const double* pm = plane_mean.data() + n * C_in;
      for (int64_t i = 0; i < C_in; ++i) scaled_mean[i] = in_scale[i] * pm[i];
      for (int64_t o = 0; o < C_out; ++o) {
        const double m =
            adapts ? dot<T>(wp + o * cig, scaled_mean.data() + (o / cog) * cig,
                            cig)
                   : scaled_mean[o];
        mean[o] = bn_scale[o] * m + bn_shift[o];
      }
      for (int64_t h = 0; h < heads; ++h) {
        double kk = 0;
        for (int64_t d = 0; d < head_dim; ++d) {
          const double k =
              eca_tap(kw, ks, mean.data(), C_out, h * head_dim + d);
          kk += k * k;
        }
        zo[n * heads + h] = T(layer_weight(std::sqrt(kk), taup[h], clamp));
      }
      for (int64_t o = 0; o < C_out; ++o) {
        const double zh = zo[n * heads + o / head_dim];
        const double s = bn_scale[o] * zh;
        const int64_t row = n * C_out + o;  // (n, group, o in group)
        if (adapts) {
          const int64_t i0 = (o / cog) * cig;
          for (int64_t i = 0; i < cig; ++i)
            ew[row * cig + i] = T(wp[o * cig + i] * in_scale[i0 + i] * s);
        } else {
          ew[row] = T(in_scale[o] * s);
        }
        eb[row] = T(bn_shift[o] * zh);
      }
    }
    if (adapts) {
      Tensor batched = out.view({N * groups, cog, P});
      at::baddbmm_out(batched, bias, weight, sub.view({N * groups, cig, P}));
    } else {
      T* op = out.data_ptr<T>();
      at::parallel_for(0, N * C_out, 16, [&](int64_t begin, int64_t end) {
        for (int64_t nc = begin; nc < end; ++nc) {
          affine_plane<T>(op + nc * HW, up + nc * HW, ew[nc], eb[nc], HW);
        }
      });
    }
  });
  return {out, z_new};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CPU kernels of kcla_mm's compiled KCLA layer";
  m.def("branch_forward", &branch_forward,
        "KCLA state update, depthwise conv, norm, ReLU, drop path and "
        "residual add, one plane at a time");
  m.def("branch_output", &branch_output,
        "branch_forward's output from U^t and its statistics");
  m.def("pooled_forward", &pooled_forward,
        "Queries, keys, layer weight, gate and state normaliser of one "
        "layer, without autograd");
  m.def("pooled_backward", &pooled_backward,
        "Backward of pooled_forward, for a train step");
  m.def("block_tail_forward", &block_tail_forward,
        "A residual block's norm, residual add and ReLU in inference, with "
        "the plane means of the result");
  m.def("add_relu_means", &add_relu_means,
        "A residual block's add and ReLU in a train step, written over its "
        "input, with the plane means of the result");
  m.def("add_relu_means_backward", &add_relu_means_backward,
        "Backward of add_relu_means");
  m.def("state_forward", &state_forward,
        "The state update alone, as branch_forward computes it");
  m.def("renormalise_forward", &renormalise_forward,
        "Algorithm 1 (re-normalisation of the state) in inference");
  m.def("branch_backward", &branch_backward,
        "Backward of branch_forward, recomputing the state and the conv");
  m.def("holders", &holders,
        "References to a gradient's TensorImpl and StorageImpl, or -1 where "
        "it is not a whole, torch-owned storage");
  // What the Python side expects of these functions' arguments and
  // results: kcla_mm/models/layers/kcla/compiled.py's KERNEL_INTERFACE,
  // raised with every change to them, so that a build of older sources is
  // not called with the new arguments.
  m.attr("interface") = 5;
}
