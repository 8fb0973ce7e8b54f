#pragma once
/// \file
/// JPEG encoding and decoding on libjpeg-turbo (its TurboJPEG API): 8-bit grey or RGB pixels,
/// interleaved (height x width x channels). The bytes decoded are untrusted: the header's size is
/// checked before anything is allocated, and a corrupt image is a cohort::error.

#include <turbojpeg.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cohort/error.hpp"

namespace cohort::data {

/// An image's size, as its JPEG header says.
struct image_size {
  int width = 0;
  int height = 0;
  int channels = 0;  ///< 1 (grey) or 3 (RGB), as decoded
};

namespace detail {
struct tj_free {
  void operator()(void* h) const { tjDestroy(static_cast<tjhandle>(h)); }
};
using tj_handle = std::unique_ptr<void, tj_free>;
/// This thread's decoder, made on first use (decoding runs on the loader's worker threads).
inline tjhandle tj_decoder() {
  thread_local tj_handle h(tjInitDecompress());
  return static_cast<tjhandle>(h.get());
}
inline tj_handle tj_encoder() { return tj_handle(tjInitCompress()); }
}  // namespace detail

/// The knobs of JPEG decoding.
struct jpeg_options {
  int channels = 3;                        ///< 1: grey, 3: RGB (converted from what the file holds)
  std::int64_t max_pixels = 1 << 26;       ///< larger images are refused (a corrupt or hostile header)
};

/// Reads a JPEG header. Throws cohort::error when `jpeg` is not a JPEG or the image is larger
/// than `options.max_pixels`.
inline image_size jpeg_header(std::span<std::byte const> jpeg, jpeg_options const& options = {}) {
  if (options.channels != 1 && options.channels != 3) throw cohort::error("jpeg_options.channels must be 1 or 3");
  tjhandle h = detail::tj_decoder();
  int w = 0, ht = 0, sub = 0, space = 0;
  if (!h || tjDecompressHeader3(h, reinterpret_cast<unsigned char const*>(jpeg.data()), static_cast<unsigned long>(jpeg.size()),
                                &w, &ht, &sub, &space) != 0)
    throw cohort::error(std::string("not a JPEG image (") + tjGetErrorStr2(h) + ")");
  if (w <= 0 || ht <= 0 || static_cast<std::int64_t>(w) * ht > options.max_pixels)
    throw cohort::error("JPEG of " + std::to_string(w) + "x" + std::to_string(ht) + " pixels is outside 1.." +
                        std::to_string(options.max_pixels) + " pixels: raise jpeg_options.max_pixels if it is real");
  return {w, ht, options.channels};
}

/// Decodes `jpeg` into `out`, which holds height x width x channels bytes of `size` (from
/// jpeg_header). Throws cohort::error on a corrupt image.
inline void decode_jpeg_into(std::span<std::byte const> jpeg, image_size size, std::uint8_t* out) {
  tjhandle h = detail::tj_decoder();
  int const format = size.channels == 1 ? TJPF_GRAY : TJPF_RGB;
  if (!h || tjDecompress2(h, reinterpret_cast<unsigned char const*>(jpeg.data()), static_cast<unsigned long>(jpeg.size()), out,
                          size.width, 0, size.height, format, TJFLAG_ACCURATEDCT) != 0)
    throw cohort::error(std::string("corrupt JPEG image (") + tjGetErrorStr2(h) + ")");
}

/// Encodes `pixels` (height x width x channels bytes, channels 1 or 3) as a JPEG of `quality`
/// (1-100; grey images without chroma subsampling, RGB at 4:2:0).
inline std::vector<std::byte> encode_jpeg(std::span<std::uint8_t const> pixels, image_size size, int quality = 95) {
  if ((size.channels != 1 && size.channels != 3) ||
      pixels.size() != static_cast<std::size_t>(size.width) * static_cast<std::size_t>(size.height) * static_cast<std::size_t>(size.channels))
    throw cohort::error("encode_jpeg: " + std::to_string(pixels.size()) + " bytes are not " + std::to_string(size.width) + "x" +
                        std::to_string(size.height) + "x" + std::to_string(size.channels) + " pixels of 1 or 3 channels");
  auto h = detail::tj_encoder();
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  int const format = size.channels == 1 ? TJPF_GRAY : TJPF_RGB;
  int const sub = size.channels == 1 ? TJSAMP_GRAY : TJSAMP_420;
  if (!h || tjCompress2(h.get(), pixels.data(), size.width, 0, size.height, format, &buf, &len, sub, quality, TJFLAG_ACCURATEDCT) != 0) {
    tjFree(buf);
    throw cohort::error(std::string("encode_jpeg: ") + tjGetErrorStr2(h.get()));
  }
  std::vector<std::byte> out(reinterpret_cast<std::byte*>(buf), reinterpret_cast<std::byte*>(buf) + len);
  tjFree(buf);
  return out;
}

}  // namespace cohort::data
