// Note [Deterministic kernels], tested: the same inputs give the same bits whatever the buffer
// addresses (aligned or not), the device instance, a slow stream, or other work on the cores.
#include <gtest/gtest.h>

#include <tbb/parallel_for.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "device/cpu_device.hpp"
#include "kernel_rig.hpp"
#include "kernels/kernels.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

using outputs = std::vector<std::vector<float>>;

/// Runs every kernel family once; each input buffer starts `offset` floats into its allocation.
outputs run_everything(rig& r, std::size_t offset) {
  outputs out;
  auto up = [&](const std::vector<float>& v) { return r.up(v, offset); };
  auto zeros = [&](std::size_t n) { return r.alloc<float>(n, offset); };
  auto keep = [&](const float* d, std::size_t n) { out.push_back(r.down(d, n)); };

  {  // GEMM in every transpose, big enough for OpenBLAS to use its threads
    const int m = 192, n = 256, k = 320;
    const float* a = up(random_floats(static_cast<std::size_t>(m) * k, 1));
    const float* b = up(random_floats(static_cast<std::size_t>(k) * n, 2));
    float* c = zeros(static_cast<std::size_t>(m) * n);
    for (auto ta : {transpose::no, transpose::yes})
      for (auto tb : {transpose::no, transpose::yes}) {
        gemm(r.ctx(), r.s(), ta, tb, m, n, k, 1.0f, a, ta == transpose::yes ? m : k, b,
             tb == transpose::yes ? k : n, 0.0f, c, n);
        keep(c, static_cast<std::size_t>(m) * n);
      }
  }
  {  // linear + gelu + residual, layer norm, softmax with cross-entropy
    const int rows = 256, in = 384, hid = 500;
    const float* x = up(random_floats(static_cast<std::size_t>(rows) * in, 3));
    const float* w = up(random_floats(static_cast<std::size_t>(hid) * in, 4, -0.1f, 0.1f));
    const float* bias = up(random_floats(hid, 5));
    float* h = zeros(static_cast<std::size_t>(rows) * hid);
    linear_forward(r.ctx(), r.s(), x, w, bias, h, rows, in, hid);
    float* g = zeros(static_cast<std::size_t>(rows) * hid);
    gelu_forward(r.ctx(), r.s(), h, g, static_cast<std::size_t>(rows) * hid);
    add(r.ctx(), r.s(), g, h, g, static_cast<std::size_t>(rows) * hid);
    keep(g, static_cast<std::size_t>(rows) * hid);
    const float* gamma = up(random_floats(hid, 6, 0.5f, 1.5f));
    const float* beta = up(random_floats(hid, 7));
    float* y = zeros(static_cast<std::size_t>(rows) * hid);
    float* mean = zeros(rows);
    float* rstd = zeros(rows);
    layer_norm_forward(r.ctx(), r.s(), g, gamma, beta, y, mean, rstd, rows, hid);
    keep(y, static_cast<std::size_t>(rows) * hid);
    const std::int32_t* t = r.up(random_ids(rows, hid, 8), offset);
    float* losses = zeros(rows);
    float* loss = zeros(1);
    float* dy = zeros(static_cast<std::size_t>(rows) * hid);
    softmax_cross_entropy(r.ctx(), r.s(), y, t, losses, loss, dy, rows, hid, 1.0f / rows);
    keep(loss, 1);
    keep(dy, static_cast<std::size_t>(rows) * hid);
    float* dg = zeros(static_cast<std::size_t>(rows) * hid);
    float* dgamma = zeros(hid);
    float* dbeta = zeros(hid);
    layer_norm_backward(r.ctx(), r.s(), g, gamma, mean, rstd, dy, dg, dgamma, dbeta, rows, hid, false);
    keep(dg, static_cast<std::size_t>(rows) * hid);
    keep(dgamma, hid);
    gelu_backward(r.ctx(), r.s(), h, dg, dg, static_cast<std::size_t>(rows) * hid);
    float* dx = zeros(static_cast<std::size_t>(rows) * in);
    float* dw = zeros(static_cast<std::size_t>(hid) * in);
    float* db = zeros(hid);
    linear_backward(r.ctx(), r.s(), x, w, dg, dx, dw, db, rows, in, hid, false);
    keep(dx, static_cast<std::size_t>(rows) * in);
    keep(dw, static_cast<std::size_t>(hid) * in);
    keep(db, hid);
    float* p = const_cast<float*>(w);
    float* m = zeros(static_cast<std::size_t>(hid) * in);
    float* v = zeros(static_cast<std::size_t>(hid) * in);
    adam_step(r.ctx(), r.s(), p, dw, m, v, static_cast<std::size_t>(hid) * in, adam_config{}, 1);
    keep(p, static_cast<std::size_t>(hid) * in);
  }
  {  // embedding and attention
    const int tokens = 512, vocab = 300, dim = 96;
    const auto ids = random_ids(tokens, 40, 9);  // many repeats: scatter-add order matters
    const std::int32_t* di = r.up(ids, offset);
    const float* table = up(random_floats(static_cast<std::size_t>(vocab) * dim, 10));
    float* e = zeros(static_cast<std::size_t>(tokens) * dim);
    embedding_forward(r.ctx(), r.s(), di, table, e, tokens, vocab, dim);
    float* dt = zeros(static_cast<std::size_t>(vocab) * dim);
    embedding_backward(r.ctx(), r.s(), di, up(random_floats(static_cast<std::size_t>(tokens) * dim, 11)), dt,
                       tokens, vocab, dim, false);
    keep(dt, static_cast<std::size_t>(vocab) * dim);
    const attention_shape sh{2, 64, 128, 4};
    const std::size_t nq = static_cast<std::size_t>(sh.batch) * sh.seq * 3 * sh.channels;
    const std::size_t no = static_cast<std::size_t>(sh.batch) * sh.seq * sh.channels;
    const std::size_t np = static_cast<std::size_t>(sh.batch) * sh.heads * sh.seq * sh.seq;
    const float* qkv = up(random_floats(nq, 12));
    float* o = zeros(no);
    float* probs = zeros(np);
    attention_forward(r.ctx(), r.s(), sh, qkv, o, probs);
    keep(o, no);
    float* dqkv = zeros(nq);
    attention_backward(r.ctx(), r.s(), sh, qkv, probs, up(random_floats(no, 13)), dqkv, zeros(np));
    keep(dqkv, nq);
  }
  {  // convolution and pooling
    const conv2d_shape sh{4, 8, 16, 16, 16, {3, 1, 1}};
    const std::size_t nx = 4 * 8 * 16 * 16, nw = 16 * 8 * 9, ny = 4 * 16 * 16 * 16;
    const float* x = up(random_floats(nx, 14));
    const float* w = up(random_floats(nw, 15));
    float* y = zeros(ny);
    conv2d_forward(r.ctx(), r.s(), sh, x, w, up(random_floats(16, 16)), y);
    keep(y, ny);
    float* dx = zeros(nx);
    float* dw = zeros(nw);
    float* db = zeros(16);
    conv2d_backward(r.ctx(), r.s(), sh, x, w, up(random_floats(ny, 17)), dx, dw, db, false);
    keep(dx, nx);
    keep(dw, nw);
    keep(db, 16);
    const pool2d_shape ps{4, 16, 16, 16, {3, 2, 1}};
    const std::size_t np = 4 * 16 * static_cast<std::size_t>(ps.out_height() * ps.out_width());
    float* py = zeros(np);
    max_pool2d_forward(r.ctx(), r.s(), ps, y, py);
    float* pdx = zeros(ny);
    max_pool2d_backward(r.ctx(), r.s(), ps, y, py, up(random_floats(np, 18)), pdx);
    keep(pdx, ny);
    float* avg = zeros(64);
    global_avg_pool_forward(r.ctx(), r.s(), y, avg, 4, 16, 256);
    keep(avg, 64);
  }
  return out;
}

