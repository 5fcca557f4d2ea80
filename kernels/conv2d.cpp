// Dispatch and cpu launchers of 2-D convolution: im2col per image, then one OpenBLAS GEMM.
// col2im adds back into dx per channel in a fixed order; dw sums the images in order. One body
// for float32 and bf16: bf16 operands of a GEMM are widened into float32 scratch from the bound
// workspace, and bf16 results are narrowed from it once.
#include "kernels/conv2d.hpp"

#include <cblas.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda_launchers.hpp"
#include "kernels/launch.hpp"

namespace spillway::kernels {
namespace {

/// "x [batch, in, height, width], 4 out channels, kernel 3 stride 1 pad 1": the shape as an error names it.
std::string describe(const conv2d_shape& sh) {
  return "x [" + std::to_string(sh.batch) + ", " + std::to_string(sh.in_channels) + ", " +
         std::to_string(sh.height) + ", " + std::to_string(sh.width) + "] (batch, channels, height, width), " +
         std::to_string(sh.out_channels) + " out channels, kernel " + std::to_string(sh.kernel.size) + " stride " +
         std::to_string(sh.kernel.stride) + " pad " + std::to_string(sh.kernel.pad);
}

/// Every extent checked before any work, on both backends (cuDNN refuses what is refused here).
void check(const conv2d_shape& sh, const char* kernel) {
  const auto need = [&](bool ok, const char* what) {
    SPILLWAY_EXPECTS_T(usage_error, ok, std::string(kernel) + ": " + describe(sh) + ": " + what);
  };
  need(sh.batch >= 0, "the batch must not be negative");
  need(sh.in_channels > 0 && sh.out_channels > 0, "in and out channels must be at least 1");
  need(sh.height > 0 && sh.width > 0, "height and width must be at least 1");
  need(sh.kernel.size > 0 && sh.kernel.stride > 0 && sh.kernel.pad >= 0,
       "the kernel's size and stride must be at least 1 and its padding at least 0");
  need(sh.kernel.fits(sh.height) && sh.kernel.fits(sh.width),
       "the kernel must fit the padded image (height + 2 pad and width + 2 pad at least the kernel's size)");
  // cuDNN's tensor descriptors count elements in an int: both backends refuse what it refuses.
  const auto elements = [&](int channels, int h, int w) {
    return static_cast<std::uint64_t>(sh.batch) * static_cast<std::uint64_t>(channels) *
           static_cast<std::uint64_t>(h) * static_cast<std::uint64_t>(w);
  };
  const std::uint64_t x = elements(sh.in_channels, sh.height, sh.width);
  const std::uint64_t y = elements(sh.out_channels, sh.out_height(), sh.out_width());
  SPILLWAY_EXPECTS_T(usage_error, x <= conv2d_max_elements && y <= conv2d_max_elements,
                     std::string(kernel) + ": x has " + std::to_string(x) + " elements and y " + std::to_string(y) +
                         "; a convolution takes at most " + std::to_string(conv2d_max_elements) +
                         " per tensor (cuDNN's limit): split the batch");
}

struct conv_sizes {
  std::size_t c, h, w, k, r, p, q, pq, ckk, in_image, out_image;
};

conv_sizes sizes_of(const conv2d_shape& sh) {
  conv_sizes z{};
  z.c = static_cast<std::size_t>(sh.in_channels);
  z.h = static_cast<std::size_t>(sh.height);
  z.w = static_cast<std::size_t>(sh.width);
  z.k = static_cast<std::size_t>(sh.out_channels);
  z.r = static_cast<std::size_t>(sh.kernel.size);
  z.p = static_cast<std::size_t>(sh.out_height());
  z.q = static_cast<std::size_t>(sh.out_width());
  z.pq = z.p * z.q;
  z.ckk = z.c * z.r * z.r;
  z.in_image = z.c * z.h * z.w;
  z.out_image = z.k * z.pq;
  return z;
}

/// col[(c, i, j), (p, q)] = x[c, p * stride - pad + i, q * stride - pad + j], 0 in the padding.
template <class T>
void im2col(const conv2d_shape& sh, const conv_sizes& z, const T* x, float* col) {
  detail::parallel_for(z.ckk, detail::grain_for(z.pq), [&](std::size_t b, std::size_t e) {
    for (std::size_t row = b; row < e; ++row) {
      const std::size_t c = row / (z.r * z.r);
      const auto i = static_cast<long>((row / z.r) % z.r);
      const auto j = static_cast<long>(row % z.r);
      float* out = col + row * z.pq;
      for (std::size_t p = 0; p < z.p; ++p) {
        const long y = static_cast<long>(p) * sh.kernel.stride - sh.kernel.pad + i;
        for (std::size_t q = 0; q < z.q; ++q) {
          const long xx = static_cast<long>(q) * sh.kernel.stride - sh.kernel.pad + j;
          const bool inside = y >= 0 && y < static_cast<long>(z.h) && xx >= 0 && xx < static_cast<long>(z.w);
          out[p * z.q + q] =
              inside ? load(x[(c * z.h + static_cast<std::size_t>(y)) * z.w + static_cast<std::size_t>(xx)]) : 0.0f;
        }
      }
    }
  });
}

/// dx (zeroed first) += col2im(dcol); parallel over channels, each in a fixed order.
void col2im(const conv2d_shape& sh, const conv_sizes& z, const float* dcol, float* dx) {
  detail::parallel_for(z.c, 1, [&](std::size_t b, std::size_t e) {
    for (std::size_t c = b; c < e; ++c) {
      float* plane = dx + c * z.h * z.w;
      std::memset(plane, 0, z.h * z.w * sizeof(float));
      for (std::size_t i = 0; i < z.r; ++i)
        for (std::size_t j = 0; j < z.r; ++j) {
          const float* in = dcol + ((c * z.r + i) * z.r + j) * z.pq;
          for (std::size_t p = 0; p < z.p; ++p) {
            const long y = static_cast<long>(p) * sh.kernel.stride - sh.kernel.pad + static_cast<long>(i);
            if (y < 0 || y >= static_cast<long>(z.h)) continue;
            for (std::size_t q = 0; q < z.q; ++q) {
              const long xx = static_cast<long>(q) * sh.kernel.stride - sh.kernel.pad + static_cast<long>(j);
              if (xx < 0 || xx >= static_cast<long>(z.w)) continue;
              plane[static_cast<std::size_t>(y) * z.w + static_cast<std::size_t>(xx)] += in[p * z.q + q];
            }
          }
        }
    }
  });
}

/// float32 scratch of a bf16 convolution on the cpu backend, carved from the bound workspace:
/// w and dw whole, one image of y or dy (`out`) and one image of dx (`in`), each on 256 bytes.
struct scratch {
  float* w = nullptr;
  float* dw = nullptr;
  float* out = nullptr;
  float* in = nullptr;
};

std::size_t round256(std::size_t floats) { return (floats * sizeof(float) + 255) / 256 * 256; }

std::size_t scratch_bytes(const conv_sizes& z) {
  return 2 * round256(z.k * z.ckk) + round256(z.out_image) + round256(z.in_image);
}

/// For T = bf16 on the cpu backend, the scratch (a usage_error naming `kernel` and the size when
/// the bound workspace is smaller); for float, or on the cuda backend, none.
template <class T>
scratch scratch_for(kernel_context& ctx, const conv_sizes& z, const char* kernel) {
  scratch sc;
  if (!std::is_same_v<T, bf16> || ctx.is_cuda()) return sc;
  auto* p = static_cast<char*>(ctx.workspace(scratch_bytes(z), kernel));
  sc.w = reinterpret_cast<float*>(p);
  sc.dw = reinterpret_cast<float*>(p + round256(z.k * z.ckk));
  sc.out = reinterpret_cast<float*>(p + 2 * round256(z.k * z.ckk));
  sc.in = reinterpret_cast<float*>(p + 2 * round256(z.k * z.ckk) + round256(z.out_image));
  return sc;
}

/// A float32 view of n values: the values themselves, or bf16 ones widened into `into`.
const float* widened(const float* p, std::size_t, float*) { return p; }
const float* widened(const bf16* p, std::size_t n, float* into) {
  for (std::size_t i = 0; i < n; ++i) into[i] = to_float(p[i]);
  return into;
}

/// Where float32 results for an output of type T go: the output itself, or `into` for bf16.
float* result_of(float* p, float*) { return p; }
float* result_of(bf16*, float* into) { return into; }

/// Stores float32 results into a bf16 output, each narrowed once (nothing to do for float).
void narrow(const float*, float*, std::size_t) {}
void narrow(const float* from, bf16* to, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) to[i] = to_bf16(from[i]);
}

template <class T>
void forward(kernel_context& ctx, stream s, const conv2d_shape& shape, const T* x, const T* w, const T* bias, T* y) {
  check(shape, "conv2d_forward");
  if (shape.batch == 0) return;
  const scratch sc = scratch_for<T>(ctx, sizes_of(shape), "conv2d_forward");
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_conv2d_forward(ctx, s, shape, x, w, bias, y), [=] {
    const conv_sizes z = sizes_of(shape);
    std::vector<float> columns(z.ckk * z.pq);
    float* col = columns.data();
    const float* wf = widened(w, z.k * z.ckk, sc.w);
    for (std::size_t n = 0; n < static_cast<std::size_t>(shape.batch); ++n) {
      float* yn = result_of(y + n * z.out_image, sc.out);
      im2col(shape, z, x + n * z.in_image, col);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(z.k), static_cast<int>(z.pq),
                  static_cast<int>(z.ckk), 1.0f, wf, static_cast<int>(z.ckk), col,
                  static_cast<int>(z.pq), 0.0f, yn, static_cast<int>(z.pq));
      if (bias != nullptr)
        detail::parallel_for(z.k, 1, [&](std::size_t b, std::size_t e) {
          for (std::size_t k = b; k < e; ++k)
            for (std::size_t i = 0; i < z.pq; ++i) yn[k * z.pq + i] += load(bias[k]);
        });
      narrow(yn, y + n * z.out_image, z.out_image);
    }
  });
}

