// GEMM dispatch and the cpu backend's GEMM over OpenBLAS (cblas_sgemm, row-major).
// OpenBLAS splits a GEMM over threads by output tiles, never along k, so every output element
// is summed in the same order on every run (Note [Deterministic kernels]). The bf16 GEMM widens
// its operands into float32 scratch and runs the same cblas_sgemm.
#include "kernels/gemm.hpp"

#include <cblas.h>

#include <type_traits>

#include "kernels/cuda_launchers.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/launch.hpp"

namespace spillway::kernels {
namespace {

CBLAS_TRANSPOSE cblas_op(transpose t) { return t == transpose::yes ? CblasTrans : CblasNoTrans; }

void check_gemm(transpose ta, transpose tb, int m, int n, int k, int lda, int ldb, int ldc) {
  SPILLWAY_KERNEL_EXPECTS(m >= 0 && n >= 0 && k >= 0, "gemm: negative size");
  SPILLWAY_KERNEL_EXPECTS(lda >= (ta == transpose::yes ? m : k) && lda >= 1, "gemm: lda too small");
  SPILLWAY_KERNEL_EXPECTS(ldb >= (tb == transpose::yes ? k : n) && ldb >= 1, "gemm: ldb too small");
  SPILLWAY_KERNEL_EXPECTS(ldc >= n && ldc >= 1, "gemm: ldc too small");
}

/// Where the bf16 GEMM's float32 scratch lies in the workspace, in floats: A widened and packed
/// (m * k), then B (k * n), then C (m * n, used when C is bf16); each part starts on 64 bytes.
struct bf16_scratch {
  std::size_t b_offset, c_offset, floats;
};

std::size_t round_to_64_bytes(std::size_t floats) { return (floats + 15) / 16 * 16; }

bf16_scratch bf16_scratch_for(int m, int n, int k) {
  const auto mm = static_cast<std::size_t>(m), nn = static_cast<std::size_t>(n), kk = static_cast<std::size_t>(k);
  bf16_scratch l{};
  l.b_offset = round_to_64_bytes(mm * kk);
  l.c_offset = l.b_offset + round_to_64_bytes(kk * nn);
  l.floats = l.c_offset + round_to_64_bytes(mm * nn);
  return l;
}

/// dst[r * cols + c] = float(src[r * ld + c]) for a rows x cols block (packs it, exactly).
void widen_block(const bf16* src, int ld, int rows, int cols, float* dst) {
  const auto nc = static_cast<std::size_t>(cols), nld = static_cast<std::size_t>(ld);
  detail::parallel_for(static_cast<std::size_t>(rows), detail::grain_for(nc), [&](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r) {
      const bf16* in = src + r * nld;
      float* out = dst + r * nc;
      for (std::size_t j = 0; j < nc; ++j) out[j] = to_float(in[j]);
    }
  });
}

/// dst[r * ld + c] = to_bf16(src[r * cols + c]): rounds a packed float32 block into C.
void narrow_block(const float* src, int rows, int cols, bf16* dst, int ld) {
  const auto nc = static_cast<std::size_t>(cols), nld = static_cast<std::size_t>(ld);
  detail::parallel_for(static_cast<std::size_t>(rows), detail::grain_for(nc), [&](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r) {
      const float* in = src + r * nc;
      bf16* out = dst + r * nld;
      for (std::size_t j = 0; j < nc; ++j) out[j] = to_bf16(in[j]);
    }
  });
}

