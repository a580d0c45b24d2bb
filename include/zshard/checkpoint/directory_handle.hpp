#pragma once
// A directory held open by descriptor, and its files opened relative to it (openat), so that
// what is read is what the directory holds when it is read, whatever is renamed around it.
// Names that come from files (a checkpoint's `latest`, its manifest, a safetensors index) must
// be plain names: one path component, neither "." nor ".." — a name can never lead out of the
// directory. Files are opened without blocking and must be regular files (file_handle::
// open_regular): a FIFO or a device in a file's place is refused at once, never waited on.
// Whether a symbolic link is followed is the caller's choice, per directory: never inside a
// checkpoint (zshard wrote every file there itself), always in a model directory (the Hugging
// Face cache keeps every file of a snapshot as a link into its blobs/).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <string_view>

#include "zshard/checkpoint/file_io.hpp"

namespace zshard::checkpoint {

// One path component: not empty, no '/', no NUL, not "." or "..".
inline bool is_plain_name(std::string_view s) noexcept {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string_view::npos &&
         s.find('\0') == std::string_view::npos;
}

class directory_handle {
 public:
  directory_handle() = default;

  // `path` as the caller names it: links in it are followed (the user chose the path).
  static directory_handle open(const std::string& path, bool follow_links_inside) {
    directory_handle d;
    d.path_ = path;
    d.follow_ = follow_links_inside;
    do d.fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    while (d.fd_ < 0 && errno == EINTR);
    if (d.fd_ < 0) throw_io("cannot open directory", path, errno, "name a directory that exists and can be read");
    return d;
  }

  // The directory `name` inside this one (a plain name), never through a symbolic link when
  // links inside are not followed.
  directory_handle subdirectory(const std::string& name) const {
    require_plain(name);
    directory_handle d;
    d.path_ = path_ + "/" + name;
    d.follow_ = follow_;
    do d.fd_ = ::openat(fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | (follow_ ? 0 : O_NOFOLLOW));
    while (d.fd_ < 0 && errno == EINTR);
    if (d.fd_ >= 0) return d;
    const int err = errno;
    struct stat st {};
    if (!follow_ && ::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
      throw error(error_kind::io, "'" + d.path_ + "' is a symbolic link, which is not followed",
                  "a checkpoint is read only from inside its directory: move the checkpoint there, or name its "
                  "directory directly");
    throw_io("cannot open directory", d.path_, err);
  }

  // The regular file `name` (a plain name) for reading, opened without blocking.
  file_handle open_file(const std::string& name, const io_hook* hook = nullptr) const {
    require_plain(name);
    return file_handle::open_regular(fd_, name, path_ + "/" + name, follow_, hook);
  }

  // The whole regular file `name`, refused (unread) when larger than `limit`.
  std::string read_small(const std::string& name, std::size_t limit, const io_hook* hook = nullptr) const {
    return read_whole(open_file(name, hook), limit);
  }

  // Whether an entry `name` exists here, of any type (a link is not followed to find out).
  bool holds(const std::string& name) const noexcept {
    struct stat st {};
    return is_plain_name(name) && ::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
  }

  const std::string& path() const noexcept { return path_; }
  int fd() const noexcept { return fd_; }

  directory_handle(const directory_handle&) = delete;
  directory_handle& operator=(const directory_handle&) = delete;
  directory_handle(directory_handle&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)), follow_(o.follow_) {
    o.fd_ = -1;
  }
  directory_handle& operator=(directory_handle&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = o.fd_;
      path_ = std::move(o.path_);
      follow_ = o.follow_;
      o.fd_ = -1;
    }
    return *this;
  }
  ~directory_handle() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  void require_plain(const std::string& name) const {
    if (!is_plain_name(name))
      throw error(error_kind::io,
                  "'" + name + "' (in '" + path_ +
                      "') is not a file name: a name read from a file must be one name "
                      "inside its directory (no '/', not '..')",
                  "the file that holds the name is damaged or was not written for this directory");
  }
  int fd_ = -1;
  std::string path_;
  bool follow_ = false;
};

}  // namespace zshard::checkpoint
