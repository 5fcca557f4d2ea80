// bf16 variants of layer norm, softmax with cross-entropy, embedding, causal softmax and
// pooling: each against its float32 kernel on the widened inputs (the same arithmetic, so every
// output is to_bf16 of the float32 result, bit for bit), repeated runs giving the same bits, and
// cuda against cpu where a GPU is present.
#include <gtest/gtest.h>

#include <math.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bf16_rig.hpp"
#include "kernels/attention.hpp"
#include "kernels/embedding.hpp"
#include "kernels/host_exp.hpp"
#include "kernels/layer_norm.hpp"
#include "kernels/pool_window.hpp"
#include "kernels/pooling.hpp"
#include "kernels/softmax_cross_entropy.hpp"

using namespace spillway;
using namespace spillway::kernels;
using namespace spillway::kernels::testing;

namespace {

// ---- layer norm ----

struct ln_case {
  int rows, cols;
  std::vector<bf16> x, g, b, dy, dg0, db0;  // dg0, db0: what dgamma, dbeta hold before an accumulating backward

  ln_case(int r, int c) : rows(r), cols(c) {
    x = random_bf16(static_cast<std::size_t>(r) * c, 11, -2.0f, 2.0f);
    g = random_bf16(c, 12, 0.5f, 1.5f);
    b = random_bf16(c, 13);
    dy = random_bf16(static_cast<std::size_t>(r) * c, 14);
    dg0 = random_bf16(c, 15);
    db0 = random_bf16(c, 16);
  }
};

/// Outputs of a layer norm forward and two backwards (overwrite, then accumulate onto dg0/db0),
/// in storage type T.
template <class T>
struct ln_out {
  std::vector<T> y, dx, dg, db, dg_acc, db_acc;
  std::vector<float> mean, rstd;
};

/// `offset` shifts every buffer, to vary the addresses between runs.
template <class T>
ln_out<T> run_ln(rig& r, const ln_case& k, std::size_t offset = 0) {
  const std::size_t n = static_cast<std::size_t>(k.rows) * k.cols;
  const auto c = static_cast<std::size_t>(k.cols);
  const T* x = r.up(in_storage<T>(k.x), offset);
  const T* g = r.up(in_storage<T>(k.g), offset);
  const T* b = r.up(in_storage<T>(k.b), offset);
  const T* dy = r.up(in_storage<T>(k.dy), offset);
  T* y = r.alloc<T>(n, offset);
  float* mean = r.alloc<float>(k.rows, offset);
  float* rstd = r.alloc<float>(k.rows, offset);
  layer_norm_forward(r.ctx(), r.s(), x, g, b, y, mean, rstd, k.rows, k.cols);
  T* dx = r.alloc<T>(n, offset);
  T* dg = r.alloc<T>(c, offset);
  T* db = r.alloc<T>(c, offset);
  layer_norm_backward(r.ctx(), r.s(), x, g, mean, rstd, dy, dx, dg, db, k.rows, k.cols, false);
  ln_out<T> o;
  o.y = r.down(y, n);
  o.mean = r.down(mean, k.rows);
  o.rstd = r.down(rstd, k.rows);
  o.dx = r.down(dx, n);
  o.dg = r.down(dg, c);
  o.db = r.down(db, c);
  T* dga = r.up(in_storage<T>(k.dg0), offset);
  T* dba = r.up(in_storage<T>(k.db0), offset);
  layer_norm_backward(r.ctx(), r.s(), x, g, mean, rstd, dy, dx, dga, dba, k.rows, k.cols, true);
  o.dg_acc = r.down(dga, c);
  o.db_acc = r.down(dba, c);
  return o;
}

}  // namespace

