// A C locale whose decimal point is a comma, for LC_NUMERIC, as a program that calls
// setlocale(LC_ALL, "") in a German or French environment has it. The library's texts (sizes
// and numbers it writes, settings it reads) must not change with it.
#pragma once

#include <clocale>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

#include <unistd.h>

namespace spillway::test {

/// Sets LC_NUMERIC to de_DE.UTF-8 while it lives, and restores the locale (and LOCPATH) after.
/// Where the system has no such locale it builds one with localedef (Debian's `locales`) in a
/// temporary directory and points LOCPATH there. active() says whether it took; why_not() why not.
class comma_numeric_locale {
 public:
  comma_numeric_locale() {
    const char* was = std::setlocale(LC_NUMERIC, nullptr);
    saved_ = was != nullptr ? was : "C";
    for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8"})
      if (try_set(name)) return;
    std::string dir = (std::filesystem::temp_directory_path() / "spillway-locale-XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr) {
      why_not_ = "cannot make a temporary directory for localedef";
      return;
    }
    dir_ = dir;
    const std::string cmd = "localedef -i de_DE -f UTF-8 '" + dir + "/de_DE.UTF-8' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      why_not_ = "no comma-decimal locale is installed and localedef could not build de_DE.UTF-8 (install locales)";
      return;
    }
    if (const char* lp = std::getenv("LOCPATH")) locpath_ = lp;
    ::setenv("LOCPATH", dir.c_str(), 1);
    if (!try_set("de_DE.UTF-8")) why_not_ = "the de_DE.UTF-8 that localedef built did not load";
  }
  ~comma_numeric_locale() {
    std::setlocale(LC_NUMERIC, saved_.c_str());
    if (dir_) {
      if (locpath_)
        ::setenv("LOCPATH", locpath_->c_str(), 1);
      else
        ::unsetenv("LOCPATH");
      std::error_code ec;
      std::filesystem::remove_all(*dir_, ec);
    }
  }
  comma_numeric_locale(const comma_numeric_locale&) = delete;
  comma_numeric_locale& operator=(const comma_numeric_locale&) = delete;

  [[nodiscard]] bool active() const { return active_; }
  [[nodiscard]] const std::string& why_not() const { return why_not_; }

 private:
  bool try_set(const char* name) {
    if (std::setlocale(LC_NUMERIC, name) == nullptr) return false;
    if (std::string(std::localeconv()->decimal_point) == ",") return active_ = true;
    std::setlocale(LC_NUMERIC, saved_.c_str());
    return false;
  }

  std::string saved_;
  std::optional<std::string> dir_, locpath_;
  bool active_ = false;
  std::string why_not_;
};

}  // namespace spillway::test