/// The bf16 GEMM for C of type TC (float or bf16): checks, then cuBLAS or the cpu work.
template <class TC>
void gemm_bf16(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k, float alpha,
               const bf16* a, int lda, long long stride_a, const bf16* b, int ldb, long long stride_b,
               float beta, TC* c, int ldc, long long stride_c, int batch) {
  check_gemm(ta, tb, m, n, k, lda, ldb, ldc);
  SPILLWAY_KERNEL_EXPECTS(batch >= 0, "gemm: negative batch");
  if (m == 0 || n == 0 || batch == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) {
    detail::cuda_gemm_bf16<TC>(ctx, s, ta == transpose::yes, tb == transpose::yes, m, n, k, alpha, a, lda,
                               stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
    return;
  }
#endif
  const bf16_scratch l = bf16_scratch_for(m, n, k);
  auto* scratch = static_cast<float*>(ctx.workspace(l.floats * sizeof(float), "gemm (bf16)"));
  detail::enqueue_cpu(ctx, s, [=] {
    // A and B as stored: rows x cols before the transpose is applied.
    const int a_rows = ta == transpose::yes ? k : m, a_cols = ta == transpose::yes ? m : k;
    const int b_rows = tb == transpose::yes ? n : k, b_cols = tb == transpose::yes ? k : n;
    float* wa = scratch;
    float* wb = scratch + l.b_offset;
    float* wc = scratch + l.c_offset;
    for (int i = 0; i < batch; ++i) {
      TC* ci = c + i * stride_c;
      if (k == 0) {  // C * beta, with beta == 0 ignoring C (NaN too), as the float32 GEMM does
        for (int r = 0; r < m; ++r)
          for (int col = 0; col < n; ++col) {
            TC& x = ci[static_cast<long long>(r) * ldc + col];
            x = store_as<TC>(beta == 0.0f ? 0.0f : beta * load(x));
          }
        continue;
      }
      widen_block(a + i * stride_a, lda, a_rows, a_cols, wa);
      widen_block(b + i * stride_b, ldb, b_rows, b_cols, wb);
      if constexpr (std::is_same_v<TC, float>) {
        cblas_sgemm(CblasRowMajor, cblas_op(ta), cblas_op(tb), m, n, k, alpha, wa, a_cols, wb, b_cols, beta, ci,
                    ldc);
      } else {
        if (beta != 0.0f) widen_block(ci, ldc, m, n, wc);
        cblas_sgemm(CblasRowMajor, cblas_op(ta), cblas_op(tb), m, n, k, alpha, wa, a_cols, wb, b_cols, beta, wc,
                    n);
        narrow_block(wc, m, n, ci, ldc);
      }
    }
  });
}

template <class TC>
void gemm_bf16_packed(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k, float alpha,
                      const bf16* a, const bf16* b, float beta, TC* c) {
  const int lda = ta == transpose::yes ? m : k;
  const int ldb = tb == transpose::yes ? k : n;
  gemm_bf16(ctx, s, ta, tb, m, n, k, alpha, a, lda > 0 ? lda : 1, 0, b, ldb > 0 ? ldb : 1, 0, beta, c,
            n > 0 ? n : 1, 0, 1);
}

}  // namespace

void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k,
          float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  gemm_strided_batched(ctx, s, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k,
          float alpha, const float* a, const float* b, float beta, float* c) {
  const int lda = ta == transpose::yes ? m : k;
  const int ldb = tb == transpose::yes ? k : n;
  gemm(ctx, s, ta, tb, m, n, k, alpha, a, lda > 0 ? lda : 1, b, ldb > 0 ? ldb : 1, beta, c,
       n > 0 ? n : 1);
}

void gemm_strided_batched(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n,
                          int k, float alpha, const float* a, int lda, long long stride_a,
                          const float* b, int ldb, long long stride_b, float beta, float* c,
                          int ldc, long long stride_c, int batch) {
  check_gemm(ta, tb, m, n, k, lda, ldb, ldc);
  SPILLWAY_KERNEL_EXPECTS(batch >= 0, "gemm: negative batch");
  if (m == 0 || n == 0 || batch == 0) return;
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) {
    detail::cuda_gemm(ctx, s, ta == transpose::yes, tb == transpose::yes, m, n, k, alpha, a, lda,
                      stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
    return;
  }
#endif
  detail::enqueue_cpu(ctx, s, [=] {
    for (int i = 0; i < batch; ++i) {
      float* ci = c + i * stride_c;
      if (k == 0) {  // BLAS leaves C * beta; say so explicitly, including beta == 0 over NaN
        for (int r = 0; r < m; ++r)
          for (int col = 0; col < n; ++col)
            ci[static_cast<long long>(r) * ldc + col] =
                beta == 0.0f ? 0.0f : beta * ci[static_cast<long long>(r) * ldc + col];
        continue;
      }
      cblas_sgemm(CblasRowMajor, cblas_op(ta), cblas_op(tb), m, n, k, alpha, a + i * stride_a, lda,
                  b + i * stride_b, ldb, beta, ci, ldc);
    }
  });
}