template <class T>
void backward(kernel_context& ctx, stream s, const conv2d_shape& shape, const T* x, const T* w, const T* dy, T* dx,
              T* dw, T* dbias, bool accumulate) {
  check(shape, "conv2d_backward");
  SPILLWAY_KERNEL_EXPECTS(dw != nullptr, "conv2d_backward");
  const scratch sc = scratch_for<T>(ctx, sizes_of(shape), "conv2d_backward");
  SPILLWAY_KERNEL_LAUNCH(ctx, s, detail::cuda_conv2d_backward(ctx, s, shape, x, w, dy, dx, dw, dbias, accumulate), [=] {
    const conv_sizes z = sizes_of(shape);
    const auto batch = static_cast<std::size_t>(shape.batch);
    std::vector<float> columns(z.ckk * z.pq);
    float* col = columns.data();
    const float* wf = widened(w, z.k * z.ckk, sc.w);
    // dw's sums over the images stay in float32 until the end.
    float* dwf = result_of(dw, sc.dw);
    if (!accumulate)
      std::memset(dwf, 0, z.k * z.ckk * sizeof(float));
    else if constexpr (std::is_same_v<T, bf16>)
      (void)widened(dw, z.k * z.ckk, dwf);
    for (std::size_t n = 0; n < batch; ++n) {
      const float* dyn = widened(dy + n * z.out_image, z.out_image, sc.out);
      im2col(shape, z, x + n * z.in_image, col);
      // dw += dy_n col_n^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(z.k), static_cast<int>(z.ckk),
                  static_cast<int>(z.pq), 1.0f, dyn, static_cast<int>(z.pq), col,
                  static_cast<int>(z.pq), 1.0f, dwf, static_cast<int>(z.ckk));
      if (dx != nullptr) {
        // dcol = w^T dy_n, reusing col, then folded back into dx_n.
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(z.ckk), static_cast<int>(z.pq),
                    static_cast<int>(z.k), 1.0f, wf, static_cast<int>(z.ckk), dyn, static_cast<int>(z.pq),
                    0.0f, col, static_cast<int>(z.pq));
        float* dxn = result_of(dx + n * z.in_image, sc.in);
        col2im(shape, z, col, dxn);
        narrow(dxn, dx + n * z.in_image, z.in_image);
      }
    }
    narrow(dwf, dw, z.k * z.ckk);
    if (dbias != nullptr)
      detail::parallel_for(z.k, 1, [&](std::size_t b, std::size_t e) {
        for (std::size_t k = b; k < e; ++k) {
          float sum = accumulate ? load(dbias[k]) : 0.0f;
          for (std::size_t n = 0; n < batch; ++n)
            for (std::size_t i = 0; i < z.pq; ++i) sum += load(dy[n * z.out_image + k * z.pq + i]);
          dbias[k] = store_as<T>(sum);
        }
      });
  });
}

}  // namespace

