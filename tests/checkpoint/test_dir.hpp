#pragma once
// A fresh temporary directory per test, removed afterwards.
#include <atomic>
#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>

namespace ckpt_test {

// A memory file system when there is one (fsync costs nothing there: tests that save many
// times), else the system's temporary directory.
inline std::filesystem::path memory_temp_base() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) return "/dev/shm";
  return std::filesystem::temp_directory_path();
}

class temp_dir {
 public:
  explicit temp_dir(const std::filesystem::path& base = std::filesystem::temp_directory_path()) {
    static std::atomic<int> counter{0};
    path_ = (base /
             ("zshard-ckpt-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::string& path() const noexcept { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace ckpt_test