TEST(Bf16LayerNorm, EveryOutputIsTheRoundedFloat32Result) {
  // 150 columns: more than one 64-column block of the gamma/beta sums, the last one partial.
  const ln_case k(37, 150);
  rig r;
  const auto want = run_ln<float>(r, k);
  const auto got = run_ln<bf16>(r, k);
  expect_same_bits(got.y, round_bf16(want.y), "y");
  expect_same_bits(got.mean, want.mean, "mean");
  expect_same_bits(got.rstd, want.rstd, "rstd");
  expect_same_bits(got.dx, round_bf16(want.dx), "dx");
  expect_same_bits(got.dg, round_bf16(want.dg), "dgamma");
  expect_same_bits(got.db, round_bf16(want.db), "dbeta");
  expect_same_bits(got.dg_acc, round_bf16(want.dg_acc), "dgamma, accumulated");
  expect_same_bits(got.db_acc, round_bf16(want.db_acc), "dbeta, accumulated");
  // The accumulated sums really started from dg0 and db0: most differ from the overwritten ones
  // (one alone may not, where its dg0 or db0 is too small to move the rounded sum).
  std::size_t moved_g = 0, moved_b = 0;
  for (std::size_t i = 0; i < got.dg.size(); ++i) {
    moved_g += got.dg_acc[i].bits != got.dg[i].bits;
    moved_b += got.db_acc[i].bits != got.db[i].bits;
  }
  EXPECT_GT(moved_g, got.dg.size() / 2);
  EXPECT_GT(moved_b, got.db.size() / 2);
}

TEST(Bf16LayerNorm, RepeatsBitForBitAtOtherAddresses) {
  const ln_case k(19, 300);
  rig r;
  const auto a = run_ln<bf16>(r, k);
  const auto b = run_ln<bf16>(r, k, 3);
  expect_same_bits(b.y, a.y, "y");
  expect_same_bits(b.dx, a.dx, "dx");
  expect_same_bits(b.dg, a.dg, "dgamma");
  expect_same_bits(b.db_acc, a.db_acc, "dbeta, accumulated");
}

TEST(Bf16LayerNormCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const ln_case k(64, 768);
  rig cpu("cpu"), gpu("cuda");
  const auto want = run_ln<bf16>(cpu, k);
  const auto got = run_ln<bf16>(gpu, k);
  // The backends sum in different fixed orders (block trees against a serial loop), so the
  // float32 values differ in their last bits and their bf16 roundings by at most one step.
  expect_near_bf16(got.y, want.y, 1e-3, 1, "y");
  expect_near_all(got.mean, want.mean, 1e-5, 1e-5, "mean");
  expect_near_all(got.rstd, want.rstd, 1e-5, 1e-4, "rstd");
  expect_near_bf16(got.dx, want.dx, 1e-3, 1, "dx");
  expect_near_bf16(got.dg, want.dg, 1e-2, 1, "dgamma");
  expect_near_bf16(got.db_acc, want.db_acc, 1e-2, 1, "dbeta, accumulated");
}

// ---- softmax with cross-entropy ----

namespace {

struct xent_case {
  int rows, cols;
  std::vector<bf16> logits;
  std::vector<std::int32_t> targets;

  xent_case(int r, int c) : rows(r), cols(c) {
    logits = random_bf16(static_cast<std::size_t>(r) * c, 21, -4.0f, 4.0f);
    targets = random_ids(r, c, 22);
    targets[1] = -1;  // an ignored row
  }
};

template <class T>
struct xent_out {
  std::vector<float> losses, mean, mean_only;
  std::vector<T> dlogits, in_place;
};

template <class T>
xent_out<T> run_xent(rig& r, const xent_case& k, std::size_t offset = 0) {
  const std::size_t n = static_cast<std::size_t>(k.rows) * k.cols;
  const float scale = 1.0f / static_cast<float>(k.rows);
  const T* logits = r.up(in_storage<T>(k.logits), offset);
  const std::int32_t* targets = r.up(k.targets, offset);
  float* losses = r.alloc<float>(k.rows, offset);
  float* mean = r.alloc<float>(1, offset);
  T* dlogits = r.alloc<T>(n, offset);
  softmax_cross_entropy(r.ctx(), r.s(), logits, targets, losses, mean, dlogits, k.rows, k.cols, scale);
  xent_out<T> o;
  o.losses = r.down(losses, k.rows);
  o.mean = r.down(mean, 1);
  o.dlogits = r.down(dlogits, n);
  // The mean alone (row losses in the bound workspace), and the gradient written over the logits.
  float* mean_only = r.alloc<float>(1, offset);
  softmax_cross_entropy(r.ctx(), r.s(), logits, targets, static_cast<float*>(nullptr), mean_only,
                        static_cast<T*>(nullptr), k.rows, k.cols, scale);
  o.mean_only = r.down(mean_only, 1);
  T* both = r.up(in_storage<T>(k.logits), offset);
  softmax_cross_entropy(r.ctx(), r.s(), both, targets, losses, mean, both, k.rows, k.cols, scale);
  o.in_place = r.down(both, n);
  return o;
}

}  // namespace

