// Output files of spillway-bench: written whole, and refused before any work when one of them is
// an input of the run or another output of it.
#include "bench/outputs.hpp"

#include <sys/stat.h>

#include <filesystem>
#include <optional>

#include "bench/command.hpp"
#include "device/error.hpp"
#include "offload/text_file.hpp"

namespace spillway::bench {

namespace {

namespace fs = std::filesystem;

// The path made absolute, with links in the part that exists resolved, "." and ".." removed.
std::string normal_path(const std::string& path) {
  std::error_code ec;
  const auto p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::path(path).lexically_normal().string() : p.string();
}

struct file_id {
  bool exists = false, regular = false;
  dev_t dev = 0;
  ino_t ino = 0;
};

file_id id_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {true, S_ISREG(st.st_mode), st.st_dev, st.st_ino};
}

// Whether `a` and `b` name one file that writing one of them would replace.
bool same_file(const std::string& a, const std::string& b) {
  const auto ia = id_of(a), ib = id_of(b);
  if (ia.exists && ib.exists) return ia.regular && ia.dev == ib.dev && ia.ino == ib.ino;
  if (ia.exists != ib.exists) return false;
  return a == b || normal_path(a) == normal_path(b);  // neither exists yet: compare the paths
}

}  // namespace

void write_output(const std::string& path, std::string_view bytes, std::string_view flag) {
  offload::write_text_file(path, bytes, "the " + std::string(flag) + " file");
}

void check_outputs(const std::vector<named_file>& outputs, const std::vector<named_file>& inputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& out = outputs[i];
    if (out.path.empty()) continue;
    for (const auto& in : inputs)
      if (!in.path.empty() && same_file(out.path, in.path))
        throw config_error(out.flag + ": '" + out.path + "' is the " + in.flag + " file this run reads ('" + in.path +
                           "'); writing it would replace it: give another file for " + out.flag);
    for (std::size_t j = 0; j < i; ++j)
      if (!outputs[j].path.empty() && same_file(out.path, outputs[j].path))
        throw config_error(out.flag + ": '" + out.path + "' is also the " + outputs[j].flag + " file ('" + outputs[j].path +
                           "'); one would replace the other: give each output its own file");
  }
}

void check_writable(const std::string& path, std::string_view flag) {
  std::string p = path;
  if (const auto why = writable_file(p); !why.empty()) throw config_error(std::string(flag) + ": " + why);
}

}  // namespace spillway::bench
