#pragma once
// POSIX file primitives for checkpoints, each failure a zshard::error (io) that names the file
// and the system's reason: positioned reads of byte ranges (pread: ranks read their own ranges
// of shared files without a shared file position), sequential and positioned writes, fsync of
// files and directories, the atomic rename a save commits with, and removal. Every call that
// changes or reads a file passes through an optional io_hook first (io_hook.hpp: tests inject
// a full disk, a slow disk, a truncated file or a crash at any call).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "zshard/checkpoint/io_hook.hpp"
#include "zshard/core/error.hpp"

namespace zshard::checkpoint {

[[noreturn]] inline void throw_io(const std::string& what, const std::string& path, int err,
                                  const std::string& hint = {}) {
  throw error(error_kind::io, what + " '" + path + "': " + std::strerror(err), hint);
}

class file_handle {
 public:
  file_handle() = default;
  // `hook` (may be null) sees every call on this file; it must outlive the handle.
  file_handle(const std::string& path, int flags, mode_t mode = 0644, const io_hook* hook = nullptr)
      : path_(path), hook_(hook) {
    const bool writing = (flags & (O_WRONLY | O_RDWR)) != 0;
    int err = injected_errno(hook_, {writing ? io_call::create : io_call::open, path_});
    if (!err) {
      do fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
      while (fd_ < 0 && errno == EINTR);
      if (fd_ < 0) err = errno;
    }
    if (err)
      throw_io(writing ? "cannot create" : "cannot open", path, err,
               writing ? "check that the directory exists, is writable and has free space"
                       : "check the path; a checkpoint needs every file its manifest lists");
  }
  // For reading: a regular file, opened without blocking (a FIFO or a device in its place is
  // refused, never waited on); `path` as the caller names it (links followed).
  static file_handle read_only(const std::string& path, const io_hook* hook = nullptr) {
    return open_regular(AT_FDCWD, path, path, true, hook);
  }
  // For reading: `name` inside the directory open as `dir_fd`, shown as `shown` in messages (and
  // to the hook). A regular file, opened without blocking; with follow_links false, a symbolic
  // link in its place is refused (O_NOFOLLOW: no name read from a file leads out of the directory).
  static file_handle open_regular(int dir_fd, const std::string& name, const std::string& shown, bool follow_links,
                                  const io_hook* hook = nullptr) {
    file_handle f;
    f.path_ = shown;
    f.hook_ = hook;
    int err = injected_errno(hook, {io_call::open, shown});
    const int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | (follow_links ? 0 : O_NOFOLLOW);
    if (!err) {
      do f.fd_ = ::openat(dir_fd, name.c_str(), flags);
      while (f.fd_ < 0 && errno == EINTR);
      if (f.fd_ < 0) err = errno;
    }
    struct stat st {};
    if (err == ELOOP && !follow_links && ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(st.st_mode))
      throw error(error_kind::io, "'" + shown + "' is a symbolic link, which is not followed",
                  "a checkpoint's files are read only from inside its directory: copy the file there instead of "
                  "linking it");
    if (err)
      throw_io("cannot open", shown, err, "check the path; a checkpoint needs every file its manifest lists");
    if (::fstat(f.fd_, &st) != 0) throw_io("cannot stat", shown, errno);
    if (!S_ISREG(st.st_mode))
      throw error(error_kind::io, "'" + shown + "' is " + file_type_name(st.st_mode) + ", not a regular file",
                  "the path must name a file written to disk; nothing else is read (a FIFO would block the read)");
    const int fl = ::fcntl(f.fd_, F_GETFL);  // reads of a regular file never block: the flag goes
    if (fl < 0 || ::fcntl(f.fd_, F_SETFL, fl & ~O_NONBLOCK) != 0) throw_io("cannot set flags of", shown, errno);
    return f;
  }
  static const char* file_type_name(mode_t m) noexcept {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
           : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : S_ISLNK(m) ? "a symbolic link" : "not a file";
  }
  static file_handle create(const std::string& path, const io_hook* hook = nullptr) {
    return file_handle(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, hook);
  }