TEST(Bf16SoftmaxCrossEntropy, LossesMatchFloat32AndGradientsAreItsRounding) {
  const xent_case k(29, 300);
  rig r;
  const auto want = run_xent<float>(r, k);
  const auto got = run_xent<bf16>(r, k);
  expect_same_bits(got.losses, want.losses, "losses");
  expect_same_bits(got.mean, want.mean, "mean loss");
  expect_same_bits(got.mean_only, want.mean, "mean loss without row losses");
  expect_same_bits(got.dlogits, round_bf16(want.dlogits), "dlogits");
  expect_same_bits(got.in_place, got.dlogits, "dlogits over the logits");
  EXPECT_EQ(got.losses[1], 0.0f);  // the ignored row
  EXPECT_GT(got.losses[0], 0.0f);
}

TEST(Bf16SoftmaxCrossEntropy, RepeatsBitForBitAtOtherAddresses) {
  const xent_case k(17, 1000);
  rig r;
  const auto a = run_xent<bf16>(r, k);
  const auto b = run_xent<bf16>(r, k, 5);
  expect_same_bits(b.losses, a.losses, "losses");
  expect_same_bits(b.dlogits, a.dlogits, "dlogits");
}

TEST(Bf16SoftmaxCrossEntropyCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  const xent_case k(64, 5000);
  rig cpu("cpu"), gpu("cuda");
  const auto want = run_xent<bf16>(cpu, k);
  const auto got = run_xent<bf16>(gpu, k);
  // Max and sum in different fixed orders: float32 losses agree to rounding, gradients to one
  // bf16 step.
  expect_near_all(got.losses, want.losses, 1e-5, 1e-5, "losses");
  expect_near_all(got.mean, want.mean, 1e-5, 1e-5, "mean loss");
  expect_near_bf16(got.dlogits, want.dlogits, 1e-9, 1, "dlogits");
  expect_near_bf16(got.in_place, want.in_place, 1e-9, 1, "dlogits over the logits");
}

// ---- embedding ----

namespace {

struct emb_case {
  int tokens = 300, vocab = 50, dim = 40;  // ids repeat; some rows of the table are never used
  std::vector<std::int32_t> ids;
  std::vector<bf16> table, pos, dout, dtable0;

