#pragma once
/// \file
/// A file written through its descriptor: open(2), write(2), close(2), nothing buffered. The run
/// directory's files and the TensorBoard events file write whole lines or records at a time, so
/// a stream's buffer and locale only cost time (a trial's directory and three files: 24 µs
/// against 29 µs through std::ofstream; docs/benchmarks.md, tuner bookkeeping).

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

namespace cohort::detail {

/// An open file descriptor, closed when the object goes; moves, does not copy.
class posix_file {
 public:
  posix_file() = default;
  posix_file(posix_file&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  posix_file& operator=(posix_file&& other) noexcept {
    if (this != &other) {
      close();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  posix_file(posix_file const&) = delete;
  posix_file& operator=(posix_file const&) = delete;
  ~posix_file() { close(); }

  /// Opens `path` for writing with open(2)'s `flags` (O_WRONLY | O_CLOEXEC added), creating it
  /// with mode 0644 under O_CREAT. Not open afterwards when it failed: `ec` says why.
  static posix_file open(std::filesystem::path const& path, int flags, std::error_code& ec) {
    posix_file f;
    f.fd_ = ::open(path.c_str(), flags | O_WRONLY | O_CLOEXEC, 0644);
    ec = f.fd_ < 0 ? std::error_code(errno, std::generic_category()) : std::error_code{};
    return f;
  }
  /// Opens `path` to append to, creating it where it does not exist.
  static posix_file append_to(std::filesystem::path const& path, std::error_code& ec) {
    return open(path, O_CREAT | O_APPEND, ec);
  }
  /// Creates `path` empty, or empties it.
  static posix_file truncate(std::filesystem::path const& path, std::error_code& ec) {
    return open(path, O_CREAT | O_TRUNC, ec);
  }

  bool is_open() const { return fd_ >= 0; }

  /// Writes all of `bytes`, however many write(2) calls it takes (a short write, EINTR): empty
  /// on success, else why it stopped. Where a write fails part way, what was written stays.
  std::error_code write(std::string_view bytes) {
    if (fd_ < 0) return std::make_error_code(std::errc::bad_file_descriptor);
    while (!bytes.empty()) {
      auto const n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return {errno, std::generic_category()};
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
    return {};
  }

  /// Closes the file (nothing when it is not open).
  void close() {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

 private:
  int fd_ = -1;
};

}  // namespace cohort::detail