std::size_t gemm_bf16_workspace_bytes(const kernel_context& ctx, int m, int n, int k) {
  SPILLWAY_KERNEL_EXPECTS(m >= 0 && n >= 0 && k >= 0, "gemm_bf16_workspace_bytes: negative size");
  if (ctx.is_cuda()) return 0;
  return bf16_scratch_for(m, n, k).floats * sizeof(float);
}

void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k, float alpha,
          const bf16* a, int lda, const bf16* b, int ldb, float beta, float* c, int ldc) {
  gemm_bf16(ctx, s, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}
void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k, float alpha,
          const bf16* a, int lda, const bf16* b, int ldb, float beta, bf16* c, int ldc) {
  gemm_bf16(ctx, s, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}
void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k, float alpha,
          const bf16* a, const bf16* b, float beta, float* c) {
  gemm_bf16_packed(ctx, s, ta, tb, m, n, k, alpha, a, b, beta, c);
}
void gemm(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k, float alpha,
          const bf16* a, const bf16* b, float beta, bf16* c) {
  gemm_bf16_packed(ctx, s, ta, tb, m, n, k, alpha, a, b, beta, c);
}
void gemm_strided_batched(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k,
                          float alpha, const bf16* a, int lda, long long stride_a, const bf16* b, int ldb,
                          long long stride_b, float beta, float* c, int ldc, long long stride_c, int batch) {
  gemm_bf16(ctx, s, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
}
void gemm_strided_batched(kernel_context& ctx, stream s, transpose ta, transpose tb, int m, int n, int k,
                          float alpha, const bf16* a, int lda, long long stride_a, const bf16* b, int ldb,
                          long long stride_b, float beta, bf16* c, int ldc, long long stride_c, int batch) {
  gemm_bf16(ctx, s, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
}

namespace {

// The linear layer over either storage type T: its GEMMs and the bias pair.
template <class T>
void linear_forward_t(kernel_context& ctx, stream s, const T* x, const T* w, const T* bias, T* y, int rows, int in,
                      int out) {
  gemm(ctx, s, transpose::no, transpose::yes, rows, out, in, 1.0f, x, w, 0.0f, y);
  if (bias != nullptr) bias_add(ctx, s, y, bias, rows, out);
}

template <class T>
void linear_backward_t(kernel_context& ctx, stream s, const T* x, const T* w, const T* dy, T* dx, T* dw, T* dbias,
                       int rows, int in, int out, bool accumulate) {
  if (dx != nullptr) gemm(ctx, s, transpose::no, transpose::no, rows, in, out, 1.0f, dy, w, 0.0f, dx);
  if (dw != nullptr)
    gemm(ctx, s, transpose::yes, transpose::no, out, in, rows, 1.0f, dy, x, accumulate ? 1.0f : 0.0f, dw);
  if (dbias != nullptr) bias_backward(ctx, s, dy, dbias, rows, out, accumulate);
}

}  // namespace

void linear_forward(kernel_context& ctx, stream s, const float* x, const float* w, const float* bias,
                    float* y, int rows, int in, int out) {
  linear_forward_t(ctx, s, x, w, bias, y, rows, in, out);
}
void linear_forward(kernel_context& ctx, stream s, const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                    int rows, int in, int out) {
  linear_forward_t(ctx, s, x, w, bias, y, rows, in, out);
}

void linear_backward(kernel_context& ctx, stream s, const float* x, const float* w, const float* dy,
                     float* dx, float* dw, float* dbias, int rows, int in, int out, bool accumulate) {
  linear_backward_t(ctx, s, x, w, dy, dx, dw, dbias, rows, in, out, accumulate);
}
void linear_backward(kernel_context& ctx, stream s, const bf16* x, const bf16* w, const bf16* dy, bf16* dx,
                     bf16* dw, bf16* dbias, int rows, int in, int out, bool accumulate) {
  linear_backward_t(ctx, s, x, w, dy, dx, dw, dbias, rows, in, out, accumulate);
}

// Every GEMM of a linear layer touches one x-sized, one w-sized and one y-sized matrix.
std::size_t linear_bf16_workspace_bytes(const kernel_context& ctx, int rows, int in, int out) {
  return gemm_bf16_workspace_bytes(ctx, rows, out, in);
}

}  // namespace spillway::kernels
