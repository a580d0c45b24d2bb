#pragma once
// The seam every file-system call of a checkpoint operation passes through (file_io.hpp): a
// hook, given in save_options / load_options / export_options, sees each call before it is
// made (which call, the file, and for reads and writes the offset and size) and may let it go
// ahead (return 0), make it fail as the system would (return an errno: ENOSPC is a full disk,
// EIO a failing one; the call then throws the error it would throw for that errno), sleep (a
// slow disk), change the file system under the call (a file truncated while it is read) or end
// the process (a crash at that call). Tests inject faults with it; production code leaves it
// empty. Calls that only look (existence checks, directory listings) do not pass through it.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace zshard::checkpoint {

enum class io_call : std::uint8_t {
  open,            // a file opened for reading
  create,          // a file created (or truncated) for writing, or opened to write into
  read,            // bytes read at an offset
  write,           // bytes written at an offset
  truncate,        // a file sized
  sync,            // fsync of a file or a directory
  close,           // a file written, closed (close reports delayed write errors)
  rename,          // rename(2); `path` is the source, `target` the destination
  remove,          // one file or empty directory removed
  make_directory,  // a directory created
};

constexpr const char* to_string(io_call c) noexcept {
  switch (c) {
    case io_call::open: return "open";
    case io_call::create: return "create";
    case io_call::read: return "read";
    case io_call::write: return "write";
    case io_call::truncate: return "truncate";
    case io_call::sync: return "sync";
    case io_call::close: return "close";
    case io_call::rename: return "rename";
    case io_call::remove: return "remove";
    case io_call::make_directory: return "make_directory";
  }
  return "?";
}

struct io_event {
  io_call call;
  const std::string& path;
  std::uint64_t offset = 0;  // read, write, truncate (the new size)
  std::size_t bytes = 0;     // read, write
  const std::string* target = nullptr;  // rename
};

// Returns 0 to let the call go ahead, or the errno it fails with.
using io_hook = std::function<int(const io_event&)>;

// The errno the hook injects into the call, or 0 (no hook: 0).
inline int injected_errno(const io_hook* hook, const io_event& e) {
  return hook && *hook ? (*hook)(e) : 0;
}

}  // namespace zshard::checkpoint
