#pragma once
/// \file
/// Images from a sample's bytes into tensors, for a shard dataset's transform: JPEG on
/// libjpeg-turbo (cohort/data/jpeg.hpp), decoded straight into the tensor's memory.

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "cohort/data/jpeg.hpp"

namespace cohort {

/// Decodes a JPEG into a uint8 tensor of channels x height x width (options.channels: 1 grey,
/// 3 RGB). Throws cohort::error on a corrupt image or one larger than options.max_pixels.
inline torch::Tensor decode_jpeg(std::span<std::byte const> jpeg, data::jpeg_options const& options = {}) {
  auto const size = data::jpeg_header(jpeg, options);
  auto hwc = torch::empty({size.height, size.width, size.channels}, torch::kUInt8);
  data::decode_jpeg_into(jpeg, size, hwc.data_ptr<std::uint8_t>());
  return hwc.permute({2, 0, 1});
}

}  // namespace cohort
