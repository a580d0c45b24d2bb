#pragma once
// POSIX file primitives for checkpoints, each failure a zshard::error (io) that names the file
// and the system's reason: positioned reads of byte ranges (pread: ranks read their own ranges
// of shared files without a shared file position), sequential writes that an injected hook can
// fail or slow down (tests: a full disk, a slow disk), fsync of files and directories, and the
// atomic rename a save commits with.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include "zshard/core/error.hpp"

namespace zshard::checkpoint {

// Called before every write with the file, the offset and the size; it may throw (an injected
// full disk) or sleep (a slow disk). Empty: no hook.
using write_hook = std::function<void(const std::string& path, std::uint64_t offset, std::size_t bytes)>;

[[noreturn]] inline void throw_io(const std::string& what, const std::string& path, int err,
                                  const std::string& hint = {}) {
  throw error(error_kind::io, what + " '" + path + "': " + std::strerror(err), hint);
}

class file_handle {
 public:
  file_handle() = default;
  file_handle(const std::string& path, int flags, mode_t mode = 0644) : path_(path) {
    do fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0)
      throw_io((flags & (O_WRONLY | O_RDWR)) ? "cannot create" : "cannot open", path, errno,
               (flags & (O_WRONLY | O_RDWR)) ? "check that the directory exists, is writable and has free space"
                                             : "check the path; a checkpoint needs every file its manifest lists");
  }
  static file_handle read_only(const std::string& path) { return file_handle(path, O_RDONLY); }
  static file_handle create(const std::string& path) { return file_handle(path, O_WRONLY | O_CREAT | O_TRUNC); }

  file_handle(const file_handle&) = delete;
  file_handle& operator=(const file_handle&) = delete;
  file_handle(file_handle&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  file_handle& operator=(file_handle&& o) noexcept {
    if (this != &o) {
      close_quietly();
      fd_ = o.fd_;
      path_ = std::move(o.path_);
      o.fd_ = -1;
    }
    return *this;
  }
  ~file_handle() { close_quietly(); }

  const std::string& path() const noexcept { return path_; }
  int fd() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

  std::uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw_io("cannot stat", path_, errno);
    return static_cast<std::uint64_t>(st.st_size);
  }

  // Exactly `bytes` from `offset`, or an error naming the file (a short read is a truncated file).
  void read_at(std::uint64_t offset, void* dst, std::size_t bytes) const {
    auto* p = static_cast<char*>(dst);
    while (bytes > 0) {
      const ssize_t r = ::pread(fd_, p, bytes, static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        throw_io("read failed on", path_, errno);
      }
      if (r == 0)
        throw error(error_kind::io, "'" + path_ + "' ends at byte " + std::to_string(offset) + ", " +
                                        std::to_string(bytes) + " more bytes expected (truncated file)",
                    "the file is incomplete: copy it again, or load an earlier checkpoint");
      p += r;
      bytes -= static_cast<std::size_t>(r);
      offset += static_cast<std::uint64_t>(r);
    }
  }

  // Appends at the current position (files are written front to back).
  void write_all(const void* src, std::size_t bytes, const write_hook& hook = {}) {
    if (hook) hook(path_, written_, bytes);
    const auto* p = static_cast<const char*>(src);
    while (bytes > 0) {
      const ssize_t w = ::write(fd_, p, bytes);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw_io("write failed on", path_, errno, "free space on the disk, or save to another directory");
      }
      p += w;
      bytes -= static_cast<std::size_t>(w);
      written_ += static_cast<std::uint64_t>(w);
    }
  }
  std::uint64_t written() const noexcept { return written_; }

  // At `offset`, leaving the file position alone (ranks writing their parts of one file).
  void write_at(std::uint64_t offset, const void* src, std::size_t bytes, const write_hook& hook = {}) {
    if (hook) hook(path_, offset, bytes);
    const auto* p = static_cast<const char*>(src);
    while (bytes > 0) {
      const ssize_t w = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        throw_io("write failed on", path_, errno, "free space on the disk, or write to another directory");
      }
      p += w;
      bytes -= static_cast<std::size_t>(w);
      offset += static_cast<std::uint64_t>(w);
    }
  }
  void truncate(std::uint64_t bytes) {
    if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) throw_io("cannot size", path_, errno);
  }

  void sync() {
    if (::fsync(fd_) != 0) throw_io("fsync failed on", path_, errno, "free space on the disk, or check the device");
  }
  void close() {
    if (fd_ < 0) return;
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_io("close failed on", path_, errno);
  }

 private:
  void close_quietly() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
  std::string path_;
  std::uint64_t written_ = 0;
};

// Makes a rename or a new entry in `dir` durable.
inline void sync_directory(const std::string& dir) {
  file_handle d(dir, O_RDONLY | O_DIRECTORY);
  d.sync();
}

// rename(2): atomic replacement of `to` on POSIX file systems.
inline void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) throw_io("cannot rename '" + from + "' to", to, errno);
}

// A whole small file (manifests, pointers, markers).
inline std::string read_small_file(const std::string& path, std::size_t limit = std::size_t{64} << 20) {
  file_handle f = file_handle::read_only(path);
  const std::uint64_t n = f.size();
  if (n > limit)
    throw error(error_kind::io, "'" + path + "' has " + std::to_string(n) + " bytes, more than the " +
                                    std::to_string(limit) + " a file of its kind may have",
                "the file is not what its name says; check the path");
  std::string s(static_cast<std::size_t>(n), '\0');
  if (n) f.read_at(0, s.data(), s.size());
  return s;
}

// Writes `text` to path (fsynced). Not atomic by itself: write to a temporary name and rename.
inline void write_small_file(const std::string& path, const std::string& text, const write_hook& hook = {}) {
  file_handle f = file_handle::create(path);
  f.write_all(text.data(), text.size(), hook);
  f.sync();
  f.close();
}

// Creates `dir` (and its parents) or reports why not, naming it.
inline void make_directories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw error(error_kind::io, "cannot create directory '" + dir + "': " + (ec ? ec.message() : "not a directory"),
                "choose a writable directory for checkpoints");
}

}  // namespace zshard::checkpoint
