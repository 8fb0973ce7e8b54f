#pragma once
/// \file
/// Fixed-size binary records read through a memory map: a rank touches only the pages of the
/// records it reads (its shard), and nothing is copied until it does.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>

#include <range/v3/view/iota.hpp>
#include <range/v3/view/transform.hpp>

#include "cohort/error.hpp"

namespace cohort::data {

/// A read-only memory map of a file of `record_bytes`-byte records after a `header_bytes` header.
/// Move-only. Random-access: `file[i]` is record i's bytes; `records()` is a range-v3 view that
/// `cohort::views::shard` accepts.
class record_file {
 public:
  /// Maps `path`. Throws cohort::error naming the file when it is missing or unreadable, or when
  /// its size after the header is not a whole number of records (a truncated file).
  record_file(std::filesystem::path const& path, std::size_t record_bytes, std::size_t header_bytes = 0)
      : record_bytes_(record_bytes), header_bytes_(header_bytes) {
    if (record_bytes == 0) throw cohort::error("record_file " + path.string() + ": record_bytes must be positive");
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw cohort::error(path.string() + ": cannot open (" + std::strerror(errno) + "): check the path");
    struct stat st {};
    ::fstat(fd, &st);
    bytes_ = static_cast<std::size_t>(st.st_size);
    if (bytes_ < header_bytes || (bytes_ - header_bytes) % record_bytes != 0) {
      ::close(fd);
      throw cohort::error(path.string() + " at byte " + std::to_string(bytes_) + ": " + std::to_string(bytes_) +
                          " bytes is not a " + std::to_string(header_bytes) + "-byte header plus whole " +
                          std::to_string(record_bytes) + "-byte records: the file is truncated or the record size is wrong");
    }
    if (bytes_ > 0) {
      void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw cohort::error(path.string() + ": mmap failed (" + std::strerror(errno) + ")");
      }
      ::madvise(p, bytes_, MADV_RANDOM);  // no read-ahead into other ranks' records
      base_ = static_cast<std::byte const*>(p);
    }
    ::close(fd);
  }
  record_file(record_file&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), record_bytes_(o.record_bytes_),
        header_bytes_(o.header_bytes_) {}
  record_file& operator=(record_file&& o) noexcept {
    if (this != &o) {
      unmap();
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      record_bytes_ = o.record_bytes_;
      header_bytes_ = o.header_bytes_;
    }
    return *this;
  }
  record_file(record_file const&) = delete;
  record_file& operator=(record_file const&) = delete;
  ~record_file() { unmap(); }

  /// Number of records.
  std::size_t size() const { return bytes_ > header_bytes_ ? (bytes_ - header_bytes_) / record_bytes_ : 0; }
  /// Record i's bytes (precondition: i < size()).
  std::span<std::byte const> operator[](std::size_t i) const {
    return {base_ + header_bytes_ + i * record_bytes_, record_bytes_};
  }
  /// The header's bytes.
  std::span<std::byte const> header() const { return {base_, header_bytes_}; }
  /// All records as a random-access, sized view.
  auto records() const {
    return ranges::views::iota(std::size_t{0}, size()) | ranges::views::transform([this](std::size_t i) { return (*this)[i]; });
  }

 private:
  void unmap() noexcept {
    if (base_) ::munmap(const_cast<std::byte*>(base_), bytes_);
    base_ = nullptr;
  }
  std::byte const* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t record_bytes_ = 1;
  std::size_t header_bytes_ = 0;
};

}  // namespace cohort::data