  emb_case() {
    ids = random_ids(tokens, vocab - 5, 31);  // ids vocab-5 .. vocab-1 stay unused
    table = random_bf16(static_cast<std::size_t>(vocab) * dim, 32);
    pos = random_bf16(static_cast<std::size_t>(tokens) * dim, 33);
    dout = random_bf16(static_cast<std::size_t>(tokens) * dim, 34);
    dtable0 = random_bf16(static_cast<std::size_t>(vocab) * dim, 35);
  }
};

template <class T>
struct emb_out {
  std::vector<T> lookup, summed, dtable, dtable_acc;
};

template <class T>
emb_out<T> run_emb(rig& r, const emb_case& k, std::size_t offset = 0) {
  const std::size_t n = static_cast<std::size_t>(k.tokens) * k.dim;
  const std::size_t nv = static_cast<std::size_t>(k.vocab) * k.dim;
  const std::int32_t* ids = r.up(k.ids, offset);
  const T* table = r.up(in_storage<T>(k.table), offset);
  emb_out<T> o;
  T* out = r.alloc<T>(n, offset);
  embedding_forward(r.ctx(), r.s(), ids, table, out, k.tokens, k.vocab, k.dim);
  o.lookup = r.down(out, n);
  T* summed = r.up(in_storage<T>(k.pos), offset);
  embedding_forward(r.ctx(), r.s(), ids, table, summed, k.tokens, k.vocab, k.dim, true);
  o.summed = r.down(summed, n);
  const T* dout = r.up(in_storage<T>(k.dout), offset);
  T* dtable = r.up(in_storage<T>(k.dtable0), offset);  // overwritten whole, rows no token uses too
  embedding_backward(r.ctx(), r.s(), ids, dout, dtable, k.tokens, k.vocab, k.dim, false);
  o.dtable = r.down(dtable, nv);
  T* acc = r.up(in_storage<T>(k.dtable0), offset);
  embedding_backward(r.ctx(), r.s(), ids, dout, acc, k.tokens, k.vocab, k.dim, true);
  o.dtable_acc = r.down(acc, nv);
  return o;
}

/// The float32 gradient as the kernel defines it: each element's tokens added in token order.
std::vector<float> scatter_in_token_order(const emb_case& k, std::vector<float> dtable) {
  const auto dout = widen_bf16(k.dout);
  for (int t = 0; t < k.tokens; ++t)
    for (int j = 0; j < k.dim; ++j)
      dtable[static_cast<std::size_t>(k.ids[t]) * k.dim + j] += dout[static_cast<std::size_t>(t) * k.dim + j];
  return dtable;
}

}  // namespace

TEST(Bf16Embedding, LookupCopiesBitsAndGradientsAreTheRoundedFloat32Sums) {
  const emb_case k;
  rig r;
  const auto want = run_emb<float>(r, k);
  const auto got = run_emb<bf16>(r, k);
  expect_same_bits(got.lookup, round_bf16(want.lookup), "lookup");
  expect_same_bits(got.summed, round_bf16(want.summed), "lookup added to positions");
  expect_same_bits(got.dtable, round_bf16(want.dtable), "dtable");
  expect_same_bits(got.dtable_acc, round_bf16(want.dtable_acc), "dtable, accumulated");
  // The float32 kernel sums each element's tokens in token order, exactly as it always has.
  const std::size_t nv = static_cast<std::size_t>(k.vocab) * k.dim;
  expect_same_bits(want.dtable, scatter_in_token_order(k, std::vector<float>(nv, 0.0f)), "float32 dtable");
  expect_same_bits(want.dtable_acc, scatter_in_token_order(k, widen_bf16(k.dtable0)), "float32 dtable, accumulated");
  // Rows no token uses: zero when overwritten, untouched when accumulated.
  const std::size_t unused = static_cast<std::size_t>(k.vocab - 1) * k.dim;
  EXPECT_EQ(to_float(got.dtable[unused]), 0.0f);
  EXPECT_EQ(got.dtable_acc[unused].bits, k.dtable0[unused].bits);
}

TEST(Bf16Embedding, RepeatsBitForBitAtOtherAddresses) {
  const emb_case k;
  rig r;
  const auto a = run_emb<bf16>(r, k);
  const auto b = run_emb<bf16>(r, k, 7);
  expect_same_bits(b.summed, a.summed, "lookup added to positions");
  expect_same_bits(b.dtable, a.dtable, "dtable");
  expect_same_bits(b.dtable_acc, a.dtable_acc, "dtable, accumulated");
}

