#pragma once
// Writing a safetensors file front to back, tensor by tensor: the header first (every
// tensor's name, dtype and shape are known up front, so are its offsets), then each tensor's
// bytes in order, in as many pieces as the caller likes. Memory is the caller's chunk; the
// writer holds none. A running CRC32C covers the whole file. finish() checks that every
// tensor got exactly its bytes, fsyncs and closes; a writer destroyed before finish() leaves
// an incomplete file, which the caller (a save into a temporary directory) discards.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zshard/checkpoint/crc32c.hpp"
#include "zshard/checkpoint/file_io.hpp"
#include "zshard/checkpoint/safetensors_format.hpp"

namespace zshard::checkpoint {

struct written_file {
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
};

class safetensors_writer {
 public:
  safetensors_writer(const std::string& path, std::vector<planned_tensor> tensors,
                     const std::map<std::string, std::string>& metadata = {}, const io_hook* hook = nullptr)
      : tensors_(std::move(tensors)) {
    const std::string header = make_header(tensors_, metadata, &offsets_);
    file_ = file_handle::create(path, hook);
    put(header.data(), header.size());
  }

  // The next `bytes` bytes of the current tensor (tensors are written in the order planned).
  void write(const void* data, std::size_t bytes) {
    while (bytes > 0) {
      skip_finished_tensors();
      ZSHARD_REQUIRE(current_ < tensors_.size(), error_kind::usage,
                     "safetensors writer: more bytes than the planned tensors hold, in '" + file_.path() + "'");
      const std::uint64_t room = tensors_[current_].bytes() - in_tensor_;
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(room, bytes));
      put(data, n);
      data = static_cast<const char*>(data) + n;
      bytes -= n;
      in_tensor_ += n;
    }
  }
  // The tensor the next bytes go to (tests and error messages).
  const planned_tensor* current() {
    skip_finished_tensors();
    return current_ < tensors_.size() ? &tensors_[current_] : nullptr;
  }

  written_file finish() {
    skip_finished_tensors();
    ZSHARD_REQUIRE(current_ == tensors_.size(), error_kind::usage,
                   "safetensors writer: tensor '" + (current_ < tensors_.size() ? tensors_[current_].name : "") +
                       "' of '" + file_.path() + "' was not written completely");
    file_.sync();
    file_.close();
    return {file_.written(), crc_.value()};
  }

 private:
  void skip_finished_tensors() {
    while (current_ < tensors_.size() && in_tensor_ == tensors_[current_].bytes()) {
      ++current_;
      in_tensor_ = 0;
    }
  }
  void put(const void* data, std::size_t n) {
    if (n == 0) return;
    file_.write_all(data, n);
    crc_.update(data, n);
    // The device writes what is done while the rest is copied and checksummed, instead of all
    // of it in finish()'s fsync.
    if (file_.written() - handed_to_device_ >= writeback_step) {
      file_.start_writeback(handed_to_device_, file_.written() - handed_to_device_);
      handed_to_device_ = file_.written();
    }
  }

  static constexpr std::uint64_t writeback_step = std::uint64_t{8} << 20;
  std::vector<planned_tensor> tensors_;
  std::vector<std::uint64_t> offsets_;
  file_handle file_;
  crc32c crc_;
  std::size_t current_ = 0;
  std::uint64_t in_tensor_ = 0;
  std::uint64_t handed_to_device_ = 0;  // bytes start_writeback() was asked for so far
};

}  // namespace zshard::checkpoint
