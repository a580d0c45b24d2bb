#pragma once
// One scratch file of the NVMe tier (offload/nvme_state.hpp): created in a directory under a
// name no other engine uses, given its final size at once (posix_fallocate: a full disk fails
// here, not half-way through a step), read and written at absolute offsets, removed when the
// object goes. Every failure is an error_kind::io that names the file, the offset and the byte
// count (a short transfer included), so "no space" or "I/O error" says where.
//
// Transfers bypass the page cache (O_DIRECT) where the filesystem allows it, so the optimizer's
// state streams at the drive's speed without evicting the training data's pages; buffers,
// offsets and sizes are then multiples of direct_alignment (the caller's chunks are). Where
// O_DIRECT is refused (tmpfs, some network filesystems) the file is opened for buffered I/O and
// direct() says so. Thread-safe: pread/pwrite at distinct offsets from several threads.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "zshard/core/error.hpp"
#include "zshard/core/memory_ledger.hpp"

namespace zshard::offload {

class nvme_file {
 public:
  static constexpr std::size_t direct_alignment = 4096;

  // A new file `<dir>/<stem>-<pid>-<n>.bin` of `bytes` bytes, allocated on the drive.
  nvme_file(const std::string& dir, const std::string& stem, std::uint64_t bytes) : bytes_(bytes) {
    static std::atomic<unsigned> sequence{0};
    for (;;) {
      path_ = dir + "/" + stem + "-" + std::to_string(::getpid()) + "-" + std::to_string(sequence++) + ".bin";
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
      if (fd_ < 0 && errno == EINVAL) {  // the filesystem refuses O_DIRECT: buffered I/O
        fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        direct_ = false;
      }
      if (fd_ >= 0 || errno != EEXIST) break;
    }
    if (fd_ < 0)
      throw error(error_kind::io, "cannot create NVMe state file '" + path_ + "': " + std::strerror(errno),
                  "offload_config.nvme_path must name an existing directory this process may write");
    if (const int e = ::posix_fallocate(fd_, 0, off_t(bytes)); e != 0) {
      const std::string why = std::strerror(e);
      close_and_remove();
      throw error(error_kind::io,
                  "cannot allocate " + std::to_string(bytes) + " bytes (" + format_bytes(double(bytes)) +
                      ") for NVMe state file '" + path_ + "' (offsets 0 to " + std::to_string(bytes) + "): " + why,
                  "free space on the drive of offload_config.nvme_path, or use a larger drive (zshard_plan "
                  "reports the bytes per rank)");
    }
  }
  nvme_file(const nvme_file&) = delete;
  nvme_file& operator=(const nvme_file&) = delete;
  ~nvme_file() { close_and_remove(); }

  const std::string& path() const noexcept { return path_; }
  std::uint64_t size() const noexcept { return bytes_; }
  bool direct() const noexcept { return direct_; }

  void read(void* dst, std::size_t bytes, std::uint64_t offset) const { transfer(false, dst, bytes, offset); }
  void write(const void* src, std::size_t bytes, std::uint64_t offset) const {
    transfer(true, const_cast<void*>(src), bytes, offset);
  }

 private:
  // Whole transfers: a short one is retried from where it stopped; no progress is an error.
  void transfer(bool writing, void* buf, std::size_t bytes, std::uint64_t offset) const {
    std::size_t done = 0;
    while (done < bytes) {
      char* at = static_cast<char*>(buf) + done;
      const ssize_t n = writing ? ::pwrite(fd_, at, bytes - done, off_t(offset + done))
                                : ::pread(fd_, at, bytes - done, off_t(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = n < 0 ? std::strerror(errno) : std::string(writing ? "no progress" : "end of file");
        throw error(error_kind::io,
                    std::string(writing ? "write" : "read") + " of " + std::to_string(bytes) + " bytes at offset " +
                        std::to_string(offset) + " of NVMe state file '" + path_ + "' failed after " +
                        std::to_string(done) + " bytes: " + why,
                    writing ? "the drive is full or failing; the optimizer state of the last completed step is intact"
                            : "the state file was changed or the drive is failing");
      }
      done += std::size_t(n);
    }
  }

  void close_and_remove() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!path_.empty()) ::unlink(path_.c_str());
  }

  std::string path_;
  std::uint64_t bytes_ = 0;
  int fd_ = -1;
  bool direct_ = true;
};

}  // namespace zshard::offload