TEST(Bf16EmbeddingCuda, MatchesCpuBitForBit) {
  SPILLWAY_NEEDS_CUDA();
  // Both backends add each element's tokens in token order in float32: the same bits.
  const emb_case k;
  rig cpu("cpu"), gpu("cuda");
  const auto want = run_emb<bf16>(cpu, k);
  const auto got = run_emb<bf16>(gpu, k);
  expect_same_bits(got.lookup, want.lookup, "lookup");
  expect_same_bits(got.summed, want.summed, "lookup added to positions");
  expect_same_bits(got.dtable, want.dtable, "dtable");
  expect_same_bits(got.dtable_acc, want.dtable_acc, "dtable, accumulated");
  const auto want32 = run_emb<float>(cpu, k);
  const auto got32 = run_emb<float>(gpu, k);
  expect_same_bits(got32.dtable, want32.dtable, "float32 dtable");
}

// ---- causal softmax ----

namespace {

struct causal_case {
  int batch = 6, seq = 37;
  float scale = 0.125f;
  std::vector<bf16> scores, dprobs;

  causal_case() {
    scores = random_bf16(static_cast<std::size_t>(batch) * seq * seq, 41, -3.0f, 3.0f);
    dprobs = random_bf16(static_cast<std::size_t>(batch) * seq * seq, 42);
  }
};

template <class T>
struct causal_out {
  std::vector<T> probs, dscores;
};

/// Forward on the case's scores; backward on the bf16 forward's probabilities (`probs`, widened
/// for float32) so both storage types see the same backward inputs.
template <class T>
causal_out<T> run_causal(rig& r, const causal_case& k, const std::vector<bf16>& probs, std::size_t offset = 0) {
  const std::size_t n = k.scores.size();
  causal_out<T> o;
  T* x = r.up(in_storage<T>(k.scores), offset);
  causal_softmax_forward(r.ctx(), r.s(), x, k.batch, k.seq);
  o.probs = r.down(x, n);
  T* d = r.up(in_storage<T>(k.dprobs), offset);
  causal_softmax_backward(r.ctx(), r.s(), r.up(in_storage<T>(probs), offset), d, k.batch, k.seq, k.scale);
  o.dscores = r.down(d, n);
  return o;
}

std::vector<bf16> bf16_probs(rig& r, const causal_case& k) {
  bf16* x = r.up(k.scores);
  causal_softmax_forward(r.ctx(), r.s(), x, k.batch, k.seq);
  return r.down(x, k.scores.size());
}

}  // namespace

TEST(Bf16CausalSoftmax, ForwardAndBackwardAreTheRoundedFloat32Results) {
  const causal_case k;
  rig r;
  const auto probs = bf16_probs(r, k);
  const auto want = run_causal<float>(r, k, probs);
  const auto got = run_causal<bf16>(r, k, probs);
  expect_same_bits(got.probs, round_bf16(want.probs), "probs");
  expect_same_bits(got.dscores, round_bf16(want.dscores), "dscores");
  // Above the diagonal: zeros; row 0 of each matrix sees only itself.
  EXPECT_EQ(got.probs[1].bits, 0);
  EXPECT_EQ(to_float(got.probs[0]), 1.0f);
  EXPECT_EQ(got.dscores[1].bits, 0);
}

TEST(Bf16CausalSoftmax, Float32ForwardKeepsItsOrderOfOperations) {
  // Row i: exp(x_j - max) summed over j <= i in order, each exp times 1 / sum (the exponential
  // the cpu launchers take, Note [Host exponentials]).
  const causal_case k;
  rig r;
  const auto got = run_causal<float>(r, k, bf16_probs(r, k));
  std::vector<float> want = widen_bf16(k.scores);
  const auto t = static_cast<std::size_t>(k.seq);
  for (std::size_t row = 0; row < static_cast<std::size_t>(k.batch) * t; ++row) {
    const std::size_t i = row % t;
    float* x = want.data() + row * t;
    float mx = x[0];
    for (std::size_t j = 1; j <= i; ++j) mx = x[j] > mx ? x[j] : mx;
    float sum = 0.0f;
    for (std::size_t j = 0; j <= i; ++j) {
      x[j] = spillway::kernels::detail::host_exp(x[j] - mx);
      sum += x[j];
    }
    const float inv = 1.0f / sum;
    for (std::size_t j = 0; j <= i; ++j) x[j] *= inv;
    for (std::size_t j = i + 1; j < t; ++j) x[j] = 0.0f;
  }
  expect_same_bits(got.probs, want, "float32 probs");
}