void expect_same(const outputs& a, const outputs& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << what << ": output " << i;
}

}  // namespace

TEST(Determinism, SameBitsAtOtherAddressesOnAnotherDevice) {
  outputs first;
  {
    rig r;
    first = run_everything(r, 0);
  }
  for (std::size_t offset : {1u, 3u, 17u}) {  // 4, 12 and 68 bytes: off every vector alignment
    rig r;
    expect_same(first, run_everything(r, offset), "offset " + std::to_string(offset));
  }
}

TEST(Determinism, SameBitsWithASlowStreamAndBusyCores) {
  outputs first;
  {
    rig r;
    first = run_everything(r, 0);
  }
  rig r;
  dynamic_cast<cpu_device&>(r.dev()).set_stream_delay(r.s(), std::chrono::microseconds(200));
  std::atomic<bool> stop{false};
  std::thread noise([&] {  // keeps oneTBB's workers busy with other work, changing who runs what
    while (!stop.load()) {
      tbb::parallel_for(0, 64, [](int) {
        volatile double x = 0;
        for (int i = 0; i < 20000; ++i) x = x + i;
      });
    }
  });
  const auto second = run_everything(r, 5);
  stop = true;
  noise.join();
  expect_same(first, second, "slow stream, busy cores");
}

TEST(DeterminismCuda, SameBitsAtOtherAddresses) {
  SPILLWAY_NEEDS_CUDA();
  outputs first;
  {
    rig r("cuda");
    first = run_everything(r, 0);
  }
  // Other addresses with the same alignment (see the note on cuBLAS and cuDNN).
  rig r("cuda");
  (void)r.alloc<float>(1000);  // shifts the later allocations
  expect_same(first, run_everything(r, 64), "cuda, offset 256 bytes");
}
