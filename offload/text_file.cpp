#include "offload/text_file.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "device/error.hpp"

namespace spillway::offload {

std::string read_text_file(const std::string& path, std::string_view what, std::string_view wanted) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw config_error(path + ": is a folder; give " + std::string(wanted));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error(path + ": cannot open " + std::string(what) + ": " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw config_error(path + ": cannot read " + std::string(what) + ": " + std::strerror(errno));
  return ss.str();
}

}  // namespace spillway::offload