TEST(Bf16CausalSoftmax, RepeatsBitForBitAtOtherAddresses) {
  const causal_case k;
  rig r;
  const auto probs = bf16_probs(r, k);
  const auto a = run_causal<bf16>(r, k, probs);
  const auto b = run_causal<bf16>(r, k, probs, 9);
  expect_same_bits(b.probs, a.probs, "probs");
  expect_same_bits(b.dscores, a.dscores, "dscores");
}

TEST(Bf16CausalSoftmaxCuda, MatchesCpu) {
  SPILLWAY_NEEDS_CUDA();
  causal_case k;
  k.seq = 300;  // more than one block's width of visible columns in the later rows
  k.scores = random_bf16(static_cast<std::size_t>(k.batch) * k.seq * k.seq, 43, -3.0f, 3.0f);
  k.dprobs = random_bf16(k.scores.size(), 44);
  rig cpu("cpu"), gpu("cuda");
  const auto probs = bf16_probs(cpu, k);
  const auto want = run_causal<bf16>(cpu, k, probs);
  const auto got = run_causal<bf16>(gpu, k, probs);
  expect_near_bf16(got.probs, want.probs, 1e-9, 1, "probs");
  expect_near_bf16(got.dscores, want.dscores, 1e-6, 1, "dscores");
}

// ---- pooling ----

namespace {

struct pool_case {
  pool2d_shape sh;
  std::size_t nx, ny, planes;
  std::vector<bf16> x, dy, gdy;

  explicit pool_case(const pool2d_shape& shape) : sh(shape) {
    planes = static_cast<std::size_t>(sh.batch) * sh.channels;
    nx = planes * sh.height * sh.width;
    ny = planes * sh.out_height() * sh.out_width();
    x = random_bf16(nx, 51, -2.0f, 2.0f);
    x[3] = x[2];  // a tie inside the first window: the first in row-major order wins
    dy = random_bf16(ny, 52);
    gdy = random_bf16(planes, 53);
  }
};

template <class T>
struct pool_out {
  std::vector<T> y, dx, avg, avg_dx;
};

template <class T>
pool_out<T> run_pool(rig& r, const pool_case& k, std::size_t offset = 0) {
  const int plane = k.sh.height * k.sh.width;
  pool_out<T> o;
  const T* x = r.up(in_storage<T>(k.x), offset);
  T* y = r.alloc<T>(k.ny, offset);
  max_pool2d_forward(r.ctx(), r.s(), k.sh, x, y);
  o.y = r.down(y, k.ny);
  T* dx = r.up(in_storage<T>(k.x), offset);  // overwritten
  max_pool2d_backward(r.ctx(), r.s(), k.sh, x, y, r.up(in_storage<T>(k.dy), offset), dx);
  o.dx = r.down(dx, k.nx);
  T* avg = r.alloc<T>(k.planes, offset);
  global_avg_pool_forward(r.ctx(), r.s(), x, avg, k.sh.batch, k.sh.channels, plane);
  o.avg = r.down(avg, k.planes);
  T* avg_dx = r.alloc<T>(k.nx, offset);
  global_avg_pool_backward(r.ctx(), r.s(), r.up(in_storage<T>(k.gdy), offset), avg_dx, k.sh.batch, k.sh.channels, plane);
  o.avg_dx = r.down(avg_dx, k.nx);
  return o;
}

class Bf16PoolShapes : public ::testing::TestWithParam<pool2d_shape> {};

}  // namespace