std::size_t conv2d_workspace_bytes(kernel_context& ctx, const conv2d_shape& shape) {
  check(shape, "conv2d_workspace_bytes");
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_conv2d_workspace_bytes<float>(ctx, shape);
#else
  (void)ctx;
#endif
  // The cpu launchers keep one image's im2col columns in memory of their own, as a GPU kernel
  // keeps its tiles on chip: it is the kernel's, not device memory that the budget counts.
  return 0;
}

std::size_t conv2d_bf16_workspace_bytes(kernel_context& ctx, const conv2d_shape& shape) {
  check(shape, "conv2d_bf16_workspace_bytes");
#if SPILLWAY_HAVE_CUDA
  if (ctx.is_cuda()) return detail::cuda_conv2d_workspace_bytes<bf16>(ctx, shape);
#else
  (void)ctx;
#endif
  // The float32 copies are device memory (tensor-sized); the im2col columns stay the kernel's own.
  return scratch_bytes(sizes_of(shape));
}

void conv2d_forward(kernel_context& ctx, stream s, const conv2d_shape& shape, const float* x,
                    const float* w, const float* bias, float* y) {
  forward(ctx, s, shape, x, w, bias, y);
}

void conv2d_forward(kernel_context& ctx, stream s, const conv2d_shape& shape, const bf16* x, const bf16* w,
                    const bf16* bias, bf16* y) {
  forward(ctx, s, shape, x, w, bias, y);
}

void conv2d_backward(kernel_context& ctx, stream s, const conv2d_shape& shape, const float* x,
                     const float* w, const float* dy, float* dx, float* dw, float* dbias,
                     bool accumulate) {
  backward(ctx, s, shape, x, w, dy, dx, dw, dbias, accumulate);
}

void conv2d_backward(kernel_context& ctx, stream s, const conv2d_shape& shape, const bf16* x, const bf16* w,
                     const bf16* dy, bf16* dx, bf16* dw, bf16* dbias, bool accumulate) {
  backward(ctx, s, shape, x, w, dy, dx, dw, dbias, accumulate);
}

}  // namespace spillway::kernels