  file_handle(const file_handle&) = delete;
  file_handle& operator=(const file_handle&) = delete;
  file_handle(file_handle&& o) noexcept
      : fd_(o.fd_), path_(std::move(o.path_)), hook_(o.hook_), written_(o.written_) {
    o.fd_ = -1;
  }
  file_handle& operator=(file_handle&& o) noexcept {
    if (this != &o) {
      close_quietly();
      fd_ = o.fd_;
      path_ = std::move(o.path_);
      hook_ = o.hook_;
      written_ = o.written_;
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
    if (const int err = injected_errno(hook_, {io_call::read, path_, offset, bytes}))
      throw_io("read failed on", path_, err);
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
  void write_all(const void* src, std::size_t bytes) {
    if (const int err = injected_errno(hook_, {io_call::write, path_, written_, bytes}))
      throw_io("write failed on", path_, err, "free space on the disk, or save to another directory");
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
  void write_at(std::uint64_t offset, const void* src, std::size_t bytes) {
    if (const int err = injected_errno(hook_, {io_call::write, path_, offset, bytes}))
      throw_io("write failed on", path_, err, "free space on the disk, or write to another directory");
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
    int err = injected_errno(hook_, {io_call::truncate, path_, bytes});
    if (!err && ::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) err = errno;
    if (err) throw_io("cannot size", path_, err, "free space on the disk, or write to another directory");
  }

  // Asks the kernel to start writing [offset, offset + bytes) to the device now, without
  // waiting for it (Linux sync_file_range; nothing elsewhere), so a later sync() waits for less
  // and the device works while the caller writes on. A hint: sync() reports any failure.
  void start_writeback(std::uint64_t offset, std::uint64_t bytes) noexcept {
#if defined(__linux__)
    (void)::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes), SYNC_FILE_RANGE_WRITE);
#else
    (void)offset, (void)bytes;
#endif
  }

  void sync() {
    int err = injected_errno(hook_, {io_call::sync, path_});
    if (!err && ::fsync(fd_) != 0) err = errno;
    if (err) throw_io("fsync failed on", path_, err, "free space on the disk, or check the device");
  }
  void close() {
    if (fd_ < 0) return;
    const int fd = fd_;
    fd_ = -1;
    int err = injected_errno(hook_, {io_call::close, path_});
    if (err) ::close(fd);
    else if (::close(fd) != 0) err = errno;
    if (err) throw_io("close failed on", path_, err);
  }

 private:
  void close_quietly() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
  std::string path_;
  const io_hook* hook_ = nullptr;
  std::uint64_t written_ = 0;
};

// Makes a rename or a new entry in `dir` durable.
inline void sync_directory(const std::string& dir, const io_hook* hook = nullptr) {
  file_handle d(dir, O_RDONLY | O_DIRECTORY, 0, hook);
  d.sync();
}

// rename(2): atomic replacement of `to` on POSIX file systems.
inline void rename_path(const std::string& from, const std::string& to, const io_hook* hook = nullptr) {
  int err = injected_errno(hook, {io_call::rename, from, 0, 0, &to});
  if (!err && ::rename(from.c_str(), to.c_str()) != 0) err = errno;
  if (err) throw_io("cannot rename '" + from + "' to", to, err);
}

// All of the open file f, refused before anything is allocated or read when it is larger
// than `limit`.
inline std::string read_whole(const file_handle& f, std::size_t limit) {
  const std::uint64_t n = f.size();
  if (n > limit)
    throw error(error_kind::io, "'" + f.path() + "' has " + std::to_string(n) + " bytes, more than the " +
                                    std::to_string(limit) + " a file of its kind may have",
                "the file is not what its name says; check the path");
  std::string s(static_cast<std::size_t>(n), '\0');
  if (n) f.read_at(0, s.data(), s.size());
  return s;
}

// A whole small file (manifests, pointers).
inline std::string read_small_file(const std::string& path, std::size_t limit = std::size_t{64} << 20,
                                   const io_hook* hook = nullptr) {
  return read_whole(file_handle::read_only(path, hook), limit);
}

// Writes `text` to path (fsynced). Not atomic by itself: write to a temporary name and rename.
inline void write_small_file(const std::string& path, const std::string& text, const io_hook* hook = nullptr) {
  file_handle f = file_handle::create(path, hook);
  if (!text.empty()) f.write_all(text.data(), text.size());
  f.sync();
  f.close();
}

// Creates `dir` (and its parents) or reports why not, naming it.
inline void make_directories(const std::string& dir, const io_hook* hook = nullptr) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    if (const int err = injected_errno(hook, {io_call::make_directory, dir}))
      throw error(error_kind::io, "cannot create directory '" + dir + "': " + std::strerror(err),
                  "choose a writable directory for checkpoints");
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw error(error_kind::io, "cannot create directory '" + dir + "': " + (ec ? ec.message() : "not a directory"),
                "choose a writable directory for checkpoints");
}

// Removes one file or empty directory; a missing one is not an error.
inline void remove_path(const std::string& path, const io_hook* hook = nullptr) {
  int err = injected_errno(hook, {io_call::remove, path});
  if (!err && ::remove(path.c_str()) != 0 && errno != ENOENT) err = errno;
  if (err) throw_io("cannot remove", path, err);
}

// Removes `path` and, for a directory, everything in it, one entry at a time (each a call the
// hook sees: a crash can stop it anywhere). A missing path is not an error.
inline void remove_tree(const std::string& path, const io_hook* hook = nullptr) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw_io("cannot remove", path, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    std::vector<std::string> names;
    if (DIR* d = ::opendir(path.c_str())) {
      while (const dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
      ::closedir(d);
    } else if (errno != ENOENT) {
      throw_io("cannot list", path, errno);
    }
    for (const auto& n : names) remove_tree(path + "/" + n, hook);
  }
  remove_path(path, hook);
}

}  // namespace zshard::checkpoint