TEST_P(Bf16PoolShapes, EveryOutputIsTheRoundedFloat32Result) {
  const pool_case k(GetParam());
  rig r;
  const auto want = run_pool<float>(r, k);
  const auto got = run_pool<bf16>(r, k);
  expect_same_bits(got.y, round_bf16(want.y), "max pool y");
  expect_same_bits(got.dx, round_bf16(want.dx), "max pool dx");
  expect_same_bits(got.avg, round_bf16(want.avg), "average pool y");
  expect_same_bits(got.avg_dx, round_bf16(want.avg_dx), "average pool dx");
}

TEST_P(Bf16PoolShapes, CudaGatherAddsTheSameTermsInTheCpuOrder) {
  // The cuda max pool backward gathers each element's windows (pool_gather_grad); run here on
  // the host, it gives the cpu kernel's float32 dx bit for bit.
  const pool_case k(GetParam());
  rig r;
  const auto cpu = run_pool<float>(r, k);
  const auto x = widen_bf16(k.x);
  const auto dy = widen_bf16(k.dy);
  const pool2d_shape& sh = k.sh;
  const kernels::detail::pool_plane z{sh.height, sh.width, sh.out_height(), sh.out_width(),
                             sh.window.size, sh.window.stride, sh.window.pad};
  const std::size_t in = static_cast<std::size_t>(sh.height) * sh.width;
  const std::size_t out = static_cast<std::size_t>(sh.out_height()) * sh.out_width();
  std::vector<float> gathered(k.nx);
  for (std::size_t pl = 0; pl < k.planes; ++pl)
    for (long y = 0; y < sh.height; ++y)
      for (long xx = 0; xx < sh.width; ++xx)
        gathered[pl * in + static_cast<std::size_t>(y * sh.width + xx)] =
            kernels::detail::pool_gather_grad(z, x.data() + pl * in, dy.data() + pl * out, y, xx);
  expect_same_bits(gathered, cpu.dx, "gathered dx");
}

TEST_P(Bf16PoolShapes, RepeatsBitForBitAtOtherAddresses) {
  const pool_case k(GetParam());
  rig r;
  const auto a = run_pool<bf16>(r, k);
  const auto b = run_pool<bf16>(r, k, 11);
  expect_same_bits(b.y, a.y, "max pool y");
  expect_same_bits(b.dx, a.dx, "max pool dx");
  expect_same_bits(b.avg, a.avg, "average pool y");
}

INSTANTIATE_TEST_SUITE_P(Windows, Bf16PoolShapes,
                         ::testing::Values(pool2d_shape{2, 3, 8, 8, {2, 2, 0}},     // 2x2 stride 2
                                           pool2d_shape{2, 3, 9, 7, {3, 2, 1}},     // ResNet stem: 3x3/2 pad 1
                                           pool2d_shape{1, 2, 6, 5, {3, 1, 1}}));  // stride 1: every pixel in 9 windows

TEST(Bf16PoolingCuda, MatchesCpuBitForBit) {
  SPILLWAY_NEEDS_CUDA();
  // Max pooling picks the same element and sums in the same order on both backends; average
  // pooling sums each plane serially on both.
  const pool_case k(pool2d_shape{4, 16, 32, 32, {3, 2, 1}});
  rig cpu("cpu"), gpu("cuda");
  const auto want = run_pool<bf16>(cpu, k);
  const auto got = run_pool<bf16>(gpu, k);
  expect_same_bits(got.y, want.y, "max pool y");
  expect_same_bits(got.dx, want.dx, "max pool dx");
  expect_same_bits(got.avg, want.avg, "average pool y");
  expect_same_bits(got.avg_dx, want.avg_dx, "average pool dx");
  const auto want32 = run_pool<float>(cpu, k);
  const auto got32 = run_pool<float>(gpu, k);
  expect_same_bits(got32.dx, want32.dx, "float32 max pool dx");
}
