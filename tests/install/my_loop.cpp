// A training loop built out of tree against an installed Spillway (tests/install/run): it sees
// only the installed headers and library, through `pkg-config --cflags --libs spillway`.
// Four weights of 256 KiB and an accumulator under a 1 MiB device budget, so the Session must
// swap; every iteration adds 1 to each weight and sums them. Prints one line; exit 0 when right.
#include <offload/session_hooks.hpp>  // installed too: the seam the Session's second constructor takes
#include <offload/swap_policy.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#ifndef SPILLWAY_HAVE_CUDA
#error "spillway.pc's Cflags should define SPILLWAY_HAVE_CUDA"
#endif

int main() try {
  constexpr std::size_t n = 64 * 1024;  // floats per tensor: 256 KiB
  constexpr std::uint64_t bytes = n * sizeof(float);
  constexpr int layers = 4, iterations = 3;

  spillway::session_config config;
  config.backend = "cpu";
  config.cpu_device_memory = spillway::parse_size("64MiB");
  config.device_budget = spillway::parse_size("1MiB");  // five tensors of 256 KiB do not fit
  config.policy = "auto";
  spillway::Session s(config);

  std::vector<spillway::tensor_handle> w;
  for (int i = 0; i < layers; ++i) {
    std::vector<float> init(n, float(i + 1));
    w.push_back(s.add_persistent("w" + std::to_string(i), bytes, spillway::tensor_kind::parameter, init.data()));
  }

  std::vector<float> sum(n);
  std::uint64_t moved = 0;
  for (int it = 1; it <= iterations; ++it) {
    s.begin_iteration();
    auto acc = s.add_transient("acc", bytes);
    {
      auto op = s.op("acc.forward.zero", {}, {acc});
      op.device().launch_kernel(op.stream(), [a = op.ptr<float>(acc)] {
        for (std::size_t k = 0; k < n; ++k) a[k] = 0;
      });
    }
    for (int i = 0; i < layers; ++i) {
      auto op = s.op("layer" + std::to_string(i) + ".forward", {w[i], acc}, {w[i], acc});
      op.device().launch_kernel(op.stream(), [p = op.ptr<float>(w[i]), a = op.ptr<float>(acc)] {
        for (std::size_t k = 0; k < n; ++k) a[k] += (p[k] += 1.0f);
      });
    }
    s.read(acc, sum.data(), bytes);
    s.release(acc);
    auto report = s.end_iteration();
    moved += report.h2d_bytes + report.d2h_bytes;

    // Weight i holds i + 1 + it, so the sum is 10 + 4 * it in every element.
    const float want = float(layers * (layers + 1) / 2 + layers * it);
    for (std::size_t k = 0; k < n; ++k) {
      if (sum[k] != want) {
        std::printf("my_loop: FAILED: iteration %d, sum[%zu] = %g, want %g\n", it, k, double(sum[k]), double(want));
        return 1;
      }
    }
  }
  std::vector<float> last(n);
  s.read(w[layers - 1], last.data(), bytes);
  if (last[0] != float(layers + iterations) || last[n - 1] != float(layers + iterations)) {
    std::printf("my_loop: FAILED: w%d = %g, want %d\n", layers - 1, double(last[0]), layers + iterations);
    return 1;
  }
  if (moved == 0) {
    std::printf("my_loop: FAILED: nothing was swapped under a budget below the tensors' size\n");
    return 1;
  }
  std::printf("my_loop: ok (%d iterations, %llu bytes swapped, cuda build %d)\n", iterations,
              static_cast<unsigned long long>(moved), SPILLWAY_HAVE_CUDA);
  return 0;
} catch (const std::exception& e) {
  std::printf("my_loop: FAILED: %s\n", e.what());
  return 1;
}
